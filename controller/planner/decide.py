"""What a TrainingJob needs next: its state machine, written as the order of the checks in `decide`.

    (new) --Accept--> Pending --CreateRanks--> Pending --> Initializing --> Running --Finish--> Completed
                         ^                        |             |              |
                         +--NextAttempt-- Restarting <--------Restart---------+
                             (after the backoff, once the old pods are gone)
    any --Suspend--> Suspended --Resume--> Pending
    any --Finish--> Failed (invalid spec, deadline, permanent failure, a limit exceeded)
    Completed | Failed --(ttlSecondsAfterFinished)--> DeleteJob
    Pending --Enqueue--> Queued --Admit--> Pending; Running ... --Evict--> Queued (Kueue: queueing.py)

A Restart has a cause that decides what it is counted against: a failed rank (backoffLimit), a
disruption: preemption, eviction, a lost node, a rank deleted by someone else (maxDisruptionRestarts),
a gang that could not be scheduled in time, a stall (backoffLimit); a resize has none.

An elastic job (spec.elastic) shrinks instead where it can: its decisions, Shrink, Rejoined and
AddWorkers, and when it falls back to a gang restart, are planner/elastic.py's.

`decide(facts, status, taken)` returns one decision; `plan` applies it (transitions.py). A decision
marked `STEP` needs nothing from the cluster before the next one (the status changed, or pods were
only asked to go), so `plan` then asks again with the new status; `taken` are the steps already
applied in this reconcile. Every other decision ends the reconcile's path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from builders.names import pod_name
from controller.planner import conditions as cond
from controller.planner import elastic, inplace, podstate, reports, roles, volcano
from controller.planner.elastic import AddWorkers, Rejoined, Shrink
from controller.planner.facts import Facts, attempt_of, state_of
from controller.planner.failures import Cause, PodFailure, Verdict, verdict
from controller.planner.gang import Gang, root_cause
from controller.planner.progress import success_reached
from controller.planner.queueing import QueueDecision, queue_decision
from controller.planner.reports import RecordProgress, progress
from controller.planner.summaries import unschedulable_summary, waiting_summary
from controller.planner.texts import format_duration, summary
from controller.planner.timers import active_seconds, quiet_seconds, scheduling_wait, ttl_expires
from controller.runtime.clock import parse_time
from crd.contract import FINISHED_STATES, Condition, State

JsonDict = dict[str, Any]
Pods = tuple[JsonDict, ...]


@dataclass(frozen=True)
class Finished:
    """A Completed or Failed job: release its pods per cleanPodPolicy, wait out its TTL."""

    STEP: ClassVar = False


@dataclass(frozen=True)
class DeleteJob:
    """ttlSecondsAfterFinished has passed: delete the job (and, through ownership, all it has)."""

    STEP: ClassVar = False


@dataclass(frozen=True)
class Finish:
    """Completed or Failed, for `reason`; `stop` are the pods to delete now. Then it is Finished."""

    STEP: ClassVar = True
    state: State
    reason: str
    message: str
    stop: Pods = ()


@dataclass(frozen=True)
class Accept:
    """A new job: Pending while its objects and pods are created."""

    STEP: ClassVar = True


@dataclass(frozen=True)
class Suspend:
    """spec.suspend: delete the pods, stop the deadline clock, cancel a pending restart."""

    STEP: ClassVar = False


@dataclass(frozen=True)
class Resume:
    """spec.suspend is false again: a job that ran starts a new attempt (from its checkpoint)."""

    STEP: ClassVar = True


@dataclass(frozen=True)
class Wait:
    """Nothing can move until pods are gone or a backoff has passed; `message` says which."""

    STEP: ClassVar = False
    message: str | None
    stop: Pods = ()
    stop_reason: str = ""


@dataclass(frozen=True)
class NextAttempt:
    """The backoff has passed and the old gang is gone: the next attempt begins."""

    STEP: ClassVar = True


@dataclass(frozen=True)
class NoteEvaluatorFailure:
    """The evaluator failed or was lost: recorded (EvaluatorFailed, an Event); the job goes on."""

    STEP: ClassVar = True
    failure: PodFailure


@dataclass(frozen=True)
class RemoveExtraPods:
    """Pods beyond the world size, or a second pod for a rank."""

    STEP: ClassVar = True
    pods: Pods


@dataclass(frozen=True)
class Restart:
    """Tear the whole gang down; the next attempt starts after the backoff of `cause` (None: at once,
    counted against no limit)."""

    STEP: ClassVar = False
    cause: Cause | None
    reason: str
    message: str


@dataclass(frozen=True)
class CreateRanks:
    """Create the pods of the missing ranks of the current attempt."""

    STEP: ClassVar = False
    indices: tuple[int, ...]


@dataclass(frozen=True)
class MarkCreated:
    """Every rank of the attempt exists (Created)."""

    STEP: ClassVar = True


@dataclass(frozen=True)
class Track:
    """The gang exists: show how far it got, and a stall (`stalled`) when progress stopped. `warning`:
    the condition's reason is a problem (a container that cannot start), announced by an Event."""

    STEP: ClassVar = False
    state: State
    event_reason: str
    message: str
    condition_reason: str
    stalled: str | None = None
    warning: bool = False


Decision = (
    Finished
    | DeleteJob
    | Finish
    | Accept
    | Suspend
    | Resume
    | Wait
    | NextAttempt
    | RecordProgress
    | NoteEvaluatorFailure
    | RemoveExtraPods
    | Restart
    | CreateRanks
    | MarkCreated
    | Track
    | Shrink
    | Rejoined
    | AddWorkers
    | inplace.RecreatePods
    | inplace.NextAttemptInPlace
)
# Every decision `decide` returns: the lifecycle's above, and the queueing decisions of a job
# labelled for Kueue (queueing.py, applied by admission.py).
AnyDecision = Decision | QueueDecision


def decide(  # noqa: PLR0911 - one return per check of the state machine
    facts: Facts, status: Mapping[str, Any], taken: Sequence[AnyDecision] = ()
) -> AnyDecision:
    """The job's next decision; the order of the checks is the state machine's."""
    state = state_of(status)
    gang = facts.gang(status)
    spec = facts.spec
    if state in FINISHED_STATES:
        expires = ttl_expires(facts, status)
        return DeleteJob() if expires is not None and facts.now >= expires else Finished()
    if facts.being_deleted:
        # Nothing is created, restarted or counted for a job going away (the ReplicaSet and Job
        # controllers create nothing for an owner being deleted); its pods are let go as they end, so
        # that the garbage collector can finish, and pods stuck on a lost node are still force-deleted.
        return Wait(None)
    if facts.spec_errors:
        return fail(facts, "InvalidSpec", "invalid spec: " + "; ".join(facts.spec_errors[:10]), gang.all_pods)
    refused = facts.failures("invalid")
    if refused:
        problems = summary(failure.message for failure in refused)
        return fail(facts, "InvalidSpec", f"invalid spec: {problems}", gang.all_pods)
    if state is None and not spec.suspend:
        return Accept()
    # Whatever happens next, rank 0's latest report first: also the one a trainer told to stop makes
    # with the checkpoint it saved in its grace period, from a pod being deleted.
    recorded = reports.record(facts, status, taken)
    if recorded is not None:
        return recorded
    limit = spec.failure_policy.active_deadline_seconds
    if limit and status.get("startTime") and active_seconds(facts, status) >= limit:
        message = (
            f"the job was active for {format_duration(active_seconds(facts, status))}, longer than "
            f"failurePolicy.activeDeadlineSeconds ({limit}s)"
        )
        return fail(facts, "DeadlineExceeded", message, gang.all_pods, force_stop=True)
    if spec.suspend:
        return Suspend()
    if state == State.SUSPENDED:
        return Resume()
    queueing = queue_decision(facts, status, gang)
    if queueing is not None:
        return queueing
    if status.get("restartAt") or state == State.RESTARTING:
        return _restarting(facts, status, gang)
    return _attempt(facts, status, gang, taken)


def fail(
    facts: Facts, reason: str, message: str, stop: Sequence[JsonDict], *, force_stop: bool = False
) -> Finish:
    """Failed, stopping `stop`, unless cleanPodPolicy None asks to keep every pod as it is (to inspect a
    hung collective); `force_stop` (the deadline) stops them regardless."""
    if facts.spec.clean_pod_policy == "None" and not force_stop:
        stop = ()
    return Finish(State.FAILED, reason, message, tuple(stop))


def _restarting(facts: Facts, status: Mapping[str, Any], gang: Gang) -> Decision:
    """A restart was decided: wait until the old gang is gone (or, in place, every rank stopped) and the
    backoff has passed."""
    in_place = inplace.stopping_step(facts, status, gang)
    if isinstance(in_place, inplace.Hold):
        return _backoff_wait(status) if in_place.message is None else Wait(in_place.message)
    if in_place is not None:
        return in_place
    remaining = len(gang.live) + len(gang.terminating)
    if remaining:
        return Wait(
            f"waiting for {remaining} pod(s) of the previous attempt to terminate",
            tuple(gang.live),
            f"gang restart: {status.get('lastRestartReason', '')}",
        )
    restart_at = status.get("restartAt")
    if restart_at and parse_time(restart_at) > facts.now:
        return _backoff_wait(status)
    return NextAttempt()


def _backoff_wait(status: Mapping[str, Any]) -> Wait:
    """Only the backoff is left: say so (the message may still name the old pods)."""
    restarting = cond.get(status.get("conditions"), Condition.RESTARTING)
    explained = restarting is not None and restarting.get("status") == "True" and restarting.get("message")
    return Wait(str(restarting["message"]) if restarting is not None and explained else None)


def _attempt(  # noqa: PLR0911 - one return per check of the state machine
    facts: Facts, status: Mapping[str, Any], gang: Gang, taken: Sequence[AnyDecision]
) -> Decision:
    """The current gang (its progress is recorded already): notice its end, create it, watch it start."""
    update, _ = progress(facts, status)
    fallback = inplace.starting_step(facts, status, gang)
    if fallback is not None:
        return fallback
    finish = _success(facts, status, gang)
    if finish is not None:
        return finish
    not_started = inplace.supervisor_not_started(gang) if inplace.asked(facts) else None
    if not_started is not None:
        # The operator's own mechanism failed, not the training: restarted without it, uncounted.
        return Restart(None, inplace.SUPERVISOR_NOT_STARTED, not_started)
    reaction = _reaction(facts, status, gang)
    if reaction is not None:
        return reaction
    evaluator = roles.unrecorded_evaluator_failure(status, gang)
    if evaluator is not None:
        return NoteEvaluatorFailure(evaluator)
    if gang.stale:
        return Restart(None, "Resized", f"numWorkers changed to {facts.spec.num_workers}")
    created = cond.is_true(status.get("conditions"), Condition.CREATED)
    lost = gang.missing_training
    if lost and gang.formed(attempt_of(status)) and created and facts.spec.elastic is None:
        names = ", ".join(pod_name(facts.job, index) for index in lost)
        return Restart(Cause.DISRUPTION, "PodDeleted", f"pod(s) {names} disappeared")
    if gang.out_of_range and not any(isinstance(step, RemoveExtraPods) for step in taken):
        return RemoveExtraPods(tuple(gang.out_of_range))
    to_create = gang.to_create(status)
    if to_create:
        return _create_missing(facts, status, gang, to_create)
    if not created and gang.held_launcher is None:
        return MarkCreated()
    timeout = facts.spec.scheduling.schedule_timeout_seconds
    waited = scheduling_wait(facts, status, gang)
    if timeout is not None and waited is not None and waited >= timeout:
        return Restart(
            Cause.SCHEDULING,
            "ScheduleTimeout",
            f"{unschedulable_summary(gang)} after {format_duration(waited)} "
            f"(scheduling.scheduleTimeoutSeconds {timeout}); releasing all pods",
        )
    restarting = inplace.starting_message(facts, status, gang)
    if restarting is not None:  # one message until every rank runs the attempt: no write per rank
        return Track(State.INITIALIZING, "PodsScheduled", restarting, "PodsStarting")
    return _track(facts, status, gang, deferred=update is not None and update.retry_in is not None)


def _reaction(facts: Facts, status: Mapping[str, Any], gang: Gang) -> Decision | None:
    """What a broken gang needs: failurePolicy's verdict; for an elastic job, a shrink (or the news that
    a replacement runs) where it can, else that same verdict."""
    if facts.spec.elastic is None:
        failures = [*gang.failures, *inplace.run_failures(facts, status, gang)]
        return _react_to_failure(facts, status, gang, failures) if failures else None
    reaction = elastic.react(facts, status, gang)
    if isinstance(reaction, elastic.Fallback):
        return _react_to_failure(facts, status, gang, reaction.failures, reaction.note)
    return reaction


def _create_missing(facts: Facts, status: Mapping[str, Any], gang: Gang, slots: Sequence[int]) -> Decision:
    """Pods for the missing ranks (`slots`), once no pod of a previous attempt is left; a running
    elastic job adds its missing workers while the others train. None while the job is held back
    (facts.held_back, planner/guards.py)."""
    if facts.held_back is not None:
        return Wait(facts.held_back)
    queue_hold = volcano.queue_hold(facts)
    if queue_hold is not None:
        return Wait(queue_hold[1])
    if facts.spec.elastic is not None and state_of(status) == State.RUNNING:
        added = elastic.add_workers(facts, gang)
        return added if added is not None else Wait(elastic.replacement_wait(facts, gang))
    if gang.terminating:
        return Wait(f"waiting for {len(gang.terminating)} pod(s) of a previous attempt to terminate")
    return CreateRanks(tuple(slots))


def _success(facts: Facts, status: Mapping[str, Any], gang: Gang) -> Finish | None:
    """The success policy's metric targets, then what the pods' ends say (roles.completion)."""
    reached = success_reached(status, facts.spec.success_policy)
    if reached is not None:
        reason, message = reached
        return Finish(State.COMPLETED, reason, message, tuple(gang.holding))
    ended = roles.completion(facts.spec, gang)
    if ended is not None:
        return Finish(State.COMPLETED, ended.reason, ended.message, ended.stop)
    return None


def _react_to_failure(
    facts: Facts,
    status: Mapping[str, Any],
    gang: Gang,
    failures: Sequence[PodFailure] | None = None,
    note: str | None = None,
) -> Finish | Restart:
    """The failure that broke the gang (among `failures`, all of the gang's by default), judged by
    failurePolicy: a restart, or the end of the job. `note` adds why an elastic job could not shrink."""
    policy = facts.spec.failure_policy
    failure = root_cause(failures or gang.failures, {pod["metadata"]["name"]: pod for pod in gang.all_pods})
    described = failure.describe() + (f"; {note}" if note else "")
    reason = (
        "OOMKilled"
        if failure.reason == "OOMKilled"
        else ("Disruption" if failure.disruption else "PodFailed")
    )
    restarts = status.get("restarts") or {}
    holding = inplace.still_holding(gang)
    judged = verdict(failure, policy)
    if judged is Verdict.PERMANENT:
        why = "restartPolicy Never" if policy.restart_policy == "Never" else "a permanent exit code"
        return fail(facts, reason if reason == "OOMKilled" else "PodFailed", f"{described} ({why})", holding)
    if judged is Verdict.DISRUPTION:
        limit = policy.max_disruption_restarts
        if int(restarts.get(Cause.DISRUPTION.value, 0)) >= limit:
            message = (
                f"{limit} restarts after disruptions (failurePolicy.maxDisruptionRestarts); last: {described}"
            )
            return fail(facts, "DisruptionLimitExceeded", message, holding)
        return Restart(Cause.DISRUPTION, failure.reason, described)
    used = backoff_used(status)
    if used >= policy.backoff_limit:
        message = (
            f"failed after {used} restart(s) (failurePolicy.backoffLimit {policy.backoff_limit}); "
            f"last failure: {described}"
        )
        return fail(facts, "BackoffLimitExceeded", message, holding)
    return Restart(Cause.FAILURE, reason, described)


def backoff_used(status: Mapping[str, Any]) -> int:
    """Restarts counted against backoffLimit: after failures and after stalls."""
    restarts = status.get("restarts") or {}
    return int(restarts.get(Cause.FAILURE.value, 0)) + int(restarts.get(Cause.STALL.value, 0))


def _track(facts: Facts, status: Mapping[str, Any], gang: Gang, *, deferred: bool) -> Decision:
    """How far the complete gang got; once it has been running, whether it stalled. The pods it waits
    for are the training cluster's and a live evaluator (roles.expected)."""
    expected = roles.expected(gang)
    total = len(expected)
    running = sum(
        1 for slot in expected if podstate.worker_phase(gang.ranks.get(slot, {})) in ("Running", "Succeeded")
    )
    elastic_running = elastic.running_message(facts, gang)
    if gang.unscheduled and elastic_running is None:
        message = unschedulable_summary(gang)
        unschedulable = any(podstate.unschedulable_message(pod) for pod in gang.unscheduled)
        reason = "PodsUnschedulable" if unschedulable else "PodsPending"
        return Track(State.PENDING, reason, message, reason)
    if running < total and elastic_running is None:
        waiting = waiting_summary(gang)
        if waiting is not None:
            reason, text = waiting
            message = f"{running}/{total} pods running; {text}"
            return Track(State.INITIALIZING, "PodsScheduled", message, reason, warning=True)
        message = f"{running}/{total} pods running"
        if gang.held_launcher is not None:
            message += "; the launcher is created once every worker is Ready (its SSH server answers)"
        return Track(State.INITIALIZING, "PodsScheduled", message, "PodsStarting")
    stalled = None
    if cond.is_true(status.get("conditions"), Condition.RUNNING) and not deferred:
        # A deferred report is progress too: lastProgressTime only lags behind the rate limit
        # (--progress-interval), which may be longer than the deadline.
        stalled = _stall(facts, status)
    if isinstance(stalled, Finish | Restart):
        return stalled
    if elastic_running is not None and running < total:
        return Track(State.RUNNING, "Running", elastic_running, "MinWorkersRunning", stalled)
    return Track(
        State.RUNNING, "Running", f"{total}/{total} {gang.noun} running", "AllWorkersRunning", stalled
    )


def _stall(facts: Facts, status: Mapping[str, Any]) -> Finish | Restart | str | None:
    """A running gang past monitoring.progressDeadlineSeconds without progress: the stall's message,
    or what restartOnStall makes of it."""
    monitoring = facts.spec.monitoring
    deadline = monitoring.progress_deadline_seconds
    quiet = quiet_seconds(facts, status)
    if not deadline or quiet < deadline or facts.trainer_reports_withheld:
        return None
    if cond.is_true(status.get("conditions"), Condition.STALLED) and not monitoring.restart_on_stall:
        return None
    last = status.get("currentEpoch")
    detail = f" (last report: epoch {last})" if last is not None else " (no report yet)"
    message = (
        f"no progress reported for {format_duration(quiet)}, over "
        f"monitoring.progressDeadlineSeconds ({deadline}s){detail}"
    )
    if not monitoring.restart_on_stall:
        return message
    if backoff_used(status) >= facts.spec.failure_policy.backoff_limit:
        gang = facts.gang(status)
        return fail(facts, "BackoffLimitExceeded", f"{message}; backoffLimit exhausted", gang.holding)
    return Restart(Cause.STALL, "Stalled", message)
