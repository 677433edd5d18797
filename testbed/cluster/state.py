"""Where a dev cluster keeps its state, and what that state says about its processes.

Why: every command (`up`, `down`, `status`, `restart`, `run`, ...) is a separate process, so the
truth about a cluster is `.dev/run/state.json`: the API server's address, the ports, the binaries,
and each process by pid and kernel start time (a pid alone may be reused). Commands that change it
hold `.dev/cluster.lock`, so a second `up` waits for the first and then finds the cluster running.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from testbed.common import DEV, REPO, Say, still_running

RUN: Final = DEV / "run"
LOGS: Final = DEV / "logs"
STATE: Final = RUN / "state.json"
KUBECONFIG: Final = DEV / "kubeconfig"
KUBECTL_LINK: Final = DEV / "bin" / "kubectl"
# The kubectl plugin beside it (`kubectl trainingjob`), run from the repository's virtualenv.
PLUGIN: Final = DEV / "bin" / "kubectl-trainingjob"
LOCK: Final = DEV / "cluster.lock"

COMPONENTS: Final = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Components added on request (`up --with`, testbed/addons/optional.py); processes like the others.
OPTIONAL_COMPONENTS: Final = ("coscheduling", "kueue", "volcano")
# Their processes: one named after each, and Volcano's second, its queue controller (addons/volcano.py).
OPTIONAL_SIDE_PROCESSES: Final = {"volcano": ("volcano-controllers",)}
OPTIONAL_PROCESSES: Final = (*OPTIONAL_COMPONENTS, "volcano-controllers")
# The real node (`up --with real-node`, testbed/node/realnode.py): its processes are components too.
REAL_NODE: Final = "real-node"
NODE_COMPONENTS: Final = (
    "containerd",
    "node-api",
    "kubelet",
    "kube-proxy",
    "coredns",
    "local-path-provisioner",
)
# NetworkPolicies enforced on the real node (`up --with network-policies`, testbed/node/netpolicies.py):
# the API server's relay off the node, then the enforcer, processes like the node's.
NETWORK_POLICIES: Final = "network-policies"
NETWORK_POLICY_COMPONENTS: Final = ("api-endpoint", "network-policies")
# The image registry the real node pulls from (`up --with registry`, testbed/node/registry.py): one
# process, in the node's network namespace.
REGISTRY: Final = "registry"
# MLflow's tracking server (`up --with mlflow`, testbed/addons/mlflow.py): a Deployment on the real node.
MLFLOW: Final = "mlflow"
# MultiKueue's worker cluster (`up --with multikueue`, testbed/addons/multikueue.py): a second control
# plane with its own Kueue, connected to this cluster's Kueue.
MULTIKUEUE: Final = "multikueue"
# What `up --with` takes.
WITH_CHOICES: Final = (*OPTIONAL_COMPONENTS, REAL_NODE, NETWORK_POLICIES, REGISTRY, MLFLOW, MULTIKUEUE)
# A component stopped on purpose longer ago than this was forgotten (its test was killed): `up` starts it.
STOP_EXPIRY: Final = 300.0
# Names of dev processes (`run <name>`): lower-case letters, digits and dashes.
EXTRA_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")

say: Final = Say("dev-cluster")


def write_plugin() -> None:
    """Puts the kubectl plugin next to the cluster's kubectl, which `eval "$(hack/dev-cluster.sh env)"`
    puts on PATH, so `kubectl trainingjob ...` works as README says. It runs the console script of
    the repository's virtualenv (the Makefile's; `make demo` and `make venv` install it), or says
    how to get it; the virtualenv's bin/ itself is not put on PATH (its python would shadow the
    machine's)."""
    plugin = REPO / ".venv" / "bin" / "kubectl-trainingjob"
    PLUGIN.parent.mkdir(parents=True, exist_ok=True)
    PLUGIN.write_text(
        "#!/bin/sh\n"
        "# kubectl's `trainingjob` plugin from the repository's virtualenv (testbed/cluster/state.py).\n"
        f"plugin={shlex.quote(str(plugin))}\n"
        '[ -x "$plugin" ] || { echo "kubectl trainingjob: $plugin is missing: make demo-venv (or make venv)'
        ' installs it" >&2; exit 2; }\n'
        'exec "$plugin" "$@"\n'
    )
    PLUGIN.chmod(0o755)


def read_state() -> dict[str, Any] | None:
    try:
        data = json.loads(STATE.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_state(key: str, value: Any) -> None:
    """Replaces one top-level entry of state.json (`processes`, `extras`), keeping the rest."""
    state = read_state() or {}
    state[key] = value
    STATE.write_text(json.dumps(state, indent=2))


def record_started(state: dict[str, Any], name: str, versions: dict[str, str]) -> None:
    """Records an optional component as running (state.json's `optional`, which `status`, `down` and the
    next `up` go by) with the versions it was built at (`versions`)."""
    added = state.setdefault("optional", [])
    added.append(name)
    write_state("optional", added)
    state.setdefault("versions", {}).update(versions)
    write_state("versions", state["versions"])


def dead_components(state: dict[str, Any]) -> list[str]:
    """Components that should run but do not (crashed or killed); those stopped on purpose are not dead."""
    return [
        name
        for name, proc in state.get("processes", {}).items()
        if not proc.get("stopped") and not still_running(proc)
    ]


def stopped_components(state: dict[str, Any]) -> list[str]:
    """Components taken down with `stop`, waiting for `start`."""
    return [name for name, proc in state.get("processes", {}).items() if proc.get("stopped")]


def abandoned_components(state: dict[str, Any]) -> list[str]:
    """Components stopped on purpose more than STOP_EXPIRY seconds ago."""
    now = time.time()
    return [
        name
        for name, proc in state.get("processes", {}).items()
        if proc.get("stopped") and now - float(proc.get("stopped_at", 0.0)) > STOP_EXPIRY
    ]


@contextlib.contextmanager
def cluster_lock() -> Iterator[None]:
    """Serialises `up` and `down`: a second `up` waits for the first, then finds the cluster running."""
    DEV.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another dev-cluster command is running; waiting for it to finish")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def read_versions(bin_dir: Path) -> dict[str, str]:
    """The VERSIONS file hack/kube-bins.sh writes next to the binaries it built."""
    versions: dict[str, str] = {}
    for line in (bin_dir / "VERSIONS").read_text().splitlines():
        key, _, value = line.partition("=")
        versions[key] = value
    return versions
