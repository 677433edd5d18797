"""A job another controller runs (spec.managedBy): what the operator still does for it, and no more.

Why: with `spec.managedBy: kueue.x-k8s.io/multikueue` Kueue's MultiKueue runs the job on a worker
cluster. Kueue has no integration of its own for TrainingJobs, so on this (the manager) cluster the
operator still makes and keeps the job's Workload (workloads.py, as for any queued job), which Kueue
queues and MultiKueue dispatches: it copies the Workload and then the job (without managedBy) to the
worker, where the operator there runs the copy in that Workload. From then on MultiKueue copies the
copy's whole status onto this job. So here the operator creates no pod, Service or other object, and
writes status only while no worker runs the job: before the dispatch (Queued, why it waits) and once
the copy is gone and the Workload's quota released (Queued, Kueue's reason: an eviction, a worker lost
for longer than MultiKueue waits). While a worker's copy exists its status is the job's, so the
operator never writes over it (no two writers of one status, so no write loop). The one exception
is an outage: while the worker running the copy is unreachable, MultiKueue mirrors nothing, and the
operator says so (WorkerReachable False, `show_worker_reachability`), which MultiKueue's next copy of
the status then drops.

A job managed by any other controller (the schema refuses other values; an older CRD may not) is left
alone entirely.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from builders.workload import workload_name
from controller.planner import conditions as cond
from controller.planner.change import Change, moment
from controller.planner.facts import Facts, state_of
from controller.planner.kueue import WorkloadView, current_workload
from controller.planner.model import Plan
from controller.planner.workloads import WorkloadWrites, workload_writes
from crd import contract
from crd.contract import FINISHED_STATES, Condition, State

JsonDict = dict[str, Any]

# Condition reasons: Admitted False while MultiKueue has not dispatched the job, WorkerReachable False.
WAITING = "WaitingForDispatch"
NO_QUEUE = "NoQueueName"
NO_KUEUE = "KueueNotInstalled"
UNREACHABLE = "WorkerClusterUnreachable"


def plan_managed_elsewhere(facts: Facts, status: Mapping[str, Any]) -> Plan:
    """The plan for a job whose spec.managedBy names another controller."""
    if facts.job.managed_elsewhere != contract.MULTIKUEUE_CONTROLLER or facts.being_deleted:
        return Plan(status=dict(status))
    writes = _workload_writes(facts, status)
    change = Change(moment(facts), status)
    waiting = why_waiting(facts, status)
    if waiting is not None:
        reason, message = waiting
        change.set(Condition.ADMITTED, False, reason, message)
        queue = {"name": facts.job.queue_name or ""}
        if current_workload(facts.job, facts.observed.owned) is not None:
            queue["workload"] = workload_name(facts.job)
        change.status["queue"] = queue
        # No pod of the job runs anywhere now (a copy's mirrored counts are stale once it is gone).
        change.status["workers"] = facts.gang(change.status).workers()
        change.status["resources"] = {"gpus": 0, "workers": 0}
        change.status["replicas"] = 0
        change.move_to(State.QUEUED, message, reason, warning=reason in (NO_QUEUE, NO_KUEUE))
    else:
        show_worker_reachability(facts, status, change)
    return Plan(
        status=change.status,
        creates=writes.creates,
        patches=writes.patches,
        deletes=writes.deletes,
        events=change.events,
    )


def _workload_writes(facts: Facts, status: Mapping[str, Any]) -> WorkloadWrites:
    """The Workload's writes of any queued job (create, keep in step, release after an eviction)
    until the job ends: MultiKueue marks it Finished when the copy does, and the state that says the
    job ended is the copy's, mirrored; neither is the operator's to act on here."""
    workload = current_workload(facts.job, facts.observed.owned)
    if state_of(status) in FINISHED_STATES or (workload is not None and workload.finished):
        return WorkloadWrites()
    return workload_writes(facts, status)


def why_waiting(facts: Facts, status: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) while no worker cluster runs the job, so the operator says why; None while
    MultiKueue owns the status (a copy was dispatched) or once the job has finished."""
    if state_of(status) in FINISHED_STATES:
        return None
    missing = _missing(facts)
    if missing is not None or facts.job.queue_name is None:
        return missing
    queue = facts.job.queue_name
    workload = current_workload(facts.job, facts.observed.owned)
    if workload is not None and workload.finished:
        return None  # MultiKueue copied the copy's last status before it marked the Workload Finished
    if workload is None or not workload.reserved:
        return _requeued(queue, workload)
    # Reserved here, so MultiKueue is dispatching it: the status stays the operator's until the
    # copy's status is mirrored (the state is then another than Queued).
    if state_of(status) not in (None, State.QUEUED) or workload.admitted:
        return None
    return WAITING, _dispatching(queue, workload)


def _missing(facts: Facts) -> tuple[str, str] | None:
    """What keeps MultiKueue from ever dispatching the job: no Kueue, or no LocalQueue named."""
    if facts.observed.kueue is None:
        return NO_KUEUE, (
            f"spec.managedBy is {contract.MULTIKUEUE_CONTROLLER} but the cluster serves no Kueue API: "
            "nothing dispatches the job"
        )
    if facts.job.queue_name is None:
        return NO_QUEUE, (
            f"spec.managedBy is {contract.MULTIKUEUE_CONTROLLER} but the job has no "
            f"{contract.QUEUE_NAME_LABEL} label: MultiKueue dispatches only the jobs of a LocalQueue"
        )
    return None


def show_worker_reachability(facts: Facts, status: Mapping[str, Any], change: Change) -> None:
    """While the worker running the copy is unreachable (its MultiKueueCluster not Active), MultiKueue
    mirrors nothing: the job's status is the copy's last, and WorkerReachable False says why (with a
    Warning Event as it turns). Once the worker is back, MultiKueue's next copy of the status drops the
    condition; if it has not yet, the condition turns True (MultiKueue's copy then drops that too). So
    the operator writes at most twice per outage, and never what the mirror just wrote."""
    kueue = facts.observed.kueue
    workload = current_workload(facts.job, facts.observed.owned)
    if kueue is None or workload is None or not workload.admitted or workload.finished:
        return
    name = str(workload.status.get("clusterName") or "")
    cluster = kueue.multikueue_clusters.get(name)
    if cluster is None or state_of(status) in FINISHED_STATES:
        return
    active = next(
        (
            entry
            for entry in (cluster.get("status") or {}).get("conditions") or []
            if entry.get("type") == "Active"
        ),
        None,
    )
    shown = cond.get(status.get("conditions"), Condition.WORKER_REACHABLE)
    if active is not None and active.get("status") == "False":
        message = (
            f"worker cluster {name} is unreachable ({active.get('reason')}: {active.get('message')}); "
            "the status shown is the worker's last; MultiKueue keeps the job admitted for its "
            "workerLostTimeout, then dispatches it again"
        )
        if shown is None or shown.get("status") != "False":
            change.note("Warning", UNREACHABLE, message)
        change.set(Condition.WORKER_REACHABLE, False, UNREACHABLE, message)
    elif shown is not None and shown.get("status") == "False":
        change.set(
            Condition.WORKER_REACHABLE, True, "WorkerClusterReachable", f"worker cluster {name} is reachable"
        )


def _dispatching(queue: str, workload: WorkloadView) -> str:
    pending = workload.checks_pending()
    text = f"admitted in LocalQueue {queue}; dispatching to a worker cluster"
    return f"{text}: {'; '.join(pending)}" if pending else text


def _requeued(queue: str, workload: WorkloadView | None) -> tuple[str, str]:
    """Why a Workload without a reservation waits: Kueue's last eviction or requeue, else its queue."""
    if workload is None:
        return WAITING, f"waiting in LocalQueue {queue} for dispatch to a worker cluster"
    for type_ in ("Evicted", "Requeued"):
        entry = workload.condition(type_)
        if entry is not None and entry.get("message") and entry.get("reason"):
            return str(entry["reason"]), (
                f"{entry['message']}; waiting in LocalQueue {queue} for dispatch to a worker cluster"
            )
    reserved = workload.condition("QuotaReserved")
    if reserved is not None and reserved.get("message"):
        return WAITING, f"waiting in LocalQueue {queue}: {reserved['message']}"
    return WAITING, f"waiting in LocalQueue {queue} for dispatch to a worker cluster"
