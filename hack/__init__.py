"""Development tooling: the local control plane, the local kubelet, the demo and the benchmark.

A package only so tests can import the pieces they share with these scripts (hack.podstatus); every
module here is also run directly as a script (`python3 hack/<name>.py`).
"""
