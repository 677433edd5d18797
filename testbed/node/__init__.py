"""The local cluster's real node: a kubelet and containerd on this machine, in a network namespace.

Why a package of its own: it is the one part of the testbed that changes the machine (a network
namespace, cgroups, mounts, kernel tunables) and must put everything back. Its modules: `realnode`
(start-up and take-down), `nodeconfig` (addresses, paths, configuration files, command lines),
`nodehost` (what it changes on the machine and how that is undone), `apiforward` (the relay to the
API server inside its network namespace), `storage` (the local-path provisioner), `netpolicies` (the
NetworkPolicy enforcer on it) and `placement` (pods on it, for tests). Standard library only. See
README.md beside this file.
"""
