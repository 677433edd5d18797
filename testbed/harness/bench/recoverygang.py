"""The recovery bench's gang part: what restarting gangs of hundreds of pods costs the operator, on kwok.

Why apart from the node part (testbed/harness/bench/recovery.py): no container runs here; kwok's nodes
take any number of pods, so the question is the operator's own: its wall time from the failure to
every pod running again, its CPU seconds and its API requests by method. A gang has at most 100
workers (crd/contract.py MAX_WORKERS), so N pods are N / --gang gangs, one rank of each failing at
the same moment, as one bad switch would fail them. With `--restart-strategy InPlace` the gangs keep
their pods: the bench answers the operator's orders for every pod as its supervisor would
(testbed/harness/bench/supervisors.py), a rank's failure is its supervisor's Exited report, and a pod
runs again when it reports the next attempt Running.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from controller.resources import PODS, TRAININGJOBS
from controller.runtime.client import KubeClient
from crd import contract
from testbed.cluster.podstatus import terminated_status_patch
from testbed.common import JsonDict, ToolError
from testbed.harness.base import HarnessCluster, create_namespace
from testbed.harness.bench.operator import Metrics, Operator
from testbed.harness.bench.podtimeline import Identity, PodTimeline, RankRun
from testbed.harness.bench.supervisors import SupervisorPlayer

PODS_PER_NODE: Final = 100  # of the 110 a kwok node allows, as `make bench` packs them
WRITES: Final = ("POST", "PATCH", "DELETE")  # PUT is the leader's Lease renewal alone
RECREATE: Final = "Recreate"
IN_PLACE: Final = "InPlace"
RESTART_STRATEGIES: Final = (RECREATE, IN_PLACE)


def load_average() -> list[float]:
    """The machine's load averages (1, 5, 15 minutes): the figures are the machine's as much as ours."""
    return [round(value, 2) for value in os.getloadavg()]


def gang_sizes(pods: int, gang: int) -> list[int]:
    """`pods` split into gangs of `gang` workers, the last one smaller when it does not divide."""
    sizes = [gang] * (pods // gang)
    if pods % gang:
        sizes.append(pods % gang)
    return sizes


def gang_job(namespace: str, name: str, workers: int, strategy: str = RECREATE) -> JsonDict:
    policy: JsonDict = {"restartBackoff": {"initialDelaySeconds": 0, "maxDelaySeconds": 0}}
    spec: JsonDict = {"model": "bench", "dataset": "synthetic", "numWorkers": workers, "gpusPerWorker": 0}
    if strategy != RECREATE:
        policy["restartStrategy"] = strategy
    spec["failurePolicy"] = policy
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def running_pods(runs: Mapping[str, RankRun]) -> int:
    return sum(1 for run in runs.values() if run.phase == "Running" and not run.deleting)


def restarted(runs: Mapping[str, RankRun], pods: int, before: Mapping[str, Identity]) -> bool:
    """Every pod of every gang runs, each one a run that started after the failures."""
    fresh = [run for run in runs.values() if run.phase == "Running" and not run.deleting]
    return len(fresh) == pods and all(run.identity != before.get(run.name) for run in fresh)


def gang_restarts(  # noqa: PLR0917
    dev_dir: Path,
    sizes: Sequence[int],
    gang: int,
    timeout: float,
    say: Callable[[str], None],
    strategy: str = RECREATE,
) -> JsonDict:
    """Each size in turn on one kwok cluster (nodes for the largest), with one operator process."""
    harness = HarnessCluster("recovery-gang", dev_dir, say)
    operator: Operator | None = None
    try:
        client = harness.start(None, nodes=1 + math.ceil(max(sizes) / PODS_PER_NODE))
        logs = dev_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        operator = Operator(harness.kubeconfig, logs / "operator-gang.log", ())
        operator.start()
        started = operator
        deadline = time.monotonic() + 120
        while not started.ready():
            started.check_alive()
            if time.monotonic() > deadline:
                raise ToolError("the operator did not lead within 120s")
            time.sleep(0.2)
        return {str(size): one_size(client, started, size, gang, timeout, say, strategy) for size in sizes}
    finally:
        if operator is not None:
            operator.stop()
        harness.stop()


def quiet(
    operator: Operator, client: KubeClient, namespace: str, names: Sequence[str], restarts: int
) -> int | None:
    """The restarts counted in all jobs, when the operator's queue is empty and every job is Running
    with at least `restarts` restarts counted; None while not."""
    if operator.metrics("workqueue_depth").queue_depth:
        return None
    counted = 0
    for name in names:
        status = client.get(TRAININGJOBS, namespace, name).get("status") or {}
        count = int(status.get("restartCount") or 0)
        if status.get("state") != "Running" or count < restarts:
            return None
        counted += count
    return counted


def settle(  # noqa: PLR0917
    operator: Operator,
    client: KubeClient,
    namespace: str,
    names: Sequence[str],
    restarts: int,
    timeout: float,
) -> int:
    """Quiet twice, a second apart, with the same restarts counted (a reconcile in flight is not in
    the queue's depth); returns the restarts counted in all jobs."""
    deadline = time.monotonic() + timeout
    seen: list[int | None] = [None]
    while seen[-1] is None or seen[-1] != seen[-2]:
        operator.check_alive()
        if time.monotonic() > deadline:
            raise ToolError(
                f"{namespace}: the operator not quiet with {restarts} restart(s) after {timeout:.0f}s"
            )
        time.sleep(1.0)
        seen.append(quiet(operator, client, namespace, names, restarts))
    counted = seen[-1]
    assert counted is not None
    return counted


def one_size(  # noqa: PLR0917
    client: KubeClient,
    operator: Operator,
    pods: int,
    gang: int,
    timeout: float,
    say: Callable[[str], None],
    strategy: str = RECREATE,
) -> JsonDict:
    namespace = f"gang-{pods}"
    create_namespace(client, namespace)
    sizes = gang_sizes(pods, gang)
    names = [f"gang-{index}" for index in range(len(sizes))]
    timeline = PodTimeline(client, namespace)
    timeline.start()
    player = SupervisorPlayer(client, namespace, dict(zip(names, sizes, strict=True)))
    if strategy == IN_PLACE:
        player.start()

    def guard() -> None:
        operator.check_alive()
        player.check()

    try:
        for name, workers in zip(names, sizes, strict=True):
            client.create(TRAININGJOBS, namespace, gang_job(namespace, name, workers, strategy))
        say(f"{pods} pods in {len(sizes)} gangs ({strategy}): waiting until they run")
        timeline.wait(f"{pods} pods running", lambda runs: running_pods(runs) == pods, timeout, guard)
        if strategy == IN_PLACE:
            player.all_running()  # each supervisor reports its first process running
        counted_before = settle(operator, client, namespace, names, 0, timeout)
        before = {name: run.identity for name, run in timeline.runs().items()}
        start = operator.metrics()
        load = load_average()
        failed = time.monotonic()
        for name in names:
            if strategy == IN_PLACE:
                player.fail(f"{name}-worker-0")
            else:
                fail_rank(client, namespace, f"{name}-worker-0")
        done = timeline.wait(
            f"{pods} pods running again", lambda runs: restarted(runs, pods, before), timeout, guard
        )
        counted = settle(operator, client, namespace, names, 1, timeout)
        end = operator.metrics()
        result = cost(start, end, pods, len(sizes), done - failed)
        # One per gang; more when a gang restarted again before it ran (docs/bench.md, "Recovery").
        result["restarts_counted"] = counted - counted_before
        result["restart_strategy"] = strategy
        result["restart_kinds"] = restart_kinds(client, namespace, names)
        result["load_average_at_failure"] = load
        say(
            f"{pods} pods: running again after {result['seconds_to_every_pod_running']}s, "
            f"{result['writes']} writes"
        )
        for name in names:
            client.delete(TRAININGJOBS, namespace, name)
        timeline.wait(f"{namespace}'s pods gone", lambda runs: not runs, timeout, operator.check_alive)
        return result
    finally:
        player.stop()
        timeline.stop()


def restart_kinds(client: KubeClient, namespace: str, names: Sequence[str]) -> dict[str, int]:
    """How the jobs' last restarts went (status.lastRestartKind: InPlace or Recreate), by kind."""
    kinds: dict[str, int] = {}
    for name in names:
        status = client.get(TRAININGJOBS, namespace, name).get("status") or {}
        kind = str(status.get("lastRestartKind") or "unknown")
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def fail_rank(client: KubeClient, namespace: str, name: str) -> None:
    """Exit 1 of the pod's containers, as its kubelet would report it (testbed/cluster/podstatus.py)."""
    pod = client.get(PODS, namespace, name)
    patch = terminated_status_patch(pod, exit_code=1, message="the bench failed this rank", who="the bench")
    client.patch(PODS, namespace, name, patch, patch_type="strategic", subresource="status")


def cost(start: Metrics, end: Metrics, pods: int, gangs: int, seconds: float) -> JsonDict:
    requests = end.minus(start)
    writes = sum(requests.get(method, 0) for method in WRITES)
    cpu = None
    if start.cpu_seconds is not None and end.cpu_seconds is not None:
        cpu = round(end.cpu_seconds - start.cpu_seconds, 2)
    return {
        "pods": pods,
        "gangs": gangs,
        "seconds_to_every_pod_running": round(seconds, 2),
        "operator_cpu_seconds": cpu,
        "requests": {method: count for method, count in requests.items() if count},
        "writes": writes,
        "writes_per_pod": round(writes / pods, 2),
    }
