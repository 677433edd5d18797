"""MultiKueue on the dev cluster: a second, independent control plane as Kueue's worker cluster.

Why: MultiKueue (Kueue's dispatch of a job from a manager cluster to worker clusters) is only proven
across two real control planes, each with its own Kueue. The testbed already runs any number of
independent control planes on one machine, each in a directory of its own (TJ_DEV_DIR); a worker
cluster is one more, in `<the manager's directory>/multikueue/<name>`, with its own etcd, API server,
kwok nodes and Kueue, on free ports of 127.0.0.1. What joins the two is what Kueue asks of a
platform team:

- the worker's kubeconfig in a Secret of Kueue's namespace on the manager (key `kubeconfig`). Kueue
  v0.17 accepts only embedded credentials (certificate-authority-data, client certificate data, no
  file paths) and a server address that is an IP or a DNS name: the worker's admin kubeconfig is
  both, and its server is the worker's API server on 127.0.0.1, which the manager's Kueue (a process
  on the same machine) reaches;
- Kueue's configuration naming the TrainingJob as an external framework of MultiKueue's generic
  adapter (`multiKueue.externalFrameworks`, kueue.py's configuration, on every Kueue here);
- the MultiKueueCluster, MultiKueueConfig, AdmissionCheck and queues, which are the platform team's
  objects: docs/shared-clusters.md has them as YAML, and the tests apply those blocks.

`down` of the manager takes its worker clusters down too (lifecycle.teardown), so that an interrupted
test run leaves no second control plane behind.

    python3 -m testbed.addons.multikueue up [--name worker1] [--nodes 2]   # beside the TJ_DEV_DIR cluster
    python3 -m testbed.addons.multikueue down [--name worker1]

`hack/dev-cluster.sh up --with multikueue` (Kueue comes with it) starts `worker1` the same way, like
any optional component (`add`; `remove multikueue` takes it off), and also creates its
MultiKueueCluster on the manager, so the manager's Kueue connects to it at once (`kubectl get
multikueueclusters`: Active). The MultiKueueConfig, AdmissionCheck and queues that use it stay the
platform team's (docs/shared-clusters.md's blocks).

Standard library only, like the rest of the control plane.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from testbed.addons import kueue
from testbed.cluster.handle import Cluster
from testbed.cluster.state import record_started, say, write_state
from testbed.common import ToolError

NAME: Final = "multikueue"
WORKER: Final = "worker1"
# The worker clusters' directories, under the manager's.
WORKERS_DIR: Final = "multikueue"
# Kueue's key of the kubeconfig in a MultiKueueCluster's Secret.
KUBECONFIG_KEY: Final = "kubeconfig"


def worker_dir(manager_dir: Path, name: str = WORKER) -> Path:
    return manager_dir / WORKERS_DIR / name


def worker_dirs(manager_dir: Path) -> list[Path]:
    """The worker clusters' directories that exist under the manager's."""
    root = manager_dir / WORKERS_DIR
    return sorted(path for path in root.iterdir() if path.is_dir()) if root.is_dir() else []


def secret_name(name: str = WORKER) -> str:
    """The Secret a MultiKueueCluster named `name` reads (docs/shared-clusters.md's name for it)."""
    return f"{name}-kubeconfig"


def kubeconfig_secret(kubeconfig: str, name: str = WORKER) -> dict[str, Any]:
    """The Secret in Kueue's namespace holding a worker cluster's kubeconfig, as Kueue reads it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret_name(name),
            "namespace": kueue.NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "dev-cluster"},
        },
        "type": "Opaque",
        "data": {KUBECONFIG_KEY: base64.b64encode(kubeconfig.encode()).decode()},
    }


def start_worker(manager: Cluster, name: str = WORKER, *, nodes: int = 2) -> Cluster:
    """The worker cluster `name` running with Kueue (started unless it runs), and its kubeconfig in the
    manager's Secret (written again on each call: a restarted worker has new certificates and ports).
    The manager must run Kueue (its namespace holds the Secret)."""
    worker = Cluster(worker_dir(manager.dev_dir, name))
    worker.up(kueue.NAME, nodes=nodes)
    secret = kubeconfig_secret(worker.kubeconfig.read_text(), name)
    manager.kubectl.apply(secret, "--server-side", "--force-conflicts")
    return worker


def stop_worker(manager: Cluster, name: str = WORKER) -> None:
    """Takes the worker cluster `name` down (a no-op when it does not run); its Secret stays."""
    Cluster(worker_dir(manager.dev_dir, name)).down()


@contextmanager
def worker_lost_timeout(manager: Cluster, seconds: int) -> Iterator[None]:
    """The manager's Kueue with MultiKueue's `workerLostTimeout` set to `seconds` in the block (Kueue's
    default, 15 minutes, is too long for a test): Kueue reads its Configuration only as it starts, so
    the file is changed and Kueue restarted, and after the block the same again without it. The
    manager's MultiKueueClusters reconnect after each restart."""
    path = manager.dev_dir / "run" / kueue.NAME / "configuration.json"
    original = path.read_text()
    settings = json.loads(original)
    settings.setdefault("multiKueue", {})["workerLostTimeout"] = f"{seconds}s"
    path.write_text(json.dumps(settings, indent=2))
    manager.restart(kueue.NAME)
    try:
        yield
    finally:
        path.write_text(original)
        manager.restart(kueue.NAME)


def multikueue_cluster(name: str = WORKER) -> dict[str, Any]:
    """The manager's MultiKueueCluster for the worker `name`, reading its Secret (`kubeconfig_secret`)."""
    return {
        "apiVersion": f"{kueue.GROUP}/v1beta2",
        "kind": "MultiKueueCluster",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "dev-cluster"}},
        "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": secret_name(name)}}},
    }


def add(state: dict[str, Any]) -> None:
    """`up --with multikueue`: the worker cluster `worker1` running with its Kueue, its kubeconfig in the
    manager's Secret and its MultiKueueCluster on the manager. The manager's Kueue must run (`--with`
    puts it first)."""
    if kueue.NAME not in state.get("processes", {}):
        raise ToolError(f"{NAME} needs Kueue on the manager: `hack/dev-cluster.sh up --with kueue,{NAME}`")
    manager = Cluster.default()
    worker = start_worker(manager)
    manager.kubectl.apply(multikueue_cluster(), "--server-side", "--force-conflicts")
    say(f"{NAME}: worker cluster {WORKER} runs with Kueue, KUBECONFIG={worker.kubeconfig}")
    say(f"{NAME}: MultiKueueCluster {WORKER} on the manager reads Secret {kueue.NAMESPACE}/{secret_name()}")
    if NAME not in state.get("optional", []):
        record_started(state, NAME, {})


def remove(state: dict[str, Any]) -> None:
    """`remove multikueue`: the worker cluster down, its MultiKueueCluster and Secret deleted, forgotten."""
    manager = Cluster.default()
    stop_worker(manager)
    for kind, name, namespace in (
        ("multikueuecluster", WORKER, ()),
        ("secret", secret_name(), ("-n", kueue.NAMESPACE)),
    ):
        manager.kubectl.run("delete", kind, name, *namespace, "--ignore-not-found", check=False)
    added = [name for name in state.get("optional", []) if name != NAME]
    state["optional"] = added
    write_state("optional", added)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m testbed.addons.multikueue", description=__doc__)
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("--name", default=WORKER, help="the worker cluster's name (its MultiKueueCluster's)")
    parser.add_argument("--nodes", type=int, default=2, help="the worker's kwok nodes")
    args = parser.parse_args(argv)
    manager = Cluster.default()
    try:
        if args.command == "up":
            if not manager.running():
                raise ToolError(f"no cluster runs in {manager.dev_dir}: hack/dev-cluster.sh up --with kueue")
            worker = start_worker(manager, args.name, nodes=args.nodes)
            print(f"worker cluster {args.name}: KUBECONFIG={worker.kubeconfig}")
            print(f"its kubeconfig is in Secret {kueue.NAMESPACE}/{secret_name(args.name)} on the manager")
        else:
            stop_worker(manager, args.name)
    except ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
