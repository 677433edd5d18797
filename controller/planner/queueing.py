"""Queueing with Kueue: a job labelled kueue.x-k8s.io/queue-name runs only while Kueue admits it.

The decisions a queued job meets before anything else about its gang (decide.py asks
`queue_decision` right after suspension):

    (new) --Accept--> Pending --Enqueue--> Queued --Admit--> Pending --> ... --> Running
                                             ^                                    |
                                             +------------Evict-------------------+
    Queued --Dequeue (the label is removed)--> Pending

`Enqueue`: the job waits for admission, and `Admitted` (False) says which queue and why: Kueue's own
words (waiting for quota, a LocalQueue that does not exist, admission checks), or the operator's
(Kueue is not installed, a priority class does not exist, the Workload was deleted). `Admit`: Kueue
admitted the Workload; the job starts, or, if it ran before, starts a new attempt from its latest
checkpoint. `Evict`: the admission is gone while the job held it (Kueue preempted or deactivated the
Workload, the Workload was deleted, numWorkers changed what it asks for): the pods are deleted and
the job waits again. None of these is a restart: restartCount and backoffLimit are untouched, and
the deadline clock stands still while the job waits.

The Workload itself is created, changed, released and marked finished by workloads.py, once per
plan, from the status these decisions leave.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from builders.workload import workload_name
from controller.planner import conditions as cond
from controller.planner import podstate
from controller.planner.facts import Facts
from controller.planner.gang import Gang
from controller.planner.kueue import (
    WorkloadView,
    asks_for_other_pods,
    current_workload,
    placement,
    workload_priority,
)
from crd import contract
from crd.contract import Condition
from crd.spec import TrainingJob

JsonDict = dict[str, Any]

# Reasons of Admitted=False that mean something is wrong (a Warning Event), not just a wait.
WARNING_REASONS: Final = frozenset(
    {
        "KueueNotInstalled",
        "PriorityClassNotFound",
        "WorkloadDeleted",
        "Inadmissible",
        "Deactivated",
        "WorkloadFinished",
        "FlavorNotFound",
        "TopologyLevelNotFound",
        "TopologyNotSupported",
    }
)
# What Kueue says of a pod set whose topology request no flavor of the queue can serve, and the
# reason the job waits for then (spec.scheduling.topology).
TOPOLOGY_REFUSALS: Final = (
    (
        "does not contain the requested level",
        "TopologyLevelNotFound",
        "spec.scheduling.topology.level {level} is not a level of the Topology of any ResourceFlavor "
        "of {where}",
    ),
    (
        "does not support TopologyAwareScheduling",
        "TopologyNotSupported",
        "spec.scheduling.topology asks for topology-aware scheduling, but no ResourceFlavor of {where} has "
        "a Topology",
    ),
)
# Admitted=False reasons of Evict that are not evictions (the job asked for something else).
NOT_EVICTIONS: Final = frozenset({"WorkloadChanged"})


@dataclass(frozen=True)
class Enqueue:
    """The job waits for admission: Queued, `Admitted` False for `reason` (`message` says which queue
    and why); pods left from an earlier admission are deleted."""

    STEP: ClassVar = False
    reason: str
    message: str


@dataclass(frozen=True)
class Admit:
    """Kueue admitted the job's Workload into `cluster_queue`, with `flavors` (resource -> flavor)."""

    STEP: ClassVar = True
    cluster_queue: str
    flavors: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Evict:
    """The admission the job ran under is gone (`reason`): its pods go and it waits again."""

    STEP: ClassVar = False
    reason: str
    message: str


@dataclass(frozen=True)
class Dequeue:
    """The queue-name label was removed: the job no longer waits for Kueue."""

    STEP: ClassVar = True


QueueDecision = Enqueue | Admit | Evict | Dequeue


def holding(gang: Gang) -> list[JsonDict]:
    """Pods of any attempt, terminating ones included, that hold (or may get) a node's resources."""
    return [pod for pod in gang.all_pods if podstate.phase(pod) in ("Pending", "Running", "Unknown")]


def queue_decision(facts: Facts, status: Mapping[str, Any], gang: Gang) -> QueueDecision | None:
    """What Kueue's view of the job decides, or None when the job may go on (not queued, or admitted)."""
    job = facts.job
    if job.queue_name is None:
        queued_before = status.get("queue") or cond.get(status.get("conditions"), Condition.ADMITTED)
        return Dequeue() if queued_before else None
    kueue = facts.observed.kueue
    workload = current_workload(job, facts.observed.owned) if kueue is not None else None
    if cond.is_true(status.get("conditions"), Condition.ADMITTED):
        if kueue is None:
            return None  # Kueue went away while the job ran: nothing holds its quota, it runs on
        lost = _lost_admission(facts, status, workload)
        return Evict(*lost) if lost is not None else None
    if workload is not None and _admissible(facts, workload):
        found = placement(workload, kueue) if kueue is not None else None
        if isinstance(found, str):
            return Enqueue(
                "FlavorNotFound",
                f"admitted by ClusterQueue {workload.cluster_queue}, but ResourceFlavor {found} is not "
                "known; waiting for it",
            )
        return Admit(workload.cluster_queue, workload.flavors)
    return Enqueue(*_waiting(facts, status, workload, gang))


def _admissible(facts: Facts, workload: WorkloadView) -> bool:
    return (
        workload.admitted
        and workload.evicted is None
        and not workload.finished
        and not workload.deleting
        and asks_for_other_pods(facts.job, workload) is None
    )


def _lost_admission(
    facts: Facts, status: Mapping[str, Any], workload: WorkloadView | None
) -> tuple[str, str] | None:
    """Why the admission the job runs under is gone, or None if it still holds."""
    name = (status.get("queue") or {}).get("workload") or workload_name(facts.job)
    if workload is None or workload.deleting:
        return "WorkloadDeleted", f"Workload {name} was deleted while the job ran"
    evicted = workload.evicted
    if evicted is not None:
        return str(
            evicted.get("reason") or "Evicted"
        ), f"evicted by Kueue: {evicted.get('message') or 'no reason given'}"
    changed = asks_for_other_pods(facts.job, workload)
    if changed is not None:
        return "WorkloadChanged", f"{changed}: the job is queued again with a Workload that asks for it"
    if workload.finished:
        return "WorkloadFinished", f"Workload {name} was marked finished while the job ran"
    if not workload.admitted:
        admitted = workload.condition("Admitted") or {}
        return (
            "AdmissionLost",
            f"Workload {name} is no longer admitted: {admitted.get('message') or 'no reason given'}",
        )
    return None


def _waiting(
    facts: Facts, status: Mapping[str, Any], workload: WorkloadView | None, gang: Gang
) -> tuple[str, str]:
    """(reason, message) of a job that waits for admission."""
    job = facts.job
    queue = job.queue_name
    kueue = facts.observed.kueue
    if kueue is None:
        return (
            "KueueNotInstalled",
            f"label {contract.QUEUE_NAME_LABEL}={queue} asks for Kueue, but the cluster does not serve "
            f"its API ({contract.KUEUE_API_VERSION} Workloads); waiting until Kueue is installed",
        )
    if workload is not None:
        return _workload_says(job, workload)
    priority = workload_priority(job, kueue)
    if isinstance(priority, str):
        return "PriorityClassNotFound", f"cannot queue in LocalQueue {queue}: {priority}"
    recorded = (status.get("queue") or {}).get("workload")
    if recorded:
        reason, text = (
            "WorkloadDeleted",
            f"Workload {recorded} was deleted; queueing again in LocalQueue {queue}",
        )
    else:
        reason, text = "Creating", f"queueing in LocalQueue {queue}: creating Workload {workload_name(job)}"
    remaining = len(holding(gang))
    if remaining:
        text += f" once {remaining} pod(s) are gone"
    return reason, text


def _unusable(workload: WorkloadView, queue: str) -> tuple[str, str] | None:
    """Why the Workload cannot be admitted as it is: deleted, finished, deactivated."""
    name = workload.name
    if workload.deleting:
        return "WorkloadDeleted", f"Workload {name} is being deleted; it is created again once it is gone"
    if workload.finished:
        return "WorkloadFinished", f"Workload {name} was marked finished before the job ended; replacing it"
    if not workload.active:
        return (
            "Deactivated",
            f"Workload {name} is deactivated (spec.active is false); waiting in LocalQueue {queue}",
        )
    return None


def _workload_says(job: TrainingJob, workload: WorkloadView) -> tuple[str, str]:
    """(reason, message) of a job whose Workload waits: Kueue's own words where it has any."""
    queue = job.queue_name or ""
    unusable = _unusable(workload, queue)
    if unusable is not None:
        return unusable
    reserved = workload.condition("QuotaReserved") or {}
    kueue_says = str(reserved.get("message") or "waiting for Kueue to consider the Workload")
    evicted = workload.evicted
    if evicted is not None:
        before = f"evicted by Kueue: {evicted.get('message') or 'no reason given'}"
        text = before if kueue_says == evicted.get("message") else f"{before}; {kueue_says}"
        return str(evicted.get("reason") or "Evicted"), f"waiting in LocalQueue {queue}: {text}"
    if workload.reserved:
        changed = asks_for_other_pods(job, workload)
        if changed is not None:
            return (
                "WorkloadChanged",
                f"{changed}: Workload {workload.name} is replaced once the job's pods are gone",
            )
        pending = "; ".join(workload.checks_pending()) or "waiting for Kueue to admit it"
        return (
            "AdmissionChecksPending",
            f"quota reserved in ClusterQueue {workload.cluster_queue}; admission checks: {pending}",
        )
    topology = job.spec.scheduling.topology
    for words, reason, what in TOPOLOGY_REFUSALS:
        if topology is not None and words in kueue_says:
            said = what.format(level=topology.level, where=f"LocalQueue {queue}'s ClusterQueue")
            return reason, f"{said}; waiting: {kueue_says}"
    return str(reserved.get("reason") or "Pending"), f"waiting in LocalQueue {queue}: {kueue_says}"
