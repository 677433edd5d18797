"""What the container image's build runs besides pip: the runtime root's assembly (runtime_root.py).

Not installed with the package (setup.cfg's packages leave it out) and not shipped in the image: the
Dockerfile's build stage copies runtime_root.py and runs it as a script; tests import it from here.
"""
