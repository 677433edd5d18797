"""A real Kubernetes control plane on 127.0.0.1, for development, tests and the demo.

Why: the operator's behaviour is a conversation with an API server (admission, schema and CEL
validation, resourceVersion conflicts, watch expiry, RBAC, garbage collection). Mocks would let tests
pass while the operator breaks, and these machines have no container engine. So this package runs the
real etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from Go modules by
hack/kube-bins.sh, with kwok playing the kubelets of fake GPU nodes.

Standard library only: it runs before any project dependency is installed. Its modules:
- state: where the cluster's state lives (.dev/, TJ_DEV_DIR) and what it says about each process;
- pki: the per-cluster CA, certificates and admin kubeconfig;
- processes: starting, awaiting and stopping processes; the built kubectl;
- components: each component's command line; nodes: the fake GPU nodes;
- lifecycle: up, down, restart, and stopping or starting one component on purpose;
- extras: dev processes registered with the cluster (`run`, `stop <name>`);
- kube_bins: hack/kube-bins.sh's Python side (the binaries, built on first use; background builds);
- podstatus and kwok: what a kubelet writes when a pod's containers end, for pods on kwok's nodes;
- kubectl and handle: the tests' kubectl, `wait_for`, and `Cluster`, a cluster by its directory;
- __main__: the command line (hack/dev-cluster.sh).

Components added on request (`up --with`) are testbed/addons' (Kueue, the coscheduling scheduler,
Volcano) and testbed/node's (the real node, its NetworkPolicy enforcer). See README.md beside this file.

`stop <component>` takes one component down on purpose (an API server outage for as long as a test
needs) and `start <component>` brings it back with the same flags and port. A component stopped on
purpose is not a crash: `status` still exits 0 and `up` leaves it stopped (another session's `up`
must not end a test's outage early) instead of rebuilding the whole cluster, unless the stop is older
than STOP_EXPIRY (whoever stopped it is gone): then `up` starts it again.

`run <name> -- <command...>` starts a long-lived development process that belongs with the cluster
(the demo's operator): recorded in state.json by pid and kernel start time, its
output in .dev/logs/<name>.log, stopped by `stop <name>` and, before the components, by `down`. A
second `run` of the same name and command while it runs is a no-op, so scripts can call it again.
"""
