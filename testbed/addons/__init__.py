"""The optional components of the local cluster, added with `up --with NAME` (also to a running one).

Why a package of their own: each is built only when asked for (hack/kube-bins.sh), and each brings its
own settings: `kueue` (Kueue's controller manager, its Configuration and webhooks), `coscheduling`
(the scheduler-plugins scheduler as a second scheduler); `optional` adds them (and the real node of
testbed/node, and its NetworkPolicy enforcer) to a cluster and waits until they serve. Standard
library only, like the control plane. See README.md beside this file.
"""
