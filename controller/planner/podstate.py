"""Reading a Pod dict the way the planner needs it: rank, phase, scheduling, how it ended, and why.

Pod status is spread over phase, conditions, container states and the node it runs on; the
planner asks a handful of precise questions of it ("is this rank scheduled?", "did it fail, and is
that the program's fault or the infrastructure's?"). Answering them here, once, keeps the decision
code readable and lets tests feed it pod dicts straight from the API.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from controller.runtime.clock import parse_time
from crd.contract import (
    ATTEMPT_LABEL,
    CONTAINER_NAME,
    NUM_WORKERS_ANNOTATION,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    RUN_ANNOTATION,
    ReplicaType,
)
from crd.replicas import Replicas

JsonDict = dict[str, Any]

# Pod condition reasons (set by the scheduler, the eviction API, the taint manager or the kubelet)
# that mean the infrastructure took the pod away, not that the training program failed.
DISRUPTION_CONDITION = "DisruptionTarget"
# A run annotation is a few dozen bytes; one far larger is not the supervisor's and is not parsed.
MAX_RUN_ANNOTATION = 1024


def _number(label: object) -> int | None:
    """A label's or annotation's whole number, None when absent or not a number."""
    try:
        return int(str(label)) if label is not None else None
    except ValueError:
        return None


def replica_index(pod: Mapping[str, Any]) -> int | None:
    return _number(pod.get("metadata", {}).get("labels", {}).get(REPLICA_INDEX_LABEL))


def replica_type(pod: Mapping[str, Any]) -> ReplicaType | None:
    """The pod's role (its label; a pod without one, made before roles existed, is a worker), None for
    a role the operator does not know."""
    label = pod.get("metadata", {}).get("labels", {}).get(REPLICA_TYPE_LABEL, ReplicaType.WORKER.value)
    return next((role for role in ReplicaType if role.value == label), None)


def slot(pod: Mapping[str, Any], replicas: Replicas) -> int | None:
    """The pod's slot in a job of these replicas (crd/replicas.py), None when the job has no such pod."""
    index, role = replica_index(pod), replica_type(pod)
    if index is None or role is None:
        return None
    return replicas.slot(role, index)


def attempt(pod: Mapping[str, Any]) -> int | None:
    """The gang attempt the pod's training process runs: the attempt it was created for (its label),
    or a later one its supervisor restarted it for in place (the run annotation, see `run`); None when
    neither is readable."""
    created = _number(pod.get("metadata", {}).get("labels", {}).get(ATTEMPT_LABEL))
    report = run(pod)
    if report is not None and (created is None or report.attempt > created):
        return report.attempt
    return created


@dataclass(frozen=True)
class Run:
    """What an in-place restart's supervisor last reported of its pod's training process (the run
    annotation): the attempt, Running or Exited, the exit code (with Exited) and when."""

    attempt: int
    state: str
    exit_code: int | None
    at: str


RUN_STATES = ("Running", "Exited")


def run(pod: Mapping[str, Any]) -> Run | None:
    """The pod's run annotation, None when absent or not one (a malformed report is as good as none:
    the in-place restart's deadlines then recreate the pod)."""
    text = pod.get("metadata", {}).get("annotations", {}).get(RUN_ANNOTATION)
    if not isinstance(text, str) or len(text) > MAX_RUN_ANNOTATION:
        return None
    try:
        report = json.loads(text)
    except ValueError:
        return None
    if not isinstance(report, dict):
        return None
    attempt, state, code = report.get("attempt"), report.get("state"), report.get("exitCode")
    if type(attempt) is not int or attempt < 0 or state not in RUN_STATES:
        return None
    if state == "Exited" and type(code) is not int:
        return None
    exit_code = code if state == "Exited" else None
    return Run(attempt, str(state), exit_code, str(report.get("at") or ""))


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


def deletion_start(pod: Mapping[str, Any]) -> datetime | None:
    """When the pod's deletion was asked for: its deletionTimestamp less its grace period (the API
    server keeps that difference when a later delete shortens the grace period)."""
    stamp = deletion_time(pod)
    if stamp is None:
        return None
    grace = pod.get("metadata", {}).get("deletionGracePeriodSeconds") or 0
    return stamp - timedelta(seconds=int(grace))


def failed_before_deletion(pod: Mapping[str, Any]) -> bool:
    """A pod being deleted whose trainer had failed before the deletion was asked for: its own failure,
    not the deletion's doing (a deleted pod's containers are killed, and may exit non-zero, after it).
    Times have whole seconds: a failure in the second of the deletion counts as the deletion's."""
    started = deletion_start(pod)
    if started is None or worker_phase(pod) != "Failed":
        return False
    ended = termination(pod)
    finished = finished_at(pod, ended.container) if ended is not None and ended.container else None
    return finished is not None and parse_time(finished) < started


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


def is_ready(pod: Mapping[str, Any]) -> bool:
    """The kubelet's Ready condition: every container runs and passes its readiness probe."""
    ready = condition(pod, "Ready")
    return ready is not None and ready.get("status") == "True"


def is_scheduled(pod: Mapping[str, Any]) -> bool:
    scheduled = condition(pod, "PodScheduled")
    return bool(node_name(pod)) or (scheduled is not None and scheduled.get("status") == "True")


# What scheduler-plugins' coscheduling says of the pods of a gang it gave up on as a whole (rejected
# while waiting on permit): true, but it hides the reason of the pod that did not fit.
OPTIMISTIC_REJECTION = "optimistic rejection in PostFilter"


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


def container_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The statuses of the pod's init containers (native sidecars among them), then its containers."""
    status = pod.get("status", {})
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def trainer_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The status of the operator's trainer container, None before the kubelet reported one."""
    for entry in pod.get("status", {}).get("containerStatuses") or []:
        if entry.get("name") == CONTAINER_NAME:
            return entry  # type: ignore[no-any-return]
    return None


def _terminated(entry: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A container's terminated state, or that of its last run when it was started again."""
    if entry is None:
        return None
    terminated = (entry.get("state") or {}).get("terminated")
    if terminated is None:
        terminated = (entry.get("lastState") or {}).get("terminated")
    return terminated


def worker_phase(pod: Mapping[str, Any]) -> str:
    """The worker's phase as the job counts it: the trainer container's end decides, not the pod's.

    A classic sidecar that never exits keeps its pod Running after the trainer is done, and one that
    fails makes the pod Failed though the trainer succeeded; neither says anything about training. So
    once the trainer has terminated, exit code 0 is Succeeded and anything else Failed. Before that (or
    when it never ran: an init container failed, the pod was evicted) it is the pod's phase.
    """
    ended = ((trainer_status(pod) or {}).get("state") or {}).get("terminated")
    if ended is not None:
        return "Succeeded" if ended.get("exitCode") == 0 else "Failed"
    return phase(pod)


def holds_node(pod: Mapping[str, Any]) -> bool:
    """Whether the pod holds a node's resources until it is stopped, or may get them: Pending, Running or
    Unknown, but not a Pending or Running pod all of whose containers (native sidecars included) have
    terminated. The kubelet reports each container's end at once and the pod's terminal phase only
    after it has torn the pod down, keeping the phase it reported last until then (kubelet status
    manager, mergePodStatus): Running, or Pending for a pod that ran and ended between two status
    updates (a trainer of a second, on a busy node). Such a pod frees its node by itself (pods of a
    job never restart a container). A pod whose trainer is done but whose sidecar still runs does
    hold its node; so does an Unknown one, whose node has not said what it runs."""
    if phase(pod) not in ("Pending", "Running", "Unknown"):
        return False
    status = pod.get("status") or {}
    containers = [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]
    ended = bool(status.get("containerStatuses")) and all(
        "terminated" in (entry.get("state") or {}) for entry in containers
    )
    return not (phase(pod) in ("Pending", "Running") and ended)


# Waiting reasons of a container that is on its way: anything else (ErrImagePull, ImagePullBackOff,
# CreateContainerConfigError, InvalidImageName, CrashLoopBackOff, ...) is a problem someone must fix.
STARTING_REASONS = ("ContainerCreating", "PodInitializing")


@dataclass(frozen=True)
class Waiting:
    """A container that cannot start, and the kubelet's reason."""

    container: str
    reason: str
    message: str


def waiting_problem(pod: Mapping[str, Any]) -> Waiting | None:
    """Why the pod's containers do not start, when the kubelet says it is a problem (a missing image
    pull secret, a ConfigMap key that does not exist): the trainer's waiting state first, then an init
    container's or a sidecar's. None while they are merely being created."""
    trainer = trainer_status(pod)
    ordered = [trainer] if trainer is not None else []
    ordered += [entry for entry in container_statuses(pod) if entry is not trainer]
    for entry in ordered:
        waiting = (entry.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason and reason not in STARTING_REASONS:
            return Waiting(str(entry.get("name", "")), str(reason), str(waiting.get("message") or ""))
    return None


@dataclass(frozen=True)
class Termination:
    """How a worker ended: its trainer container, or what kept the trainer from running."""

    container: str
    exit_code: int | None
    reason: str
    message: str


def _termination(name: str, state: Mapping[str, Any]) -> Termination:
    code = state.get("exitCode")
    return Termination(
        container=name,
        exit_code=int(code) if code is not None else None,
        reason=str(state.get("reason") or ("Completed" if code == 0 else "Error")),
        message=str(state.get("message") or ""),
    )


def termination(pod: Mapping[str, Any]) -> Termination | None:
    """The trainer container's terminated state. When the trainer has not ended: the first init
    container or sidecar that failed (the trainer never ran, or the pod was taken away), else the pod's
    own reason when it failed; None while nothing ended."""
    trainer = _terminated(trainer_status(pod))
    if trainer is not None:
        return _termination(CONTAINER_NAME, trainer)
    for entry in container_statuses(pod):
        ended = _terminated(entry)
        if ended is not None and ended.get("exitCode", 0) != 0:
            return _termination(str(entry.get("name", "")), ended)
    if phase(pod) == "Failed":
        status = pod.get("status", {})
        return Termination("", None, str(status.get("reason") or "Failed"), str(status.get("message") or ""))
    return None


def finished_at(pod: Mapping[str, Any], container: str) -> str | None:
    """When `container` of the pod last terminated (RFC 3339), if it did."""
    for entry in container_statuses(pod):
        if entry.get("name") == container:
            ended = _terminated(entry) or {}
            return str(ended["finishedAt"]) if ended.get("finishedAt") else None
    return None


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
    first reconciles of newer jobs: the pod ended, started terminating, its supervisor reported its
    process started or ended (the run annotation), or started running as the last
    of the pods the cache holds for its job (`siblings`, `new` among them). A pod being bound or one
    of several starting only changes counters, which the job's next reconcile picks up anyway."""
    if is_terminating(new) and not is_terminating(old):
        return True
    if run(new) != run(old):
        return True  # an in-place restart's supervisor reported its process (planner/inplace.py)
    before, after = phase(old), phase(new)
    if before == after:
        return False
    if after in ("Succeeded", "Failed"):
        return True
    return after == "Running" and all(phase(pod) in ("Running", "Succeeded") for pod in siblings)
