"""The job's Workload, kept as Kueue expects of the controller that owns it.

After the decisions (queueing.py) leave the job's status, `workload_writes` compares what the job
needs from Kueue with the Workload the cache shows, and lists the writes, as Kueue's own job
integrations make them:

- a queued job that waits or runs has exactly one Workload: created when missing, its queue,
  priority and pod set patched to the spec while no quota is reserved, replaced (deleted, then
  created again) when the spec asks for other pods than a reserved admission covers;
- an eviction is acknowledged once the job's pods are gone: the admission is cleared, quota released
  and the Workload requeued, with the conditions Kueue's integrations write;
- a finished job's Workload is marked Finished (Kueue then releases its quota);
- a Workload Kueue made for the job (the prebuilt-workload label: MultiKueue's copy on a worker
  cluster) is used, never created, and adopted (the job becomes its owner);
- a suspended job's Workload is deleted once its pods are gone, so its quota is free meanwhile; so is
  the Workload of a job whose queue-name label was removed, at once.

Quota stays reserved while any pod of the job still holds a node (the Workload is released, replaced
or deleted only after), so Kueue never hands GPUs to another job that are still in use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from builders.meta import owner_reference
from builders.workload import build_workload, workload_name
from controller.planner import conditions as cond
from controller.planner import texts
from controller.planner.facts import Facts, state_of
from controller.planner.kueue import WorkloadView, asks_for_other_pods, workload_priority, workloads_of
from controller.planner.model import Delete
from controller.planner.queueing import holding
from controller.planner.supporting import Patch
from crd import contract
from crd.contract import FINISHED_STATES, State

JsonDict = dict[str, Any]

# The Workload spec fields the operator keeps equal to what it builds (Kueue owns spec.active).
SPEC_FIELDS: Final = ("queueName", "podSets", "priority", "priorityClassRef")
# Those that are unset when the job has no priority class (a merge patch removes them).
PRIORITY_FIELDS: Final = ("priorityClassRef",)


@dataclass
class WorkloadWrites:
    creates: list[JsonDict] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)

    def delete(self, workload: WorkloadView, reason: str) -> None:
        if not workload.deleting:
            self.deletes.append(Delete("Workload", workload.name, workload.uid, reason))

    def patch(self, workload: WorkloadView, body: JsonDict, subresource: str | None = None) -> None:
        self.patches.append(Patch("Workload", workload.name, body, contract.KUEUE_API_VERSION, subresource))


def workload_writes(facts: Facts, status: Mapping[str, Any]) -> WorkloadWrites:
    writes = WorkloadWrites()
    kueue = facts.observed.kueue
    if kueue is None:
        return writes
    job = facts.job
    current = _current(writes, facts)
    state = state_of(status)
    busy = bool(holding(facts.gang(status)))
    if state in FINISHED_STATES:
        if current is not None and not current.finished:
            writes.patch(current, finished(current, status, facts.stamp), "status")
    elif job.queue_name is None:
        if current is not None:
            writes.delete(current, f"the job's {contract.QUEUE_NAME_LABEL} label was removed")
    elif state == State.SUSPENDED:
        if current is not None and not busy:
            writes.delete(current, "job suspended: its quota is released")
    elif current is None:
        if job.prebuilt_workload:
            return writes  # Kueue makes it (MultiKueue, before the copy): the job waits for the cache
        priority = workload_priority(job, kueue)
        if not busy and not isinstance(priority, str):
            writes.creates.append(build_workload(job, priority))
    elif not current.deleting:
        _adopt(writes, facts, current)
        _keep(writes, facts, current, busy=busy)
    return writes


def _adopt(writes: WorkloadWrites, facts: Facts, current: WorkloadView) -> None:
    """A Workload Kueue made for the job (prebuilt) becomes the job's, as Kueue's integrations adopt
    theirs: the garbage collector then deletes it with the job, and its changes wake the job."""
    if not facts.job.prebuilt_workload or not facts.job.uid:
        return
    owners = current.raw["metadata"].get("ownerReferences") or []
    if any(isinstance(owner, Mapping) and owner.get("uid") == facts.job.uid for owner in owners):
        return
    body = {
        "metadata": {
            "resourceVersion": current.resource_version,
            "ownerReferences": [*owners, owner_reference(facts.job)],
        }
    }
    writes.patch(current, body)


def _current(writes: WorkloadWrites, facts: Facts) -> WorkloadView | None:
    """The job's Workload; any other Workload it owns (made by hand, say) is deleted."""
    name = workload_name(facts.job)
    current = None
    for workload in workloads_of(facts.observed.owned):
        if workload.name == name:
            current = workload
        else:
            writes.delete(workload, "not the Workload of the job as it is now")
    return current


def _keep(writes: WorkloadWrites, facts: Facts, current: WorkloadView, *, busy: bool) -> None:
    """The writes that keep a queued job's Workload as its job needs it."""
    job = facts.job
    if current.finished:
        writes.delete(current, "marked finished before the job ended")
    elif current.reserved:
        if busy:
            return  # the quota stays reserved while pods of the job hold nodes
        if current.evicted is not None:
            writes.patch(current, released(current, facts.stamp), "status")
        elif asks_for_other_pods(job, current) is not None:
            writes.delete(current, "the job asks for other pods than its admission covers")
    elif facts.observed.kueue is not None:
        priority = workload_priority(job, facts.observed.kueue)
        if not isinstance(priority, str):
            body = _spec_changes(current, build_workload(job, priority))
            if body:
                writes.patch(current, {"spec": body})


def _covers(current: Any, wanted: Any) -> bool:
    """Whether `current` says everything `wanted` does; what the API server or Kueue added to it
    (defaults such as an empty template metadata) is no difference."""
    if isinstance(wanted, Mapping):
        return isinstance(current, Mapping) and all(
            _covers(current.get(key), value) for key, value in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(current, list)
            and len(current) == len(wanted)
            and all(_covers(have, want) for have, want in zip(current, wanted, strict=True))
        )
    return bool(current == wanted or (not current and not wanted))


def _spec_changes(current: WorkloadView, wanted: JsonDict) -> JsonDict:
    """The merge patch that makes the Workload's spec ask for what the job does now."""
    changes: JsonDict = {}
    for key in SPEC_FIELDS:
        value = wanted["spec"].get(key)
        if key in PRIORITY_FIELDS:
            if (current.spec.get(key) or None) != (value or None):
                changes[key] = value  # None removes the field
        elif not _covers(current.spec.get(key), value):
            changes[key] = value
    return changes


def _conditions(workload: WorkloadView, now: str, *updates: tuple[str, bool, str, str]) -> list[JsonDict]:
    conditions: list[JsonDict] = [dict(entry) for entry in workload.status.get("conditions") or []]
    generation = workload.raw["metadata"].get("generation")
    for type_, value, reason, message in updates:
        conditions = cond.set_condition(
            conditions,
            type_,
            value,
            reason=reason,
            message=texts.message(message),
            now=now,
            generation=generation if isinstance(generation, int) else None,
        )
    return conditions


def finished(workload: WorkloadView, status: Mapping[str, Any], now: str) -> JsonDict:
    """Marks the Workload Finished (Succeeded or Failed, with the job's message)."""
    reason = "Succeeded" if status.get("state") == State.COMPLETED else "Failed"
    message = str(status.get("message") or f"the job {str(status.get('state')).lower()}")
    return {
        "metadata": {"resourceVersion": workload.resource_version},
        "status": {"conditions": _conditions(workload, now, ("Finished", True, reason, message))},
    }


def released(workload: WorkloadView, now: str) -> JsonDict:
    """Acknowledges an eviction once the job's pods are gone: the admission cleared (quota released),
    QuotaReserved and Admitted False, Requeued (True after a preemption; Kueue itself requeues after a
    deactivation, a stopped queue or a backoff), as Kueue's job integrations do."""
    evicted = workload.evicted or {}
    reason = str(evicted.get("reason") or "Evicted")
    message = str(evicted.get("message") or "evicted")
    conditions = _conditions(
        workload,
        now,
        ("QuotaReserved", False, "Pending", message),
        ("Admitted", False, "NoReservation", "The workload has no reservation"),
        ("Requeued", reason == "Preempted", reason, message),
    )
    return {
        "metadata": {"resourceVersion": workload.resource_version},
        "status": {"admission": None, "conditions": conditions},
    }
