"""What the chaos run does to the cluster and how it watches it: the jobs it creates, the faults it
injects the way the scheduler, a kubelet or a user would, a node's loss, and an observer that records
every job's status and every pod it sees.

The faults are API writes a real cluster makes: a pod's status as a kubelet reports it
(testbed/cluster/podstatus.py, as the tests send it), the DisruptionTarget condition the scheduler or
the eviction API adds before deleting, a delete (also with grace period 0).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, Final

from controller.planner.inplace import FALLBACK_REASON
from controller.resources import EVENTS, NODES, PODS, TRAININGJOBS
from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError, NotFound
from crd import contract
from testbed.cluster.nodes import KWOK_NODE_LABEL
from testbed.cluster.podstatus import disruption_condition, now_rfc3339, terminated_status_patch
from testbed.common import JsonDict, ToolError, wait_until
from testbed.harness.chaos.plan import Fault, FaultKind
from testbed.harness.chaos.supervisors import failed_report

NAMESPACE: Final = "chaos"
WHO: Final = "make chaos"


def job_manifest(name: str, *, strict: bool, in_place: bool = False) -> JsonDict:
    """Two CPU workers that restart fast: OnFailure retries every failure, backoff 1-2 s; a strict job
    fails at its first failure (backoffLimit 0); an in-place job restarts its processes in place (kwok
    runs nothing: the chaos run plays the supervisors, testbed/harness/chaos/supervisors.py)."""
    manifest: JsonDict = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": "chaos",
            "dataset": "synthetic",
            "numWorkers": 2,
            "gpusPerWorker": 0,
            "failurePolicy": {
                "restartPolicy": "OnFailure",
                "backoffLimit": 0 if strict else 100,
                "maxDisruptionRestarts": 100,
                "restartBackoff": {"initialDelaySeconds": 1, "maxDelaySeconds": 2},
            },
        },
    }
    if in_place:
        manifest["spec"]["failurePolicy"]["restartStrategy"] = "InPlace"
    return manifest


def rank(job: str, index: int) -> str:
    return f"{job}{contract.WORKER_INFIX}{index}"


class Faults:
    """Injects one planned fault into a running job."""

    def __init__(self, client: KubeClient, sleep: Callable[[float], None] = time.sleep) -> None:
        self._client = client
        self._sleep = sleep

    def inject(self, fault: Fault) -> None:
        job = fault.job
        match fault.kind:
            case FaultKind.FAIL:
                self._end(rank(job, 1), exit_code=1)
            case FaultKind.FAIL_IN_PLACE:  # the process exits, its supervisor (the container) runs on
                pod = self._client.get(PODS, NAMESPACE, rank(job, 1))
                self._client.patch(PODS, NAMESPACE, rank(job, 1), failed_report(pod))
            case FaultKind.PREEMPT:
                self._preempt(rank(job, 1))
            case FaultKind.EVICT_IN_PLACE:
                self._end(rank(job, 1), exit_code=137, disruption="TerminationByKubelet")
            case FaultKind.PREEMPT_PEER_FAILS:
                self._preempt(rank(job, 1))
                self._sleep(1.0)  # the other rank notices its peer is gone a second later
                with contextlib.suppress(NotFound):  # unless a leader restarted the gang first
                    self._end(rank(job, 0), exit_code=1, message="peer lost")
            case FaultKind.FORCE_DELETE:
                self._client.delete(PODS, NAMESPACE, rank(job, 1), grace_period_seconds=0)
            case FaultKind.DELETE_JOB:
                self._end(rank(job, 1), exit_code=1)

    def delete_job_once_restarting(self, job: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self._client.get(TRAININGJOBS, NAMESPACE, job)
            if (found.get("status") or {}).get("state") == "Restarting":
                self._client.delete(TRAININGJOBS, NAMESPACE, job)
                return
            self._sleep(0.2)
        raise ToolError(f"{job} did not start restarting within {timeout:.0f}s")

    def _end(self, pod: str, **how: Any) -> None:
        current = self._client.get(PODS, NAMESPACE, pod)
        patch = terminated_status_patch(current, who=WHO, **how)
        self._client.patch(PODS, NAMESPACE, pod, patch, patch_type="strategic", subresource="status")

    def _preempt(self, pod: str) -> None:
        condition = {"status": {"conditions": [disruption_condition("PreemptionByScheduler", who=WHO)]}}
        self._client.patch(PODS, NAMESPACE, pod, condition, patch_type="strategic", subresource="status")
        self._client.delete(PODS, NAMESPACE, pod)


def lose_node(client: KubeClient, node: str) -> None:
    """The node's kubelet dies: kwok stops managing it, its Ready condition turns Unknown, and it is
    cordoned (as the node lifecycle controller's taint would) so the restarted pods go elsewhere."""
    client.patch(
        NODES,
        None,
        node,
        {"metadata": {"labels": {KWOK_NODE_LABEL: "false"}}, "spec": {"unschedulable": True}},
    )
    now = now_rfc3339()
    ready = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    client.patch(
        NODES, None, node, {"status": {"conditions": [ready]}}, patch_type="strategic", subresource="status"
    )


def restore_node(client: KubeClient, node: str) -> None:
    client.patch(
        NODES,
        None,
        node,
        {"metadata": {"labels": {KWOK_NODE_LABEL: "true"}}, "spec": {"unschedulable": None}},
    )


class Observer:
    """Lists the jobs and pods every `interval` seconds on its own thread: each job's latest status and
    every restartCount seen, in order; every pod UID seen."""

    def __init__(self, client: KubeClient, interval: float = 1.0) -> None:
        self._client = client
        self._interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-observer", daemon=True)
        self.statuses: dict[str, JsonDict] = {}
        self.history: dict[str, list[int]] = {}
        self.pod_uids: set[str] = set()
        self.errors = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def look(self) -> None:
        jobs = self._client.list(TRAININGJOBS, NAMESPACE)["items"]
        pods = self._client.list(PODS, NAMESPACE)["items"]
        with self._lock:
            self.statuses = {job["metadata"]["name"]: job.get("status") or {} for job in jobs}
            for name, status in self.statuses.items():
                count = int(status.get("restartCount") or 0)
                seen = self.history.setdefault(name, [])
                if not seen or seen[-1] != count:
                    seen.append(count)
            self.pod_uids.update(pod["metadata"]["uid"] for pod in pods)

    def snapshot(self) -> dict[str, JsonDict]:
        with self._lock:
            return dict(self.statuses)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.look()
            except (KubeError, OSError):
                self.errors += 1  # the API server restarting: look again next time


def pods_of_namespace(client: KubeClient) -> list[JsonDict]:
    items: list[JsonDict] = client.list(PODS, NAMESPACE)["items"]
    return items


def pods_by_job(client: KubeClient, jobs: Collection[str]) -> dict[str, list[JsonDict]]:
    """The live pods of `jobs`, by job."""
    found: dict[str, list[JsonDict]] = {job: [] for job in jobs}
    for pod in pods_of_namespace(client):
        job = (pod["metadata"].get("labels") or {}).get(contract.JOB_NAME_LABEL)
        if job in found and not pod["metadata"].get("deletionTimestamp"):
            found[job].append(pod)
    return found


def rank_uids(client: KubeClient, jobs: Collection[str]) -> dict[str, dict[str, str]]:
    """Each job's live pods: name -> UID (the same after a restart that kept them)."""
    return {
        job: {pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods}
        for job, pods in pods_by_job(client, jobs).items()
    }


def fallback_messages(client: KubeClient, jobs: Collection[str]) -> dict[str, list[str]]:
    """The messages of the InPlaceRestartFallback Events of `jobs` (why the operator recreated)."""
    found: dict[str, list[str]] = {}
    for event in client.list(EVENTS, NAMESPACE)["items"]:
        job = (event.get("involvedObject") or {}).get("name")
        if isinstance(job, str) and job in jobs and event.get("reason") == FALLBACK_REASON:
            found.setdefault(job, []).append(str(event.get("message") or ""))
    return found


def node_with_most_pods(client: KubeClient) -> tuple[str, list[str]]:
    """The node running the most live pods of the chaos jobs, and those jobs."""
    by_node: dict[str, set[str]] = {}
    for pod in pods_of_namespace(client):
        node = (pod.get("spec") or {}).get("nodeName")
        job = (pod["metadata"].get("labels") or {}).get(contract.JOB_NAME_LABEL)
        if node and job and not pod["metadata"].get("deletionTimestamp"):
            by_node.setdefault(node, set()).add(job)
    if not by_node:
        raise ToolError("no pod of a chaos job runs on any node")
    node = max(sorted(by_node), key=lambda name: len(by_node[name]))
    return node, sorted(by_node[node])


def gone(client: KubeClient, job: str) -> bool:
    try:
        client.get(TRAININGJOBS, NAMESPACE, job)
    except NotFound:
        return True
    return False


def complete_and_delete(
    client: KubeClient, converged: list[str], live: list[str], *, timeout: float, say: Callable[[str], None]
) -> tuple[list[str], list[str]]:
    """The end of a run: both ranks of every `converged` job end 0 and the jobs complete; then every
    `live` job is deleted. Returns the pods of completed jobs still running or held by the tracking
    finalizer a minute later, and the pods left once the jobs were deleted (orphans)."""
    for job in converged:
        for index in (0, 1):
            name = rank(job, index)
            try:
                pod = client.get(PODS, NAMESPACE, name)
                patch = terminated_status_patch(pod, exit_code=0, who=WHO)
                client.patch(PODS, NAMESPACE, name, patch, patch_type="strategic", subresource="status")
            except KubeError as error:
                say(f"could not complete {job}: {error}")

    def completed() -> bool:
        states = {
            job["metadata"]["name"]: (job.get("status") or {}).get("state")
            for job in client.list(TRAININGJOBS, NAMESPACE)["items"]
        }
        return all(states.get(job) == "Completed" for job in converged)

    wait_until("every job Completed", completed, timeout=timeout, interval=0.5)

    def held_pods() -> list[str]:
        return [
            pod["metadata"]["name"]
            for pod in pods_of_namespace(client)
            if (pod["metadata"].get("labels") or {}).get(contract.JOB_NAME_LABEL) in converged
            and (pod["metadata"].get("finalizers") or pod.get("status", {}).get("phase") == "Running")
        ]

    with contextlib.suppress(ToolError):
        wait_until(
            "the completed jobs' pods to be released", lambda: not held_pods(), timeout=60, interval=0.5
        )
    held = held_pods()
    say("deleting every job")
    for job in live:
        client.delete(TRAININGJOBS, NAMESPACE, job)
    with contextlib.suppress(ToolError):
        wait_until("every pod to go", lambda: not pods_of_namespace(client), timeout=120, interval=0.5)
    return held, [pod["metadata"]["name"] for pod in pods_of_namespace(client)]
