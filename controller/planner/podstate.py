"""Reading a Pod dict the way the planner needs it: rank, phase, scheduling, how it ended, and why.

Pod status is spread over phase, conditions, container states and the node it runs on; the
planner asks a handful of precise questions of it ("is this rank scheduled?", "did it fail, and is
that the program's fault or the infrastructure's?"). Answering them here, once, keeps the decision
code readable and lets tests feed it pod dicts straight from the API.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.runtime.clock import parse_time
from crd.contract import NUM_WORKERS_ANNOTATION, REPLICA_INDEX_LABEL

JsonDict = dict[str, Any]

# Pod condition reasons (set by the scheduler, the eviction API, the taint manager or the kubelet)
# that mean the infrastructure took the pod away, not that the training program failed.
DISRUPTION_CONDITION = "DisruptionTarget"


def _number(label: object) -> int | None:
    """A label's or annotation's whole number, None when absent or not a number."""
    try:
        return int(str(label)) if label is not None else None
    except ValueError:
        return None


def replica_index(pod: Mapping[str, Any]) -> int | None:
    return _number(pod.get("metadata", {}).get("labels", {}).get(REPLICA_INDEX_LABEL))


def built_for_another_size(pod: Mapping[str, Any], num_workers: int) -> bool:
    """Whether the pod records (in its annotation) a numWorkers other than `num_workers`; an unreadable
    record counts as another size, a pod without one (not built by the operator) as this size."""
    recorded = pod.get("metadata", {}).get("annotations", {}).get(NUM_WORKERS_ANNOTATION)
    return recorded is not None and _number(recorded) != num_workers


def phase(pod: Mapping[str, Any]) -> str:
    return str(pod.get("status", {}).get("phase") or "Pending")


def is_terminating(pod: Mapping[str, Any]) -> bool:
    return bool(pod.get("metadata", {}).get("deletionTimestamp"))


def deletion_time(pod: Mapping[str, Any]) -> datetime | None:
    stamp = pod.get("metadata", {}).get("deletionTimestamp")
    return parse_time(stamp) if stamp else None


def creation_time(pod: Mapping[str, Any]) -> datetime | None:
    stamp = pod.get("metadata", {}).get("creationTimestamp")
    return parse_time(stamp) if stamp else None


def node_name(pod: Mapping[str, Any]) -> str | None:
    name = pod.get("spec", {}).get("nodeName")
    return str(name) if name else None


def condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for entry in pod.get("status", {}).get("conditions") or []:
        if entry.get("type") == type_:
            return entry  # type: ignore[no-any-return]
    return None


def is_scheduled(pod: Mapping[str, Any]) -> bool:
    scheduled = condition(pod, "PodScheduled")
    return bool(node_name(pod)) or (scheduled is not None and scheduled.get("status") == "True")


def unschedulable_message(pod: Mapping[str, Any]) -> str | None:
    """The scheduler's explanation when it could not place the pod, e.g. "0/4 nodes are available: ..."."""
    scheduled = condition(pod, "PodScheduled")
    if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return str(scheduled.get("message") or "unschedulable")
    return None


def disruption_reason(pod: Mapping[str, Any]) -> str | None:
    disrupted = condition(pod, DISRUPTION_CONDITION)
    if disrupted and disrupted.get("status") == "True":
        return str(disrupted.get("reason") or DISRUPTION_CONDITION)
    if pod.get("status", {}).get("reason") in ("Evicted", "Preempting", "Terminated", "NodeLost", "Shutdown"):
        return str(pod["status"]["reason"])
    return None


@dataclass(frozen=True)
class Termination:
    """How the first failed container of a pod ended."""

    container: str
    exit_code: int | None
    reason: str
    message: str


def termination(pod: Mapping[str, Any]) -> Termination | None:
    """The terminated state of the pod's first failed container (else of its first terminated one)."""
    status = pod.get("status", {})
    ended = []
    for entry in status.get("containerStatuses") or []:
        terminated = (entry.get("state") or {}).get("terminated")
        if terminated is None:
            terminated = (entry.get("lastState") or {}).get("terminated")
        if terminated is not None:
            ended.append((entry.get("name", ""), terminated))
    if not ended:
        if phase(pod) == "Failed":
            return Termination(
                "", None, str(status.get("reason") or "Failed"), str(status.get("message") or "")
            )
        return None
    failed = [item for item in ended if item[1].get("exitCode", 0) != 0]
    name, state = (failed or ended)[0]
    code = state.get("exitCode")
    return Termination(
        container=str(name),
        exit_code=int(code) if code is not None else None,
        reason=str(state.get("reason") or ("Completed" if code == 0 else "Error")),
        message=str(state.get("message") or ""),
    )


def node_lost_in(
    node: Mapping[str, Any] | None, now: datetime | None = None, grace: float = 0.0
) -> float | None:
    """Seconds until the node counts as lost: None while it is Ready, 0 once lost.

    A node that no longer exists, or has no Ready condition, is lost at once. One whose Ready condition
    is not True is lost `grace` seconds after that condition changed (a control-plane blip that marks
    every node NotReady for a few seconds must not restart every job).
    """
    if node is None:
        return 0.0
    for entry in node.get("status", {}).get("conditions") or []:
        if entry.get("type") != "Ready":
            continue
        if entry.get("status") == "True":
            return None
        since = entry.get("lastTransitionTime")
        if now is None or grace <= 0 or not since:
            return 0.0
        return max(0.0, grace - (now - parse_time(str(since))).total_seconds())
    return 0.0


def node_is_lost(node: Mapping[str, Any] | None, now: datetime | None = None, grace: float = 0.0) -> bool:
    """A lost node cannot run or stop pods (see node_lost_in for when it counts as lost)."""
    return node_lost_in(node, now, grace) == 0.0


def changes_the_gang(old: Mapping[str, Any], new: Mapping[str, Any], siblings: list[JsonDict]) -> bool:
    """Whether a pod update may move its job to another state, so the job should not wait behind the
    first reconciles of newer jobs: the pod ended, started terminating, or started running as the last
    of the pods the cache holds for its job (`siblings`, `new` among them). A pod being bound or one
    of several starting only changes counters, which the job's next reconcile picks up anyway."""
    if is_terminating(new) and not is_terminating(old):
        return True
    before, after = phase(old), phase(new)
    if before == after:
        return False
    if after in ("Succeeded", "Failed"):
        return True
    return after == "Running" and all(phase(pod) in ("Running", "Succeeded") for pod in siblings)
