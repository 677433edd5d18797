"""Development tooling: the local control plane and its real node, the Go-built binaries, the node's
images, the demo and the benchmark (see hack/README.md).

A package so its programs share hack/common.py and tests import the pieces they check. The programs
run as modules from the repository: `python -m hack.devcluster` (through hack/dev-cluster.sh),
`python -m hack.images`, `python -m hack.demo`, `python -m hack.bench`.
"""
