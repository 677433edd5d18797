"""The transitions of the queueing decisions (queueing.py): what each does to the status.

As in transitions.py, each takes the reconcile's facts, the status and the decision and returns a
`Step` (a new status, the pods to delete, the Events). A job that waits is Queued with `Admitted`
False, its pods deleted and its deadline clock stopped; an admitted one is Pending with `Admitted`
True until its pods run. status.queue keeps which queue, which Workload, where the current run was
admitted, and how often the job was admitted and evicted; none of it is a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from builders.workload import workload_name
from controller.planner import conditions as cond
from controller.planner.change import Change, Step, moment
from controller.planner.facts import Facts, attempt_of, resume_from, state_of
from controller.planner.kueue import current_workload
from controller.planner.progress import apply_report
from controller.planner.queueing import (
    NOT_EVICTIONS,
    WARNING_REASONS,
    Admit,
    Dequeue,
    Enqueue,
    Evict,
    QueueDecision,
)
from controller.planner.transitions import forget_replacements
from crd import contract
from crd.contract import Condition, State

JsonDict = dict[str, Any]


def apply_queueing(facts: Facts, status: Mapping[str, Any], decision: QueueDecision) -> Step:
    match decision:
        case Enqueue():
            return enqueue(facts, status, decision)
        case Admit():
            return admit(facts, status, decision)
        case Evict():
            return evict(facts, status, decision)
        case Dequeue():
            return dequeue(facts, status)


def _queue_status(facts: Facts, status: Mapping[str, Any]) -> JsonDict:
    """status.queue with the LocalQueue and (once the cache shows it) the Workload."""
    queue = dict(status.get("queue") or {})
    queue["name"] = facts.job.queue_name or ""
    if current_workload(facts.job, facts.observed.owned) is not None:
        queue["workload"] = workload_name(facts.job)
    return queue


def _hold(change: Change, facts: Facts, status: Mapping[str, Any], reason: str, message: str) -> None:
    """Stops the job where it is: pods deleted, the deadline clock and a pending restart stopped."""
    change.pause_deadline_clock()
    change.status.pop("restartAt", None)
    change.status.pop("inPlaceRestart", None)  # its pods go: no in-place restart goes on
    for type_ in (Condition.RESTARTING, Condition.RUNNING):
        if cond.is_true(status.get("conditions"), type_):
            change.set(type_, False, reason, message)
    change.stop(facts.gang(status).live, f"queued: {reason}")


def _next_run(change: Change, facts: Facts, status: Mapping[str, Any]) -> None:
    """A job that ran before starts a new attempt (its old pods made the current one), with its
    deadline clock running again; an elastic job's lost workers are no longer being replaced (the new
    attempt creates every worker)."""
    if status.get("attemptStartTime"):
        forget_replacements(change)
        change.status["attempt"] = attempt_of(status) + 1
        change.status.pop("attemptStartTime", None)
    if status.get("startTime"):
        change.status["runningSince"] = facts.stamp


def enqueue(facts: Facts, status: Mapping[str, Any], decision: Enqueue) -> Step:
    change = Change(moment(facts), status)
    queue = _queue_status(facts, status)
    queue.pop("clusterQueue", None)
    queue.pop("flavors", None)
    change.status["queue"] = queue
    previous = cond.get(status.get("conditions"), Condition.ADMITTED)
    change.set(Condition.ADMITTED, False, decision.reason, decision.message)
    _hold(change, facts, status, decision.reason, decision.message)
    warning = decision.reason in WARNING_REASONS
    if state_of(status) != State.QUEUED:
        change.move_to(State.QUEUED, decision.message, decision.reason, warning=warning)
        return change.step()
    if previous is None or previous.get("reason") != decision.reason:
        change.note(
            "Warning" if warning else "Normal", decision.reason, f"{State.QUEUED}: {decision.message}"
        )
    change.move_to(State.QUEUED, decision.message, decision.reason)
    return change.step()


def admit(facts: Facts, status: Mapping[str, Any], decision: Admit) -> Step:
    change = Change(moment(facts), status)
    queue = _queue_status(facts, status)
    queue["clusterQueue"] = decision.cluster_queue
    if decision.flavors:
        queue["flavors"] = dict(decision.flavors)
    else:
        queue.pop("flavors", None)
    queue["admissions"] = int(queue.get("admissions") or 0) + 1
    change.status["queue"] = queue
    flavors = ", ".join(f"{flavor} for {resource}" for resource, flavor in sorted(decision.flavors.items()))
    text = f"admitted by ClusterQueue {decision.cluster_queue}" + (f" ({flavors})" if flavors else "")
    change.set(Condition.ADMITTED, True, "Admitted", text)
    _next_run(change, facts, status)
    latest = resume_from(facts, status) if status.get("startTime") else None
    message = f"{text}; resuming from {latest}" if latest else text
    change.move_to(State.PENDING, message, "Admitted")
    return change.step()


def evict(facts: Facts, status: Mapping[str, Any], decision: Evict) -> Step:
    report, _ = facts.report(status)
    if report is not None:
        # Rank 0's last report, rate limit or not: its checkpoint is where the next admission resumes.
        status = apply_report(status, report, facts.spec, facts.now, 0.0).status
    change = Change(moment(facts), status)
    queue = _queue_status(facts, status)
    queue.pop("clusterQueue", None)
    queue.pop("flavors", None)
    if decision.reason not in NOT_EVICTIONS:
        queue["evictions"] = int(queue.get("evictions") or 0) + 1
    change.status["queue"] = queue
    change.set(Condition.ADMITTED, False, decision.reason, decision.message)
    change.set(Condition.RUNNING, False, decision.reason, decision.message)
    change.set(
        Condition.CREATED, False, decision.reason, "the pods are deleted until Kueue admits the job again"
    )
    _hold(change, facts, status, decision.reason, decision.message)
    remaining = len(facts.gang(status).all_pods)
    text = f"{decision.message}; waiting in LocalQueue {facts.job.queue_name}"
    if remaining:
        text += f" (deleting {remaining} pod(s))"
    change.move_to(State.QUEUED, text, decision.reason, warning=True)
    return change.step()


def dequeue(facts: Facts, status: Mapping[str, Any]) -> Step:
    change = Change(moment(facts), status)
    change.status.pop("queue", None)
    change.status["conditions"] = [
        dict(entry) for entry in status.get("conditions") or [] if entry.get("type") != Condition.ADMITTED
    ]
    if state_of(status) == State.QUEUED:
        _next_run(change, facts, status)
        text = f"the {contract.QUEUE_NAME_LABEL} label was removed: the job runs without Kueue"
        change.move_to(State.PENDING, text, "Dequeued")
    return change.step()
