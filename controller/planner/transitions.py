"""One pure function per decision (decide.py): what it does to the status, and the writes it brings.

Each takes the reconcile's facts, the status as it stands and the decision, and returns a `Step`: a
new status (the input is never changed), the pods to create and delete, the Events to record. The
state moves only through `Change.move_to` (change.py), which records an Event when the state changes;
every text written goes through controller.planner.texts, so it fits the field it is written to. The fields
derived from the pods (workers, resources, observedGeneration) are not written here but once, at the
end of the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from builders import mpi
from builders.names import pod_name
from builders.pods import build_pod
from controller.planner import conditions as cond
from controller.planner import inplace, inplace_steps, texts
from controller.planner.change import Change, Moment, Step, moment
from controller.planner.decide import (
    Accept,
    CreateRanks,
    Decision,
    DeleteJob,
    Finish,
    Finished,
    MarkCreated,
    NextAttempt,
    NoteEvaluatorFailure,
    RemoveExtraPods,
    Restart,
    Resume,
    Suspend,
    Track,
    Wait,
)
from controller.planner.elastic import AddWorkers, Rejoined, Shrink, replacing
from controller.planner.facts import Facts, attempt_of, resume_from, state_of
from controller.planner.failures import Cause, restart_delay
from controller.planner.kueue import admitted_placement
from controller.planner.model import Delete, Event
from controller.planner.progress import tracking_events
from controller.planner.reports import RecordProgress
from controller.planner.texts import format_duration
from controller.planner.timers import ceil_to_second, later, stuck_terminating, terminating_for
from controller.runtime.clock import parse_time, rfc3339
from crd.contract import Condition, State

JsonDict = dict[str, Any]
FAILED_CREATE = "FailedCreate"


def apply(  # noqa: PLR0911, PLR0912 - one case per decision
    facts: Facts, status: Mapping[str, Any], decision: Decision
) -> Step:
    match decision:
        case Finished():
            return release(facts, status)
        case DeleteJob():
            return delete_job(facts, status)
        case Finish():
            return finish(facts, status, decision)
        case Accept():
            return accept(facts, status)
        case Suspend():
            return suspend(facts, status)
        case Resume():
            return resume(facts, status)
        case Wait():
            return wait(facts, status, decision)
        case NextAttempt():
            return next_attempt(facts, status)
        case RecordProgress():
            return record_progress(facts, status, decision)
        case NoteEvaluatorFailure():
            return note_evaluator_failure(facts, status, decision)
        case RemoveExtraPods():
            return remove_extra_pods(facts, status, decision)
        case Restart():
            return restart(facts, status, decision)
        case CreateRanks():
            return create_ranks(facts, status, decision)
        case MarkCreated():
            return mark_created(facts, status)
        case Track():
            return track(facts, status, decision)
        case Shrink():
            return shrink(facts, status, decision)
        case Rejoined():
            return rejoined(facts, status, decision)
        case AddWorkers():
            return add_workers(facts, status, decision)
        case inplace.RecreatePods():
            return inplace_steps.recreate_pods(facts, status, decision)
        case inplace.NextAttemptInPlace():
            return inplace_steps.next_attempt_in_place(facts, status)


# -------------------------------------------------------------------------------------- the end


def finish_status(change: Change, state: State, reason: str, message: str) -> None:
    """Completed or Failed: completion time and duration, the deadline clock stopped, the conditions
    of a running or restarting job cleared."""
    failed = state == State.FAILED
    change.move_to(state, message, reason, warning=failed)
    status = change.status
    status["completionTime"] = change.moment.stamp
    started = status.get("startTime")
    if started:
        status["duration"] = format_duration((change.moment.now - parse_time(started)).total_seconds())
    change.pause_deadline_clock()
    status.pop("restartAt", None)
    if failed:
        status["failureReason"] = texts.reason(reason)
        change.set(Condition.FAILED, True, reason, message)
    else:
        change.set(Condition.SUCCEEDED, True, reason, message)
    change.set(Condition.RUNNING, False, reason, message)
    change.clear(Condition.RESTARTING, reason, message)
    change.clear(Condition.STALLED, reason, f"the job is {state}")


def finish(facts: Facts, status: Mapping[str, Any], decision: Finish) -> Step:
    change = Change(moment(facts), status)
    finish_status(change, decision.state, decision.reason, decision.message)
    change.stop(decision.stop, f"job {decision.state}: {decision.reason}")
    return change.step()


def release(facts: Facts, status: Mapping[str, Any]) -> Step:
    """A finished job's pods go as cleanPodPolicy says: All of them, or the Running ones (which hold
    nodes and GPUs for nothing); None keeps them all."""
    change = Change(moment(facts), status)
    gang = facts.gang(status)
    state = status.get("state")
    policy = facts.spec.clean_pod_policy
    if policy == "All":
        change.stop(gang.live, f"job {state}; cleanPodPolicy All")
    elif policy == "Running":
        change.stop(inplace.still_holding(gang), f"job {state}; cleanPodPolicy Running")
    return change.step()


def delete_job(facts: Facts, status: Mapping[str, Any]) -> Step:
    released = release(facts, status)
    ttl = facts.spec.ttl_seconds_after_finished
    expired = Event("Normal", "TTLExpired", f"deleting the job {ttl}s after it finished")
    return Step(released.status, deletes=released.deletes, events=(expired,), delete_job=True)


# ------------------------------------------------------------------------------ suspend, resume


def suspend(facts: Facts, status: Mapping[str, Any]) -> Step:
    change = Change(moment(facts), status)
    gang = facts.gang(status)
    if state_of(status) != State.SUSPENDED:
        change.pause_deadline_clock()
        change.set(Condition.SUSPENDED, True, "Suspended", "spec.suspend is true")
        change.set(Condition.RUNNING, False, "Suspended", "spec.suspend is true")
    change.status.pop("restartAt", None)
    change.status.pop(inplace.FIELD, None)
    change.clear(Condition.RESTARTING, "Suspended", "spec.suspend is true")
    change.stop(gang.live, "job suspended")
    remaining = len(gang.live) + len(gang.terminating)
    message = "suspended" if not remaining else f"suspending: {remaining} pod(s) still terminating"
    change.move_to(State.SUSPENDED, message, "Suspended")
    return change.step()


def resume(facts: Facts, status: Mapping[str, Any]) -> Step:
    change = Change(moment(facts), status)
    change.set(Condition.SUSPENDED, False, "Resumed", "spec.suspend is false")
    change.set(Condition.CREATED, False, "Resuming", "recreating the gang after suspension")
    if status.get("startTime"):
        # A job that ran before resumes with a new attempt; one suspended from creation starts at 0.
        forget_replacements(change)
        change.status["runningSince"] = facts.stamp
        change.status["attempt"] = attempt_of(status) + 1
        change.status.pop("attemptStartTime", None)
    message = "resuming from the latest checkpoint" if resume_from(facts, status) else "resuming"
    change.move_to(State.PENDING, message, "Resumed")
    return change.step()


# ------------------------------------------------------------------------------------- the gang


def accept(facts: Facts, status: Mapping[str, Any]) -> Step:
    change = Change(moment(facts), status)
    # A new job's first state needs no Event of its own: the reconcile that writes it goes on to create
    # the job's objects and records one SuccessfulCreate naming them (or FailedCreate), which says as
    # much, and one Event less per job is one request less in a burst of new jobs.
    change.move_to(State.PENDING, "creating the job's resources", "Pending", announce=False)
    change.set(Condition.CREATED, False, "Creating", "creating the job's resources")
    return change.step()


def build_ranks(facts: Facts, status: Mapping[str, Any], indices: Iterable[int]) -> list[JsonDict]:
    """The pods of `indices` for the status's attempt, resuming from the latest checkpoint, placed
    where Kueue admitted the job (for a queued job)."""
    attempt, resume = attempt_of(status), resume_from(facts, status)
    placement = admitted_placement(facts.job, facts.observed.kueue, facts.observed.owned)
    return [
        build_pod(
            facts.job,
            index,
            attempt=attempt,
            resume_from=resume,
            gang=facts.gang_scheduler,
            placement=placement,
        )
        for index in indices
    ]


def create_ranks(facts: Facts, status: Mapping[str, Any], decision: CreateRanks) -> Step:
    change = Change(moment(facts), status)
    attempt = attempt_of(status)
    resume = resume_from(facts, status)
    pods = build_ranks(facts, status, decision.indices)
    if not status.get("startTime"):
        change.status["startTime"] = facts.stamp
        change.status["runningSince"] = facts.stamp
    # Stamped once per attempt (cleared when the next one begins), not on every retry of a create that
    # failed: that would rewrite status on each retry and restart the schedule timeout.
    change.status.setdefault("attemptStartTime", facts.stamp)
    message = f"creating {len(pods)} pod(s) for attempt {attempt}"
    if resume:
        message += f", resuming from {resume}"
    change.set(Condition.CREATED, False, "Creating", message)
    change.clear(Condition.RESTARTING, "GangRestarted", f"attempt {attempt} started")
    change.clear(Condition.STALLED, "GangRestarted", f"attempt {attempt} started")
    change.clear(Condition.EVALUATOR_FAILED, "GangRestarted", f"attempt {attempt} started")
    change.move_to(State.PENDING, message, "Creating")
    return change.step(creates=[*mpi_secret(facts), *pods])


def mpi_secret(facts: Facts) -> list[JsonDict]:
    """An MPI job's SSH key Secret, made with the key the reconciler generated for this reconcile and
    created before the pods that mount it. Asked for with every creation of the job's pods (an existing
    one, of an earlier attempt, stays as it is: the operator may create Secrets but never reads them),
    so a deleted one is made again."""
    key = facts.observed.ssh_key
    if facts.spec.mpi is None or key is None:
        return []
    return [mpi.build_secret(facts.job, key)]


def mark_created(facts: Facts, status: Mapping[str, Any]) -> Step:
    change = Change(moment(facts), status)
    created = f"{facts.spec.replicas.size} pod(s) of attempt {attempt_of(status)} created"
    change.set(Condition.CREATED, True, "PodsCreated", created)
    return change.step()


def remove_extra_pods(facts: Facts, status: Mapping[str, Any], decision: RemoveExtraPods) -> Step:
    change = Change(moment(facts), status)
    change.stop(decision.pods, "replica index out of range")
    return change.step()


def record_progress(facts: Facts, status: Mapping[str, Any], decision: RecordProgress) -> Step:
    change = Change(moment(facts), decision.update.status if decision.update is not None else status)
    if decision.problem is not None:
        change.note("Warning", "InvalidProgressReport", decision.problem)
    if decision.interrupted is not None:
        change.status["checkpoint"] = {
            **(status.get("checkpoint") or {}),
            "interrupted": decision.interrupted,
        }
        change.note("Warning", "CheckpointInterrupted", decision.interrupted)
    if decision.update is not None and cond.is_true(status.get("conditions"), Condition.STALLED):
        change.set(Condition.STALLED, False, "ProgressResumed", "the trainer reports progress again")
    if decision.update is not None:
        for kind, reason, message in tracking_events(status.get("tracking"), change.status.get("tracking")):
            change.note(kind, reason, message)
    return change.step()


def note_evaluator_failure(facts: Facts, status: Mapping[str, Any], decision: NoteEvaluatorFailure) -> Step:
    """The evaluator is not part of the training cluster: its failure is recorded, nothing else."""
    change = Change(moment(facts), status)
    failure = decision.failure
    change.set(Condition.EVALUATOR_FAILED, True, failure.reason, failure.describe())
    change.note(
        "Warning",
        "EvaluatorFailed",
        f"evaluator {failure.describe()}; the job goes on without it (an evaluator's failure neither fails "
        "nor restarts it), and the next gang attempt starts a new one",
    )
    return change.step()


def track(facts: Facts, status: Mapping[str, Any], decision: Track) -> Step:
    change = Change(moment(facts), status)
    running = decision.state == State.RUNNING
    before = cond.get(status.get("conditions"), Condition.RUNNING)
    if decision.warning and (before is None or before.get("reason") != decision.condition_reason):
        # Once per problem (the condition's reason): the kubelet retries on its own back-off.
        change.note("Warning", decision.condition_reason, decision.message)
    change.set(Condition.RUNNING, running, decision.condition_reason, decision.message)
    change.move_to(decision.state, decision.message, decision.event_reason)
    if decision.stalled is not None:
        change.note("Warning", "Stalled", decision.stalled)
        change.set(Condition.STALLED, True, "ProgressDeadlineExceeded", decision.stalled)
    return change.step()


def wait(facts: Facts, status: Mapping[str, Any], decision: Wait) -> Step:
    change = Change(moment(facts), status)
    if decision.message is not None:
        change.status["message"] = texts.message(decision.message)
    change.stop(decision.stop, decision.stop_reason)
    return change.step()


# ------------------------------------------------------------------------------------- restarts


def restart(facts: Facts, status: Mapping[str, Any], decision: Restart) -> Step:
    """Tears the whole gang down; the next attempt starts after the backoff delay of the cause (none
    for a resize) and once every old pod is gone."""
    change = Change(moment(facts), status)
    restarts = dict(status.get("restarts") or {})
    delay = 0.0
    if decision.cause is not None:
        previous = int(restarts.get(decision.cause.value, 0))
        restarts[decision.cause.value] = previous + 1
        seed = f"{facts.job.uid}/{status.get('restartCount', 0)}"
        delay = restart_delay(facts.spec.failure_policy.restart_backoff, previous, seed)
    change.status["restarts"] = restarts
    change.status["restartCount"] = int(status.get("restartCount", 0)) + 1
    change.status["lastRestartReason"] = texts.reason(decision.reason)
    if delay > 0:
        # Kubernetes times have whole seconds: round up so the restart never comes before the delay.
        change.status["restartAt"] = rfc3339(ceil_to_second(later(facts.now, delay)))
    else:
        # No backoff: nothing to wait for but the old attempt's end (a restartAt rounded up to the
        # second would hold an in-place restart, which is over in well under a second, for nothing).
        change.status.pop("restartAt", None)
    if decision.cause is Cause.STALL:
        change.set(Condition.STALLED, True, "ProgressDeadlineExceeded", decision.message)
    if decision.reason == inplace.SUPERVISOR_NOT_STARTED:
        change.status[inplace.UNAVAILABLE_FIELD] = texts.message(decision.message)
        kept: str | None = decision.message
    else:
        kept = inplace.blocker(facts, facts.gang(status), decision.cause) if inplace.asked(facts) else ""
    if kept is None:
        text = f"{decision.message}; restarting the whole gang in place in {format_duration(delay)}"
        return inplace_steps.stop_in_place(change, facts, status, text, decision.reason)
    if kept:
        inplace_steps.recreated_instead(change, kept)
    change.status.pop(inplace.FIELD, None)
    text = f"{decision.message}; restarting the whole gang in {format_duration(delay)}"
    change.set(Condition.RESTARTING, True, decision.reason, text)
    change.set(Condition.RUNNING, False, "Restarting", text)
    change.set(Condition.CREATED, False, "Restarting", "waiting for the previous attempt's pods to go")
    change.move_to(State.RESTARTING, text, decision.reason, warning=True)
    change.stop(facts.gang(status).live, f"gang restart: {decision.reason}")
    return change.step()


def next_attempt(facts: Facts, status: Mapping[str, Any]) -> Step:
    change = Change(moment(facts), status)
    forget_replacements(change)
    change.status.pop("restartAt", None)
    change.status["attempt"] = attempt_of(status) + 1
    change.status.pop("attemptStartTime", None)
    change.move_to(State.PENDING, f"starting attempt {change.status['attempt']}", "Restarted")
    return change.step()


# ------------------------------------------------------------------------------ elastic jobs


def _elastic_status(change: Change) -> JsonDict:
    elastic: JsonDict = dict(change.status.get("elastic") or {})
    change.status["elastic"] = elastic
    return elastic


def shrink(facts: Facts, status: Mapping[str, Any], decision: Shrink) -> Step:
    """Workers lost while the others run on: counted as shrinks, their indices replaced later."""
    change = Change(moment(facts), status)
    if decision.lost:
        elastic = _elastic_status(change)
        elastic["shrinks"] = int(elastic.get("shrinks", 0)) + len(decision.lost)
        elastic["replacing"] = sorted(replacing(status) | set(decision.lost))
        elastic["lastShrinkReason"] = texts.reason(decision.reason)
        change.status["message"] = texts.message(decision.message)
        change.note("Warning", "WorkerLost", decision.message)
    change.stop(decision.stop, "elastic: worker lost")
    return change.step()


def rejoined(facts: Facts, status: Mapping[str, Any], decision: Rejoined) -> Step:
    """Replacements that run again: counted as grows."""
    change = Change(moment(facts), status)
    elastic = _elastic_status(change)
    if decision.indices:
        elastic["grows"] = int(elastic.get("grows", 0)) + len(decision.indices)
        names = ", ".join(pod_name(facts.job, index) for index in decision.indices)
        running = facts.gang(status).count("Running")
        change.note("Normal", "WorkerRejoined", f"{names} running again: {running} workers running")
    elastic["replacing"] = sorted(replacing(status) - set(decision.indices) - set(decision.dropped))
    return change.step()


def add_workers(facts: Facts, status: Mapping[str, Any], decision: AddWorkers) -> Step:
    """Pods for missing workers of an elastic job while the others run: the state stays Running."""
    change = Change(moment(facts), status)
    pods = build_ranks(facts, status, decision.indices)
    names = ", ".join(pod_name(facts.job, index) for index in decision.indices)
    lost = replacing(status) & set(decision.indices)
    why = "to replace lost workers" if lost else f"numWorkers is {facts.spec.num_workers}"
    change.set(Condition.CREATED, False, "Creating", f"creating {names} ({why})")
    return change.step(creates=pods)


def forget_replacements(change: Change) -> None:
    """A new attempt recreates every worker: nothing is being replaced any more."""
    elastic = change.status.get("elastic")
    if elastic and elastic.get("replacing"):
        change.status["elastic"] = {key: value for key, value in elastic.items() if key != "replacing"}


# -------------------------------------------------------------------------------- housekeeping


def force_delete_stuck(facts: Facts, status: Mapping[str, Any]) -> tuple[Delete, ...]:
    """Pods whose node died never finish terminating (no kubelet confirms it); after a grace period
    (Settings.force_delete_after) they are force-deleted so the gang can restart."""
    deletes = []
    for pod in stuck_terminating(facts, facts.gang(status)):
        if terminating_for(facts, pod) >= facts.settings.force_delete_after:
            meta = pod["metadata"]
            why = f"stuck terminating on lost node {pod['spec']['nodeName']}"
            deletes.append(Delete("Pod", meta["name"], meta["uid"], why, force=True))
    return tuple(deletes)


def show_blocked(moment: Moment, status: Mapping[str, Any], problems: Iterable[str]) -> JsonDict:
    """Objects of the job could not be created for a reason outside it (a quota, a missing
    PriorityClass, a name taken by an object it does not own): Created False, FailedCreate."""
    change = Change(moment, status)
    text = texts.summary(problems)
    change.status["message"] = texts.message(text)
    change.set(Condition.CREATED, False, FAILED_CREATE, text)
    return change.status


def blocked(status: Mapping[str, Any]) -> bool:
    """Whether the last reconcile could not create the job's objects (Created=False, FailedCreate)."""
    created = cond.get(status.get("conditions"), Condition.CREATED)
    return created is not None and created.get("status") == "False" and created.get("reason") == FAILED_CREATE
