"""Time arithmetic that cannot overflow, and the time a job must be looked at again.

Spec durations have no upper bound the operator can rely on (a schema that allowed them may have
stored them), so adding one to a time saturates at the last second RFC 3339 can write, and a wake-up
further away than a day is asked for in a day: the work queue's timers stay small, and a reconcile
then simply finds nothing due yet.

`wake_up` lists every timer a job can be waiting on; the plan's requeue is the earliest of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from controller.planner import conditions as cond
from controller.planner import podstate
from controller.runtime.clock import parse_time
from crd.contract import FINISHED_STATES, Condition, State

if TYPE_CHECKING:
    from controller.planner.facts import Facts
    from controller.planner.gang import Gang

# The last second a Kubernetes time (RFC 3339, four-digit year) can name.
LATEST: Final = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
MAX_WAKE_UP_SECONDS: Final = 24 * 3600.0
MIN_WAKE_UP_SECONDS: Final = 0.05


def ceil_to_second(moment: datetime) -> datetime:
    return moment if moment.microsecond == 0 else later(moment.replace(microsecond=0), 1)


def later(moment: datetime, seconds: float) -> datetime:
    """`moment` plus `seconds` (non-negative), or LATEST when that is past it."""
    if not seconds > 0:
        return moment
    if seconds >= (LATEST - moment).total_seconds():
        return LATEST
    return moment + timedelta(seconds=seconds)


def wake_up(
    facts: Facts,
    status: Mapping[str, Any],
    gang: Gang,
    progress_retry: float | None,
    others: Iterable[float] = (),
) -> float | None:
    """Seconds until the earliest timer of the job as planned (None: nothing to wait for); `others`:
    timers kept elsewhere (an in-place restart's deadlines, planner/inplace.py)."""
    # A timer at or past zero has fired: what it waited for was decided in this plan.
    found = [*_timers(facts, status, gang, progress_retry), *others]
    timers = [seconds for seconds in found if seconds and seconds > 0]
    if not timers:
        return None
    return min(max(min(timers), MIN_WAKE_UP_SECONDS), MAX_WAKE_UP_SECONDS)


def _timers(
    facts: Facts, status: Mapping[str, Any], gang: Gang, progress_retry: float | None
) -> Iterator[float | None]:
    yield from _stuck_pods(facts, gang)
    state = status.get("state")
    if state in FINISHED_STATES:
        yield _ttl(facts, status)
        return
    if state in (State.SUSPENDED, State.QUEUED):
        return  # nothing runs: what happens next is the user's or Kueue's to say
    yield _deadline(facts, status)
    restart_at = status.get("restartAt")
    if restart_at:
        yield (parse_time(restart_at) - facts.now).total_seconds()
        return
    yield progress_retry
    if gang.to_create(status):
        return
    yield from _lost_nodes(facts, gang)
    yield _schedule_timeout(facts, status, gang)
    if state == State.RUNNING and progress_retry is None:
        yield _stall(facts, status)


def _stuck_pods(facts: Facts, gang: Gang) -> Iterator[float]:
    """Pods stuck terminating on a lost node are force-deleted after Settings.force_delete_after."""
    for pod in stuck_terminating(facts, gang):
        yield facts.settings.force_delete_after - terminating_for(facts, pod)


def stuck_terminating(facts: Facts, gang: Gang) -> list[Any]:
    """Terminating pods on a lost node: no kubelet will ever confirm their deletion."""
    observed = facts.observed
    if not observed.nodes_known:
        return []
    return [
        pod
        for pod in gang.terminating
        if podstate.node_name(pod)
        and podstate.deletion_time(pod) is not None
        and podstate.node_is_lost(observed.nodes.get(str(podstate.node_name(pod))))
    ]


def terminating_for(facts: Facts, pod: Mapping[str, Any]) -> float:
    """Seconds since the pod was asked to go (its grace period included)."""
    since = podstate.deletion_time(pod)
    grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
    return (facts.now - since).total_seconds() + grace if since else 0.0


def ttl_expires(facts: Facts, status: Mapping[str, Any]) -> datetime | None:
    ttl = facts.spec.ttl_seconds_after_finished
    finished_at = status.get("completionTime")
    if ttl is None or not finished_at:
        return None
    return later(parse_time(finished_at), ttl)


def _ttl(facts: Facts, status: Mapping[str, Any]) -> float | None:
    expires = ttl_expires(facts, status)
    if expires is None or facts.now >= expires:
        return None
    return (expires - facts.now).total_seconds()


def active_seconds(facts: Facts, status: Mapping[str, Any]) -> float:
    """Seconds counted against activeDeadlineSeconds: time not suspended since the job started."""
    total = float(status.get("activeSeconds") or 0)
    since = status.get("runningSince")
    if since:
        total += facts.elapsed(since)
    return total


def _deadline(facts: Facts, status: Mapping[str, Any]) -> float | None:
    limit = facts.spec.failure_policy.active_deadline_seconds
    if not limit or not status.get("runningSince"):
        return None
    return limit - active_seconds(facts, status)


def _lost_nodes(facts: Facts, gang: Gang) -> Iterator[float | None]:
    """A NotReady node under the gang counts as lost Settings.node_lost_after after it turned so."""
    observed = facts.observed
    if not observed.nodes_known:
        return
    for pod in gang.ranks.values():
        node = podstate.node_name(pod)
        if node:
            yield (
                podstate.node_lost_in(observed.nodes.get(node), facts.now, facts.settings.node_lost_after)
                or None
            )


def scheduling_wait(facts: Facts, status: Mapping[str, Any], gang: Gang) -> float | None:
    """Seconds the current attempt has waited for a scheduler, when scheduleTimeoutSeconds applies (to
    an elastic job only while fewer than minWorkers are placed: it trains without the others)."""
    started = status.get("attemptStartTime")
    if not facts.spec.scheduling.schedule_timeout_seconds or not gang.unscheduled or not started:
        return None
    elastic = facts.spec.elastic
    if elastic is not None and len(gang.ranks) - len(gang.unscheduled) >= elastic.min_workers:
        return None
    return facts.elapsed(started)


def _schedule_timeout(facts: Facts, status: Mapping[str, Any], gang: Gang) -> float | None:
    waited = scheduling_wait(facts, status, gang)
    timeout = facts.spec.scheduling.schedule_timeout_seconds
    return None if waited is None or timeout is None else timeout - waited


def quiet_seconds(facts: Facts, status: Mapping[str, Any]) -> float:
    """Seconds without progress: since the last report, since the gang last started running, or since
    the trainers got back the right to report (planner/guards.py)."""
    running = cond.get(status.get("conditions"), Condition.RUNNING)
    since = (
        [parse_time(str(running["lastTransitionTime"]))]
        if running and running.get("lastTransitionTime")
        else [facts.now]
    )
    if status.get("lastProgressTime"):
        since.append(parse_time(status["lastProgressTime"]))
    reporting = cond.get(status.get("conditions"), Condition.PROGRESS_REPORTING)
    if reporting is not None:
        # True: since the right came back; still False (it comes back in this very reconcile): now.
        back = reporting.get("lastTransitionTime") if reporting.get("status") == "True" else None
        since.append(parse_time(str(back)) if back else facts.now)
    return (facts.now - max(since)).total_seconds()


def _stall(facts: Facts, status: Mapping[str, Any]) -> float | None:
    monitoring = facts.spec.monitoring
    deadline = monitoring.progress_deadline_seconds
    if not deadline or facts.trainer_reports_withheld:
        return None
    if cond.is_true(status.get("conditions"), Condition.STALLED) and not monitoring.restart_on_stall:
        return None
    return deadline - quiet_seconds(facts, status)
