"""What a TrainingJob needs next: the pure decision at the heart of every reconcile.

`plan(observed, settings)` takes the job, its pods and other owned objects (from the caches), node
readiness and the time, and returns the status the job should have and the writes that get the
cluster there. It performs no I/O, so every rule (gang restarts with backoff, failure
classification, deadlines, suspend/resume, TTL, clean-up, scheduling timeout, progress, success
policy) is tested by calling it directly.

The state machine, and the conditions kept beside it:

    Pending -> Initializing -> Running -> Completed
       ^            |            |
       +-- Restarting <----------+ (retryable failure, disruption, schedule timeout, stall, resize)
    any -> Suspended -> Pending;  any -> Failed (permanent failure, limits, deadline, invalid spec)

The reconciler writes the planned status first and then the objects: a crash in between leaves a
status that the next reconcile completes. The `Created` condition is False while the current
attempt's pods are being created and True once all exist; a rank that goes missing after that was
deleted by someone else and breaks the gang.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from builders.names import pod_name
from builders.podgroup import GangScheduler
from builders.pods import build_pod
from controller import conditions as cond
from controller import podstate
from controller.failures import Cause, PodFailure, Verdict, restart_delay, verdict
from controller.gang import GangView, observe, root_cause
from controller.progress import apply_report, parse_report, success_reached
from controller.runtime import boundedjson
from controller.runtime.clock import parse_time, rfc3339
from controller.supporting import Patch, desired_objects, reconcile_objects
from crd.contract import PROGRESS_ANNOTATION
from crd.spec import parse
from crd.validation import validate

JsonDict = dict[str, Any]

PENDING = "Pending"
INITIALIZING = "Initializing"
RUNNING = "Running"
RESTARTING = "Restarting"
SUSPENDED = "Suspended"
COMPLETED = "Completed"
FAILED = "Failed"
FINISHED = (COMPLETED, FAILED)


@dataclass(frozen=True)
class Settings:
    """Operator-wide knobs (flags), as opposed to per-job spec fields."""

    force_delete_after: float = 60.0
    progress_min_interval: float = 5.0
    # A NotReady node counts as lost (its pods' gang restarts) this long after it turned NotReady.
    node_lost_after: float = 30.0


@dataclass(frozen=True)
class Observed:
    job: JsonDict
    pods: Sequence[JsonDict]
    owned: Mapping[tuple[str, str], JsonDict]
    nodes: Mapping[str, JsonDict]
    now: datetime
    nodes_known: bool = True
    gang: GangScheduler | None = None
    # Last states of the job's pods deleted recently that ended with a disruption or a failure.
    vanished: Sequence[JsonDict] = ()


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str
    uid: str
    reason: str
    force: bool = False


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Plan:
    status: JsonDict
    creates: list[JsonDict] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.05)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


def ceil_to_second(moment: datetime) -> datetime:
    return moment if moment.microsecond == 0 else moment.replace(microsecond=0) + timedelta(seconds=1)


def format_duration(seconds: float) -> str:
    remaining = max(0, int(seconds))
    hours, remaining = divmod(remaining, 3600)
    minutes, secs = divmod(remaining, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


class _Planner:
    """One reconcile's worth of decisions; a class only to share the job, clock and plan between steps."""

    def __init__(self, observed: Observed, settings: Settings) -> None:
        self.observed = observed
        self.settings = settings
        self.job = observed.job
        self.typed = parse(observed.job)
        self.spec: JsonDict = observed.job["spec"]
        self.uid = str(observed.job["metadata"].get("uid", ""))
        self.generation = observed.job["metadata"].get("generation")
        self.now = observed.now
        # Second precision, rounded up: a time written now and read back later must never make a timer
        # (backoff, deadline, schedule timeout, stall, TTL) fire early.
        self.stamp = rfc3339(ceil_to_second(observed.now))
        self.status: JsonDict = copy.deepcopy(observed.job.get("status") or {})
        self.plan = Plan(status=self.status)
        self.view = self.observe_gang()
        # Rank 0 reported something new that the progress rate limit keeps out of status for now.
        self.report_deferred = False

    # ------------------------------------------------------------------------------------- helpers

    def observe_gang(self) -> GangView:
        """The gang of the current attempt (deleted pods of earlier attempts explain nothing about it)."""
        observed = self.observed
        return observe(
            observed.pods,
            int(self.spec["numWorkers"]),
            observed.nodes,
            observed.nodes_known,
            now=observed.now,
            node_grace=self.settings.node_lost_after,
            vanished=observed.vanished,
            attempt=int(self.status.get("attempt", 0)),
        )

    @property
    def state(self) -> str | None:
        state = self.status.get("state")
        return str(state) if state else None

    def conditions(self) -> list[JsonDict]:
        return list(self.status.get("conditions") or [])

    def set_condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        self.status["conditions"] = cond.set_condition(
            self.conditions(),
            type_,
            status,
            reason=reason,
            message=message,
            now=self.stamp,
            generation=self.generation,
        )

    def clear_condition(self, type_: str, reason: str, message: str) -> None:
        self.status["conditions"] = cond.clear(
            self.conditions(),
            type_,
            reason=reason,
            message=message,
            now=self.stamp,
            generation=self.generation,
        )

    def transition(self, state: str, message: str, reason: str, warning: bool = False) -> None:
        """Moves to `state` (an Event when it changes) and sets the one-line status message."""
        if self.state != state:
            self.plan.events.append(Event("Warning" if warning else "Normal", reason, f"{state}: {message}"))
        self.status["state"] = state
        self.status["message"] = message

    def delete_pods(self, pods: Sequence[JsonDict], reason: str) -> None:
        planned = {delete.uid for delete in self.plan.deletes}
        for pod in pods:
            meta = pod["metadata"]
            if meta["uid"] not in planned:
                self.plan.deletes.append(Delete("Pod", meta["name"], meta["uid"], reason))

    def elapsed_active(self) -> float:
        """Seconds counted against activeDeadlineSeconds: time not suspended since the job started."""
        total = float(self.status.get("activeSeconds") or 0)
        since = self.status.get("runningSince")
        if since:
            total += (self.now - parse_time(since)).total_seconds()
        return total

    def pause_deadline_clock(self) -> None:
        since = self.status.pop("runningSince", None)
        if since:
            elapsed = (self.now - parse_time(since)).total_seconds()
            self.status["activeSeconds"] = int(float(self.status.get("activeSeconds") or 0) + elapsed)

    def resume_from(self) -> str | None:
        latest = (self.status.get("checkpoint") or {}).get("latest")
        if latest:
            return str(latest)
        configured = (self.spec.get("checkpoint") or {}).get("resumeFrom")
        return str(configured) if configured else None

    @staticmethod
    def holding(pods: Sequence[JsonDict]) -> list[JsonDict]:
        """The pods still running or about to (they hold nodes and GPUs); finished ones are kept for
        inspection unless cleanPodPolicy says otherwise."""
        return [pod for pod in pods if podstate.phase(pod) in ("Pending", "Running", "Unknown")]

    def gpus(self, pods: int) -> int:
        return pods * int(self.spec.get("gpusPerWorker") or 0)

    def update_allocation(self) -> None:
        holding = [pod for pod in self.view.all_pods if podstate.phase(pod) in ("Pending", "Running")]
        self.status["resources"] = {"gpus": self.gpus(len(holding)), "workers": len(holding)}

    # ---------------------------------------------------------------------------------- the steps

    def run(self) -> Plan:
        if self.generation is not None:
            self.status["observedGeneration"] = self.generation
        if self.state in FINISHED:
            self.finished()
            return self.plan
        errors = [*too_deep(self.spec), *validate(self.job)]
        if errors:
            listed = "; ".join(str(error) for error in errors[:10])
            self.fail("InvalidSpec", f"invalid spec: {listed}", self.view.all_pods)
            return self.plan
        if not self.state and not self.spec.get("suspend"):
            self.transition(PENDING, "creating the job's resources", "Pending")
            self.set_condition(cond.CREATED, False, "Creating", "creating the job's resources")
        self.supporting_objects()
        if self.deadline_exceeded():
            return self.plan
        if self.spec.get("suspend"):
            self.suspend()
            return self.plan
        if self.state == SUSPENDED:
            self.resume()
        self.force_delete_stuck_pods()
        if (self.status.get("restartAt") or self.state == RESTARTING) and self.restart_in_progress():
            self.update_allocation()
            return self.plan
        self.attempt()
        self.update_allocation()
        return self.plan

    def supporting_objects(self) -> None:
        creates, patches = reconcile_objects(
            desired_objects(self.typed, self.observed.gang), self.observed.owned
        )
        self.plan.creates.extend(creates)
        self.plan.patches.extend(patches)

    def finished(self) -> None:
        """Completed or Failed: release pods per cleanPodPolicy, then wait out ttlSecondsAfterFinished."""
        policy = self.spec.get("cleanPodPolicy", "Running")
        if policy == "All":
            self.delete_pods(self.view.live, f"job {self.state}; cleanPodPolicy All")
        elif policy == "Running":
            self.delete_pods(self.holding(self.view.live), f"job {self.state}; cleanPodPolicy Running")
        self.force_delete_stuck_pods()
        # status.workers (the Workers column) follows the pods as they are released, like resources:
        # a finished job whose stopped workers are gone must not show them running.
        self.status["workers"] = self.view.workers()
        self.update_allocation()
        ttl = self.spec.get("ttlSecondsAfterFinished")
        finished_at = self.status.get("completionTime")
        if ttl is None or not finished_at:
            return
        expires = parse_time(finished_at) + timedelta(seconds=int(ttl))
        if self.now >= expires:
            self.plan.delete_job = True
            self.plan.events.append(
                Event("Normal", "TTLExpired", f"deleting the job {ttl}s after it finished")
            )
        else:
            self.plan.requeue((expires - self.now).total_seconds())

    def finish(self, state: str, reason: str, message: str, stop: Sequence[JsonDict]) -> None:
        failed = state == FAILED
        self.transition(state, message, reason, warning=failed)
        self.status["completionTime"] = self.stamp
        started = self.status.get("startTime")
        if started:
            self.status["duration"] = format_duration((self.now - parse_time(started)).total_seconds())
        self.pause_deadline_clock()
        self.status.pop("restartAt", None)
        if failed:
            self.status["failureReason"] = reason
            self.set_condition(cond.FAILED, True, reason, message)
        else:
            self.set_condition(cond.SUCCEEDED, True, reason, message)
        self.set_condition(cond.RUNNING, False, reason, message)
        self.clear_condition(cond.RESTARTING, reason, message)
        self.clear_condition(cond.STALLED, reason, f"the job is {state}")
        self.status["workers"] = self.view.workers()
        self.delete_pods(stop, f"job {state}: {reason}")
        self.finished()

    def fail(self, reason: str, message: str, stop: Sequence[JsonDict], *, force_stop: bool = False) -> None:
        """Fails the job, stopping `stop`, unless cleanPodPolicy None asks to keep every pod as it is (to
        inspect a hung collective); `force_stop` (the deadline) stops them regardless."""
        if self.spec.get("cleanPodPolicy") == "None" and not force_stop:
            stop = []
        self.finish(FAILED, reason, message, stop)

    def deadline_exceeded(self) -> bool:
        limit = (self.spec.get("failurePolicy") or {}).get("activeDeadlineSeconds")
        if not limit or not self.status.get("startTime"):
            return False
        elapsed = self.elapsed_active()
        if elapsed < int(limit):
            if self.status.get("runningSince"):
                self.plan.requeue(int(limit) - elapsed)
            return False
        self.fail(
            "DeadlineExceeded",
            f"the job was active for {format_duration(elapsed)}, longer than "
            f"failurePolicy.activeDeadlineSeconds ({limit}s)",
            self.view.all_pods,
            force_stop=True,
        )
        return True

    def suspend(self) -> None:
        if self.state != SUSPENDED:
            self.pause_deadline_clock()
            self.set_condition(cond.SUSPENDED, True, "Suspended", "spec.suspend is true")
            self.set_condition(cond.RUNNING, False, "Suspended", "spec.suspend is true")
        self.status.pop("restartAt", None)
        self.clear_condition(cond.RESTARTING, "Suspended", "spec.suspend is true")
        live = self.view.live
        self.delete_pods(live, "job suspended")
        remaining = len(live) + len(self.view.terminating)
        message = "suspended" if not remaining else f"suspending: {remaining} pod(s) still terminating"
        self.transition(SUSPENDED, message, "Suspended")
        self.status["workers"] = self.view.workers()
        self.force_delete_stuck_pods()
        self.update_allocation()

    def resume(self) -> None:
        self.set_condition(cond.SUSPENDED, False, "Resumed", "spec.suspend is false")
        self.set_condition(cond.CREATED, False, "Resuming", "recreating the gang after suspension")
        if self.status.get("startTime"):
            # A job that ran before resumes with a new attempt; one suspended from creation starts at 0.
            self.status["runningSince"] = self.stamp
            self.status["attempt"] = int(self.status.get("attempt", 0)) + 1
            self.status.pop("attemptStartTime", None)
            self.view = self.observe_gang()
        self.transition(
            PENDING, "resuming from the latest checkpoint" if self.resume_from() else "resuming", "Resumed"
        )

    def force_delete_stuck_pods(self) -> None:
        """Pods whose node died never finish terminating (no kubelet confirms it); after a grace period
        they are force-deleted so the gang can restart."""
        for pod in self.view.terminating:
            node = podstate.node_name(pod)
            since = podstate.deletion_time(pod)
            if not node or since is None or not self.observed.nodes_known:
                continue
            if not podstate.node_is_lost(self.observed.nodes.get(node)):
                continue
            grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
            waited = (self.now - since).total_seconds() + grace
            if waited >= self.settings.force_delete_after:
                meta = pod["metadata"]
                self.plan.deletes.append(
                    Delete(
                        "Pod", meta["name"], meta["uid"], f"stuck terminating on lost node {node}", force=True
                    )
                )
            else:
                self.plan.requeue(self.settings.force_delete_after - waited)

    # ----------------------------------------------------------------------------------- restarts

    def start_restart(self, cause: Cause | None, reason: str, message: str) -> None:
        """Tears the whole gang down; the next attempt starts after the backoff delay and once every
        old pod is gone. `cause` None (a resize) restarts at once and counts toward no limit."""
        restarts = dict(self.status.get("restarts") or {})
        delay = 0.0
        if cause is not None:
            previous = int(restarts.get(cause.value, 0))
            restarts[cause.value] = previous + 1
            backoff = (self.spec.get("failurePolicy") or {}).get("restartBackoff") or {}
            delay = restart_delay(backoff, previous, f"{self.uid}/{self.status.get('restartCount', 0)}")
        self.status["restarts"] = restarts
        self.status["restartCount"] = int(self.status.get("restartCount", 0)) + 1
        self.status["lastRestartReason"] = reason
        # Kubernetes times have whole seconds: round up so the restart never comes before the delay.
        restart_at = self.now + timedelta(seconds=delay)
        if restart_at.microsecond:
            restart_at = restart_at.replace(microsecond=0) + timedelta(seconds=1)
        self.status["restartAt"] = rfc3339(restart_at)
        text = f"{message}; restarting the whole gang in {format_duration(delay)}"
        self.set_condition(cond.RESTARTING, True, reason, text)
        self.set_condition(cond.RUNNING, False, "Restarting", text)
        self.set_condition(cond.CREATED, False, "Restarting", "waiting for the previous attempt's pods to go")
        self.status["workers"] = self.view.workers()
        self.transition(RESTARTING, text, reason, warning=True)
        self.delete_pods(self.view.live, f"gang restart: {reason}")
        self.plan.requeue((restart_at - self.now).total_seconds())

    def restart_in_progress(self) -> bool:
        """Drives a started restart; returns True while the next attempt must still wait."""
        self.delete_pods(self.view.live, f"gang restart: {self.status.get('lastRestartReason', '')}")
        remaining = len(self.view.live) + len(self.view.terminating)
        restart_at = self.status.get("restartAt")
        wait = (parse_time(restart_at) - self.now).total_seconds() if restart_at else 0.0
        self.status["workers"] = self.view.workers()
        if remaining:
            self.status["message"] = f"waiting for {remaining} pod(s) of the previous attempt to terminate"
            return True
        if wait > 0:
            # Only the backoff delay is left: say so (the message may still name the old pods).
            restarting = cond.get(self.conditions(), cond.RESTARTING)
            if restarting and restarting.get("status") == "True":
                self.status["message"] = str(restarting.get("message") or self.status.get("message", ""))
            self.plan.requeue(wait)
            return True
        self.status.pop("restartAt", None)
        self.status["attempt"] = int(self.status.get("attempt", 0)) + 1
        self.status.pop("attemptStartTime", None)
        self.view = self.observe_gang()
        self.transition(PENDING, f"starting attempt {self.status['attempt']}", "Restarted")
        return False

    def on_failures(self, failures: Sequence[PodFailure]) -> None:
        policy = self.spec.get("failurePolicy") or {}
        pods_by_name = {pod["metadata"]["name"]: pod for pod in self.view.all_pods}
        failure = root_cause(failures, pods_by_name)
        described = failure.describe()
        judged = verdict(failure, policy)
        reason = (
            "OOMKilled"
            if failure.reason == "OOMKilled"
            else ("Disruption" if failure.disruption else "PodFailed")
        )
        restarts = self.status.get("restarts") or {}
        if judged is Verdict.PERMANENT:
            why = "restartPolicy Never" if policy.get("restartPolicy") == "Never" else "a permanent exit code"
            self.fail(
                reason if reason == "OOMKilled" else "PodFailed",
                f"{described} ({why})",
                self.holding(self.view.live),
            )
        elif judged is Verdict.DISRUPTION:
            limit = int(policy.get("maxDisruptionRestarts", 20))
            if int(restarts.get(Cause.DISRUPTION.value, 0)) >= limit:
                self.fail(
                    "DisruptionLimitExceeded",
                    f"{limit} restarts after disruptions (failurePolicy.maxDisruptionRestarts); "
                    f"last: {described}",
                    self.holding(self.view.live),
                )
            else:
                self.start_restart(Cause.DISRUPTION, failure.reason, described)
        else:
            limit = int(policy.get("backoffLimit", 3))
            used = int(restarts.get(Cause.FAILURE.value, 0)) + int(restarts.get(Cause.STALL.value, 0))
            if used >= limit:
                self.fail(
                    "BackoffLimitExceeded",
                    f"failed after {used} restart(s) (failurePolicy.backoffLimit {limit}); "
                    f"last failure: {described}",
                    self.holding(self.view.live),
                )
            else:
                self.start_restart(Cause.FAILURE, reason, described)

    # ------------------------------------------------------------------------------------ attempt

    def attempt(self) -> None:
        """The current gang: create it, watch it start, notice its end."""
        view = self.view
        self.status.setdefault("attempt", 0)
        self.status.setdefault("restartCount", 0)
        self.read_progress()
        if self.success() or self.gang_broken():
            return
        if view.out_of_range:
            self.delete_pods(view.out_of_range, "replica index out of range")
        if view.missing:
            self.fill_gang(view.missing)
            return
        if not cond.is_true(self.conditions(), cond.CREATED):
            self.set_condition(
                cond.CREATED,
                True,
                "PodsCreated",
                f"{view.num_workers} pod(s) of attempt {self.status['attempt']} created",
            )
        self.wait_for_unready_nodes()
        if not self.schedule_timeout():
            self.report_progress_state()

    def gang_broken(self) -> bool:
        """A failed rank, a world size that changed, or a rank deleted after the gang formed: the
        whole gang restarts (or the job fails). True when that was decided."""
        view = self.view
        if view.failures:
            self.on_failures(view.failures)
            return True
        if view.stale:
            self.start_restart(None, "Resized", f"numWorkers changed to {view.num_workers}")
            return True
        if view.missing and view.formed and cond.is_true(self.conditions(), cond.CREATED):
            names = ", ".join(pod_name(self.typed, index) for index in view.missing)
            self.start_restart(Cause.DISRUPTION, "PodDeleted", f"pod(s) {names} disappeared")
            return True
        return False

    def fill_gang(self, missing: Sequence[int]) -> None:
        """Creates the missing ranks, once no pod of the same name is still terminating."""
        if self.view.terminating:
            self.status["message"] = (
                f"waiting for {len(self.view.terminating)} pod(s) of a previous attempt to terminate"
            )
            self.status["workers"] = self.view.workers()
            return
        self.create_gang(missing)

    def wait_for_unready_nodes(self) -> None:
        """Looks again when a NotReady node under the gang would count as lost (Settings.node_lost_after)."""
        if not self.observed.nodes_known:
            return
        for pod in self.view.ranks.values():
            node = podstate.node_name(pod)
            if node:
                remaining = podstate.node_lost_in(
                    self.observed.nodes.get(node), self.now, self.settings.node_lost_after
                )
                if remaining:
                    self.plan.requeue(remaining)

    def create_gang(self, missing: Sequence[int]) -> None:
        attempt = int(self.status.get("attempt", 0))
        resume = self.resume_from()
        for index in missing:
            self.plan.creates.append(
                build_pod(self.typed, index, attempt=attempt, resume_from=resume, gang=self.observed.gang)
            )
        if not self.status.get("startTime"):
            self.status["startTime"] = self.stamp
            self.status["runningSince"] = self.stamp
        # Stamped once per attempt (cleared when the next one begins), not on every retry of a create
        # that failed: that would rewrite status on each retry and restart the schedule timeout.
        self.status.setdefault("attemptStartTime", self.stamp)
        message = f"creating {len(missing)} pod(s) for attempt {attempt}"
        if resume:
            message += f", resuming from {resume}"
        self.set_condition(cond.CREATED, False, "Creating", message)
        self.clear_condition(cond.RESTARTING, "GangRestarted", f"attempt {attempt} started")
        self.clear_condition(cond.STALLED, "GangRestarted", f"attempt {attempt} started")
        self.status["workers"] = self.view.workers()
        self.transition(PENDING, message, "Creating")

    def schedule_timeout(self) -> bool:
        timeout = (self.spec.get("scheduling") or {}).get("scheduleTimeoutSeconds")
        unscheduled = self.view.unscheduled
        started = self.status.get("attemptStartTime")
        if not timeout or not unscheduled or not started:
            return False
        waited = (self.now - parse_time(started)).total_seconds()
        if waited < int(timeout):
            self.plan.requeue(int(timeout) - waited)
            return False
        detail = self.unschedulable_summary()
        self.start_restart(
            Cause.SCHEDULING,
            "ScheduleTimeout",
            f"{detail} after {format_duration(waited)} (scheduling.scheduleTimeoutSeconds "
            f"{timeout}); releasing all pods",
        )
        return True

    def unschedulable_summary(self) -> str:
        unscheduled = self.view.unscheduled
        messages = [podstate.unschedulable_message(pod) for pod in unscheduled]
        known = [message for message in messages if message]
        total = self.view.num_workers
        if known:
            return f"{len(unscheduled)}/{total} pods unschedulable: {known[0]}"
        return f"{len(unscheduled)}/{total} pods waiting to be scheduled"

    def report_progress_state(self) -> None:
        view = self.view
        total = view.num_workers
        self.status["workers"] = view.workers()
        running = view.count("Running", "Succeeded")
        if view.unscheduled:
            message = self.unschedulable_summary()
            reason = (
                "PodsUnschedulable"
                if any(podstate.unschedulable_message(p) for p in view.unscheduled)
                else "PodsPending"
            )
            self.set_condition(cond.RUNNING, False, reason, message)
            self.transition(PENDING, message, reason)
        elif running < total:
            message = f"{running}/{total} pods running"
            self.set_condition(cond.RUNNING, False, "PodsStarting", message)
            self.transition(INITIALIZING, message, "PodsScheduled")
        else:
            message = f"{total}/{total} workers running"
            self.set_condition(cond.RUNNING, True, "AllWorkersRunning", message)
            self.transition(RUNNING, message, "Running")
            self.check_stall()

    # ------------------------------------------------------------------------ progress and success

    def read_progress(self) -> None:
        rank0 = self.view.ranks.get(0)
        if rank0 is None:
            return
        text = rank0["metadata"].get("annotations", {}).get(PROGRESS_ANNOTATION)
        report, error = parse_report(text)
        if error:
            self.plan.events.append(
                Event("Warning", "InvalidProgressReport", f"{rank0['metadata']['name']}: {error}")
            )
            return
        if report is None:
            return
        # Rank 0's last report (it has exited) is applied at once: nothing will come to flush it later.
        final = podstate.phase(rank0) in ("Succeeded", "Failed")
        interval = 0.0 if final else self.settings.progress_min_interval
        update = apply_report(self.status, report, self.spec, self.now, interval)
        if update.changed:
            self.status.clear()
            self.status.update(update.status)
            if cond.is_true(self.conditions(), cond.STALLED):
                self.set_condition(
                    cond.STALLED, False, "ProgressResumed", "the trainer reports progress again"
                )
        if update.retry_in is not None:
            self.report_deferred = True
            self.plan.requeue(update.retry_in)

    def success(self) -> bool:
        reached = success_reached(self.status, self.spec)
        if reached is not None:
            reason, message = reached
            self.finish(COMPLETED, reason, message, self.holding(self.view.live))
            return True
        view = self.view
        mode = (self.spec.get("successPolicy") or {}).get("mode", "AllWorkers")
        rank0 = view.ranks.get(0)
        if mode == "RankZero" and rank0 is not None and podstate.phase(rank0) == "Succeeded":
            # The other workers are stopped whatever cleanPodPolicy says (it keeps finished pods only).
            self.finish(COMPLETED, "RankZeroSucceeded", "rank 0 succeeded", self.holding(view.live))
            return True
        if not view.missing and view.count("Succeeded") == view.num_workers:
            self.finish(COMPLETED, "AllWorkersSucceeded", f"all {view.num_workers} workers succeeded", [])
            return True
        return False

    def check_stall(self) -> None:
        monitoring = self.spec.get("monitoring") or {}
        deadline = monitoring.get("progressDeadlineSeconds")
        if not deadline or self.report_deferred:
            # A deferred report is progress too: lastProgressTime only lags behind the rate limit
            # (--progress-interval), which may be longer than the deadline.
            return
        running = cond.get(self.conditions(), cond.RUNNING)
        since = (
            [parse_time(str(running["lastTransitionTime"]))]
            if running and running.get("lastTransitionTime")
            else [self.now]
        )
        if self.status.get("lastProgressTime"):
            since.append(parse_time(self.status["lastProgressTime"]))
        reference = max(since)
        quiet = (self.now - reference).total_seconds()
        if quiet < int(deadline):
            self.plan.requeue(int(deadline) - quiet)
            return
        if cond.is_true(self.conditions(), cond.STALLED) and not monitoring.get("restartOnStall"):
            return
        last = self.status.get("currentEpoch")
        detail = f" (last report: epoch {last})" if last is not None else " (no report yet)"
        message = (
            f"no progress reported for {format_duration(quiet)}, over "
            f"monitoring.progressDeadlineSeconds ({deadline}s){detail}"
        )
        if monitoring.get("restartOnStall"):
            restarts = self.status.get("restarts") or {}
            policy = self.spec.get("failurePolicy") or {}
            used = int(restarts.get(Cause.FAILURE.value, 0)) + int(restarts.get(Cause.STALL.value, 0))
            if used >= int(policy.get("backoffLimit", 3)):
                self.fail(
                    "BackoffLimitExceeded",
                    f"{message}; backoffLimit exhausted",
                    self.holding(self.view.live),
                )
                return
            self.set_condition(cond.STALLED, True, "ProgressDeadlineExceeded", message)
            self.start_restart(Cause.STALL, "Stalled", message)
            return
        self.plan.events.append(Event("Warning", "Stalled", message))
        self.set_condition(cond.STALLED, True, "ProgressDeadlineExceeded", message)


def too_deep(spec: JsonDict) -> list[str]:
    """Where the job's spec was cut by the bounded decoder (controller/boundedjson.py): values nested
    deeper than the operator reads, which it refuses rather than guesses at."""
    return [
        f"spec.{path}: nested deeper than {boundedjson.DEFAULT_MAX_DEPTH} levels, "
        "which the operator does not read"
        for path in boundedjson.truncated_paths(spec)
    ]


def plan(observed: Observed, settings: Settings | None = None) -> Plan:
    return _Planner(observed, settings or Settings()).run()
