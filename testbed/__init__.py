"""The test bed: a real Kubernetes control plane on 127.0.0.1 with fake GPU nodes and one real node,
the real node's container images, the optional components built from Go modules, and the programs
that drive the operator on it (demo, bench, chaos, soak). See testbed/README.md.

Not the product: nothing here is installed with the operator or shipped in its image. The programs
run as modules from the repository (`python -m testbed.cluster` through hack/dev-cluster.sh,
`python -m testbed.images`, `python -m testbed.harness.bench`, ...).
"""
