"""In-place gang restarts (spec.failurePolicy.restartStrategy InPlace): whether a restart may keep the
pods, how far the ranks' supervisors got, and when the operator gives up and recreates the pods.

Why: recreating a gang (delete every pod, wait until all are gone, create, schedule, start) is most of
what a failure costs a large job; restarting only the training processes keeps the pods' names, IPs,
nodes, volumes and images. The operator gives its orders in one status field, `inPlaceRestart`
(`Order`): Stopping (stop the attempt's processes) and, once every rank stopped and the backoff has
passed, Starting (start attempt N with RESUME_FROM); every rank's supervisor watches its job and
answers on its own pod's run annotation (podstate.run). So a restart costs a few status writes per
gang and no pod write. The restart is counted once, when the Stopping order is written
(transitions.restart), exactly as a recreating restart is; everything the next leader needs is in the
status and the pods' annotations, so an operator restarted in the middle resumes the same step.

When the pods cannot stay (`blocker`: a rank's pod missing, being deleted or its supervisor gone, its
node lost, a changed spec, a restart whose cause frees the pods, an MPI or elastic job) or a rank does
not answer in time (`IN_PLACE_STOP_MARGIN_SECONDS` past the grace period for Stopping,
`IN_PLACE_START_SECONDS` for Starting), `RecreatePods` falls back to today's path: the pods are
deleted and created again for the next attempt, with a Warning Event that says why.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final

from builders import supervisor
from builders.env import termination_grace_seconds
from builders.names import pod_name
from builders.supervisor import runs_supervisor, unsupported
from controller.planner import podstate
from controller.planner.facts import Facts, attempt_of
from controller.planner.failures import Cause, PodFailure
from controller.planner.gang import Gang
from controller.runtime.clock import parse_time
from crd.contract import (
    CONTAINER_NAME,
    IN_PLACE_START_SECONDS,
    IN_PLACE_STOP_MARGIN_SECONDS,
    RUN_ANNOTATION,
    TRAINER_POLICY,
)

JsonDict = dict[str, Any]

FIELD: Final = "inPlaceRestart"
KIND_FIELD: Final = "lastRestartKind"
STOPPING: Final = "Stopping"
STARTING: Final = "Starting"
IN_PLACE: Final = "InPlace"
RECREATE: Final = "Recreate"
FALLBACK_REASON: Final = "InPlaceRestartFallback"
# The restart (not counted against backoffLimit) after a pod's image could not run the supervisor, and
# the status field that, from then on, builds the job's pods without it.
SUPERVISOR_NOT_STARTED: Final = "SupervisorNotStarted"
UNAVAILABLE_FIELD: Final = supervisor.UNAVAILABLE_FIELD
RESTARTED_REASON: Final = "RestartedInPlace"
# The causes whose restart may keep the pods: the processes failed or stalled. A disruption took a pod
# away, a scheduling timeout and a resize must free or rebuild them.
IN_PLACE_CAUSES: Final = (Cause.FAILURE, Cause.STALL)
FREEING_CAUSES: Final[Mapping[Cause | None, str]] = {
    Cause.DISRUPTION: "a disruption took a pod away",
    Cause.SCHEDULING: "the gang could not be scheduled, so its pods are released",
    None: "the gang is resized",
}


@dataclass(frozen=True)
class RecreatePods:
    """The in-place restart cannot go on (`reason`): delete the gang's pods and create them again."""

    STEP: ClassVar = False
    reason: str


@dataclass(frozen=True)
class NextAttemptInPlace:
    """Every rank stopped and the backoff has passed: order the next attempt's processes started."""

    STEP: ClassVar = True


@dataclass(frozen=True)
class Hold:
    """Nothing to do until the ranks answer or the backoff passes; `message` for the status (None: keep
    the Restarting condition's)."""

    message: str | None


@dataclass(frozen=True)
class Order:
    """status.inPlaceRestart: the operator's latest order to the supervisors."""

    attempt: int
    phase: str
    since: datetime | None
    resume_from: str | None = None


def asked(facts: Facts) -> bool:
    return facts.spec.failure_policy.restart_strategy == IN_PLACE


def order(status: Mapping[str, Any]) -> Order | None:
    """The order in the status, None when there is none or it is not readable."""
    raw = status.get(FIELD)
    if not isinstance(raw, Mapping) or raw.get("phase") not in (STOPPING, STARTING):
        return None
    attempt, since, resume = raw.get("attempt"), raw.get("since"), raw.get("resumeFrom")
    if type(attempt) is not int:
        return None
    try:
        when = parse_time(str(since)) if since else None
    except ValueError:
        when = None
    return Order(attempt, str(raw["phase"]), when, str(resume) if resume else None)


def stopping(status: Mapping[str, Any]) -> Order | None:
    """The Stopping order of the restart the status is in (for the attempt after the current one)."""
    current = order(status)
    if current is None or current.phase != STOPPING or current.attempt != attempt_of(status) + 1:
        return None
    return current


def starting(status: Mapping[str, Any]) -> Order | None:
    """The Starting order of the current attempt, if it was started in place."""
    current = order(status)
    if current is None or current.phase != STARTING or current.attempt != attempt_of(status):
        return None
    return current


def order_json(attempt: int, phase: str, stamp: str, resume_from: str | None = None) -> JsonDict:
    written: JsonDict = {"attempt": attempt, "phase": phase, "since": stamp}
    if resume_from:
        written["resumeFrom"] = resume_from
    return written


# ---------------------------------------------------------------------------- what keeps the pods


def _training_pods(gang: Gang) -> Iterator[tuple[int, JsonDict | None]]:
    for slot in gang.replicas.training:
        yield slot, gang.ranks.get(slot)


def _name(facts: Facts, slot: int) -> str:
    return pod_name(facts.job, slot)


def _container_running(pod: Mapping[str, Any]) -> bool:
    trainer = podstate.trainer_status(pod) or {}
    return "running" in (trainer.get("state") or {})


def _gang_blocker(facts: Facts, gang: Gang) -> str | None:
    """Why the gang's pods cannot be kept, looking at the spec and the pods alone; None when every rank
    of the training cluster has a live pod whose supervisor runs and has reported."""
    if not asked(facts):
        return "spec.failurePolicy.restartStrategy is no longer InPlace"
    if facts.trainer_reports_withheld:
        return (
            f"the trainers may not report or watch their job while the admission policy {TRAINER_POLICY} "
            "is missing"
        )
    why = (
        unsupported(facts.spec)
        or unavailable(facts)
        or (f"numWorkers changed to {facts.spec.num_workers}" if gang.stale else None)
    )
    if why is not None:
        return why
    for pod in gang.terminating:
        slot = podstate.slot(pod, gang.replicas)
        if slot is not None and slot in gang.replicas.training:
            return f"pod {pod['metadata']['name']} is being deleted"
    disrupted = next((failure for failure in gang.failures if failure.disruption), None)
    if disrupted is not None:
        return disrupted.describe()
    return next(
        (why for slot, pod in _training_pods(gang) if (why := _rank_blocker(_name(facts, slot), pod))), None
    )


def _rank_blocker(name: str, pod: JsonDict | None) -> str | None:
    if pod is None:
        return f"pod {name} is missing"
    if not _container_running(pod):
        return f"the {CONTAINER_NAME} container of pod {name} is not running (its supervisor ended)"
    report = podstate.run(pod)
    if report is None:
        return f"pod {name} has no {RUN_ANNOTATION} annotation (its supervisor never reported)"
    if report.state == "Exited" and report.exit_code == 0:
        return f"the training process of pod {name} completed"
    return None


def blocker(facts: Facts, gang: Gang, cause: Cause | None) -> str | None:
    """Why a restart of `cause` of a job that asked for InPlace recreates the pods; None: it may keep
    them."""
    if cause in IN_PLACE_CAUSES:
        return _gang_blocker(facts, gang)
    return unsupported(facts.spec) or unavailable(facts) or FREEING_CAUSES[cause]


# ----------------------------------------------------------------------------- how far they got


def _stop_deadline(facts: Facts, since: datetime) -> datetime:
    return since + timedelta(seconds=termination_grace_seconds(facts.job) + IN_PLACE_STOP_MARGIN_SECONDS)


def _not_stopped(facts: Facts, gang: Gang, target: int) -> list[str]:
    """The ranks whose supervisor has not reported its process Exited for an attempt before `target`."""
    waiting = []
    for slot, pod in _training_pods(gang):
        report = podstate.run(pod) if pod is not None else None
        if report is None or report.state != "Exited" or report.attempt >= target:
            waiting.append(_name(facts, slot))
    return waiting


def not_started(facts: Facts, status: Mapping[str, Any], gang: Gang) -> list[int]:
    """The training slots whose process does not run the current attempt yet, while the attempt is being
    started in place (empty otherwise)."""
    current = starting(status)
    if current is None:
        return []
    return [
        slot
        for slot, pod in _training_pods(gang)
        if pod is None or (podstate.attempt(pod) or 0) < current.attempt
    ]


def starting_message(facts: Facts, status: Mapping[str, Any], gang: Gang) -> str | None:
    """What the status says while the current attempt's processes start in place (the same until every
    rank runs it, so the ranks' reports cost no status write); None when none is starting."""
    current = starting(status)
    if current is None or not not_started(facts, status, gang):
        return None
    message = f"restarting the training processes in place for attempt {current.attempt}"
    return message + (f", resuming from {current.resume_from}" if current.resume_from else "")


def stopping_step(
    facts: Facts, status: Mapping[str, Any], gang: Gang
) -> RecreatePods | NextAttemptInPlace | Hold | None:
    """The restart's next step while the ranks stop in place; None when no in-place stop is under way."""
    current = stopping(status)
    if current is None:
        return None
    why = _gang_blocker(facts, gang)
    if why is not None:
        return RecreatePods(why)
    waiting = _not_stopped(facts, gang, current.attempt)
    if waiting:
        since = current.since or facts.now
        if facts.now >= _stop_deadline(facts, since):
            return RecreatePods(
                f"pod {waiting[0]} did not report its training process stopped within "
                f"{termination_grace_seconds(facts.job) + IN_PLACE_STOP_MARGIN_SECONDS}s"
                + (f" (and {len(waiting) - 1} more pod(s))" if len(waiting) > 1 else "")
            )
        return Hold(None)  # the Restarting condition's message stands: no write while they stop
    restart_at = status.get("restartAt")
    if restart_at and parse_time(restart_at) > facts.now:
        return Hold(None)
    return NextAttemptInPlace()


def starting_step(facts: Facts, status: Mapping[str, Any], gang: Gang) -> RecreatePods | None:
    """A fallback while the current attempt is started in place: a rank's pod lost or its supervisor gone,
    or a rank that has not started its process within IN_PLACE_START_SECONDS."""
    current = starting(status)
    laggards = not_started(facts, status, gang)
    if current is None or not laggards:
        return None
    why = _gang_blocker(facts, gang)
    if why is not None:
        return RecreatePods(why)
    since = current.since or facts.now
    if facts.now >= since + timedelta(seconds=IN_PLACE_START_SECONDS):
        name = _name(facts, laggards[0])
        more = f" (and {len(laggards) - 1} more pod(s))" if len(laggards) > 1 else ""
        return RecreatePods(
            f"pod {name} did not report attempt {current.attempt} running within "
            f"{IN_PLACE_START_SECONDS}s{more}"
        )
    return None


def deadlines(facts: Facts, status: Mapping[str, Any], gang: Gang) -> Iterator[float]:
    """Seconds until an in-place restart's deadline, while ranks have not answered its order."""
    current = stopping(status)
    if current is not None and current.since is not None and _not_stopped(facts, gang, current.attempt):
        yield (_stop_deadline(facts, current.since) - facts.now).total_seconds()
    current = starting(status)
    if current is not None and current.since is not None and not_started(facts, status, gang):
        yield (current.since + timedelta(seconds=IN_PLACE_START_SECONDS) - facts.now).total_seconds()


def supervisor_not_started(gang: Gang) -> str | None:
    """Why the job's image cannot run the supervisor: a rank's trainer container, started under the
    supervisor, failed before the supervisor ever reported (no python3 on the image's PATH, one too
    old); None when there is no such rank. Its restart then builds the pods without the supervisor."""
    pods = {str(pod["metadata"]["name"]): pod for pod in gang.all_pods}
    for failure in gang.failures:
        pod = pods.get(failure.pod)
        if pod is None or failure.disruption or failure.reason == "OOMKilled" or not failure.exit_code:
            continue
        if podstate.run(pod) is None and runs_supervisor(pod):
            return (
                f"the supervisor did not start in pod {failure.pod} ({failure.describe()}): an in-place "
                "restart needs python3, 3.9 or later, on the image's PATH, so the job's pods now run its "
                "command directly and its restarts recreate them"
            )
    return None


def unavailable(facts: Facts) -> str | None:
    """Why this job's restarts recreate its pods although it asks for InPlace and could (its image
    cannot run the supervisor: status.inPlaceUnavailable), or None."""
    status = facts.job.manifest.get("status") or {}
    why = status.get(UNAVAILABLE_FIELD)
    return str(why) if why else None


def still_holding(gang: Gang) -> list[JsonDict]:
    """The pods a failed job stops (gang.holding) but those whose supervisor reported its process failed:
    it ends its container by itself once the job is Failed, and the pod is kept, with its logs, as a
    failed pod is."""
    return [pod for pod in gang.holding if not _failed_run(pod)]


def _failed_run(pod: Mapping[str, Any]) -> bool:
    report = podstate.run(pod)
    return report is not None and report.state == "Exited" and bool(report.exit_code)


def run_failures(facts: Facts, status: Mapping[str, Any], gang: Gang) -> list[PodFailure]:
    """Ranks whose supervisor reports the current attempt's process Exited with a non-zero code, while
    the container runs on (waiting for the operator's order): failures of the attempt, judged by their
    exit codes as a terminated container's would be."""
    attempt = attempt_of(status)
    found = []
    for slot, pod in _training_pods(gang):
        report = podstate.run(pod) if pod is not None else None
        if pod is None or report is None or report.state != "Exited" or not report.exit_code:
            continue
        if report.attempt != attempt or not _container_running(pod):
            continue  # another attempt's, or the container's own end (gang.failures has it)
        found.append(
            PodFailure(
                _name(facts, slot),
                podstate.replica_index(pod),
                CONTAINER_NAME,
                report.exit_code,
                "Error",
                f"the training process of attempt {attempt} exited with code {report.exit_code}",
                disruption=False,
            )
        )
    return found
