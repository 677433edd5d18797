"""Reconcile one TrainingJob: read the caches, ask `lifecycle.plan` what to do, do it, record it.

This is the imperative shell around the pure planner. Its rules:

* Act only on a cache that has caught up with our own writes: pod creations and deletions are
  tracked by expectations (lowered by informer events), and a reconcile waits until the job informer
  has delivered the status we last wrote. Without that a reconcile could count one failure twice or
  re-create a pod it just made.
* Write status first (a merge patch with the read resourceVersion as precondition, only when it
  changed), then objects. A crash in between leaves a status the next reconcile completes.
* Deletes carry UID preconditions; creates of deterministic names make a second create a 409.
* Failures to create are reported on the job (an Event, a condition, a message), never raised into
  the worker pool unless they are transient. A job blocked that way is retried with the rate
  limiter's backoff, objects first and status after, so an unchanged failure writes nothing.
"""

from __future__ import annotations

import contextvars
import copy
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

from builders.podgroup import GangScheduler
from controller import conditions as cond
from controller import lifecycle
from controller.failures import Cause
from controller.metrics import Metrics, restart_reason
from controller.resources import PODS, TRAININGJOBS, resource_for
from controller.runtime import mergepatch
from controller.runtime.client import KubeClient
from controller.runtime.clock import Clock, parse_time, rfc3339
from controller.runtime.errors import AlreadyExists, Conflict, Forbidden, Invalid, KubeError, NotFound
from controller.runtime.events import EventRecorder
from controller.runtime.expectations import Expectations
from controller.runtime.store import BY_OWNER_UID, object_key
from controller.runtime.trackers import StatusWrites, Tombstones
from controller.watches import Caches
from crd.defaults import with_defaults

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Result:
    requeue_after: float | None = None
    rate_limited: bool = False


@dataclass
class _Outcome:
    """What happened while executing a plan: problems to show on the job."""

    blocked: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)


def _namespace(job: Mapping[str, Any]) -> str:
    return str(job["metadata"]["namespace"])


# Status fields the planner stamps when it creates an attempt's pods.
CREATE_STAMPS = ("startTime", "runningSince", "attemptStartTime")
FAILED_CREATE = "FailedCreate"


# Problems named in a status message; the rest are counted. Every pod of a job fails the same way
# (a missing PriorityClass, an invalid affinity), and a 100-worker job must not write 100 copies:
# status.message is limited (crd/schema_status.py), and a refused status write would leave the job
# without any explanation.
MAX_LISTED_PROBLEMS = 3
MAX_PROBLEM_TEXT = 4096


def _summary(problems: list[str]) -> str:
    """The problems sorted (pods are created concurrently: an unchanged problem must read the same),
    the first few in full, the others counted."""
    ordered = sorted(set(problems))
    text = "; ".join(ordered[:MAX_LISTED_PROBLEMS])
    if len(ordered) > MAX_LISTED_PROBLEMS:
        text += f"; and {len(ordered) - MAX_LISTED_PROBLEMS} more"
    if len(text) > MAX_PROBLEM_TEXT:
        text = text[: MAX_PROBLEM_TEXT - 3] + "..."
    return text


def _blocked(status: Mapping[str, Any]) -> bool:
    """Whether the last reconcile could not create the job's objects (Created=False, FailedCreate)."""
    created = cond.get(status.get("conditions"), cond.CREATED)
    return created is not None and created.get("status") == "False" and created.get("reason") == FAILED_CREATE


class Reconciler:
    def __init__(
        self,
        client: KubeClient,
        caches: Caches,
        *,
        expectations: Expectations,
        status_writes: StatusWrites,
        events: EventRecorder,
        metrics: Metrics,
        clock: Clock,
        executor: Executor,
        settings: lifecycle.Settings,
        tombstones: Tombstones,
    ) -> None:
        self._client = client
        self._caches = caches
        self._expectations = expectations
        self._status_writes = status_writes
        self._events = events
        self._metrics = metrics
        self._clock = clock
        self._executor = executor
        self._settings = settings
        self._tombstones = tombstones
        # Set at start-up by discovery (Manager.discover), before any reconcile.
        self.gang_scheduler: GangScheduler | None = None

    # ------------------------------------------------------------------------------------ reading

    def _owned(self, uid: str) -> dict[tuple[str, str], JsonDict]:
        owned: dict[tuple[str, str], JsonDict] = {}
        for store in self._caches.owned.values():
            for obj in store.by_index(BY_OWNER_UID, uid):
                owned[(obj["kind"], obj["metadata"]["name"])] = obj
        return owned

    def _nodes(self) -> tuple[dict[str, JsonDict], bool]:
        store = self._caches.nodes
        if store is None or not self._caches.nodes_synced():
            return {}, False
        return {node["metadata"]["name"]: node for node in store.list()}, True

    def _observe(self, job: JsonDict) -> lifecycle.Observed:
        uid = job["metadata"]["uid"]
        nodes, nodes_known = self._nodes()
        wants_gang = bool((job["spec"].get("scheduling") or {}).get("gangScheduling"))
        return lifecycle.Observed(
            job=job,
            pods=self._caches.pods.by_index(BY_OWNER_UID, uid),
            owned=self._owned(uid),
            nodes=nodes,
            nodes_known=nodes_known,
            now=self._clock.now(),
            gang=self.gang_scheduler if wants_gang else None,
            vanished=self._tombstones.recent(object_key(job)),
        )

    # ---------------------------------------------------------------------------------- reconcile

    def _ready_to_act(self, key: str) -> tuple[JsonDict | None, Result]:
        """The cached job if the cache has caught up with our own writes, else why to wait."""
        cached = self._caches.jobs.get(key)
        if cached is None:
            self._expectations.forget(key)
            self._status_writes.forget(key)
            self._tombstones.forget(key)
            logger.debug("job is gone; nothing to do")
            return None, Result()
        if not self._expectations.satisfied(key):
            pending = self._expectations.pending(key)
            logger.debug("waiting for the cache to show our pod writes", extra={"pending": repr(pending)})
            return None, Result(requeue_after=self._expectations_ttl_remaining(pending))
        if not self._status_writes.settled(key):
            logger.debug("waiting for the cache to show our last status write")
            return None, Result()
        return cached, Result()

    def reconcile(self, key: str) -> Result:
        cached, waiting = self._ready_to_act(key)
        if cached is None:
            return waiting
        job = with_defaults(copy.deepcopy(cached))
        observed = self._observe(job)
        plan = lifecycle.plan(observed, self._settings)
        if (
            observed.gang is None
            and (job["spec"].get("scheduling") or {}).get("gangScheduling")
            and not (cached.get("status") or {}).get("state")
        ):
            plan.events.append(
                lifecycle.Event(
                    "Warning",
                    "GangSchedulingUnavailable",
                    "scheduling.gangScheduling is set but neither scheduler-plugins' nor Volcano's PodGroup "
                    "CRD is installed; scheduling pods individually",
                )
            )
        old_status = cached.get("status") or {}
        if _blocked(old_status) and plan.creates and not plan.deletes:
            result = self._retry_blocked(cached, old_status, plan)
        else:
            result = self._apply(cached, old_status, plan)
        logger.debug(
            "reconciled",
            extra={
                "action": "reconciled",
                "resourceVersion": cached["metadata"].get("resourceVersion"),
                "state": (cached.get("status") or {}).get("state"),
            },
        )
        return result

    def _apply(self, cached: JsonDict, old_status: Mapping[str, Any], plan: lifecycle.Plan) -> Result:
        """The normal order: status first, then the objects."""
        written = self._write_status(cached, old_status, plan.status)
        if written is None:
            return Result()
        self._record(cached, old_status, plan)
        outcome = self._execute(cached, plan)
        if outcome.invalid or outcome.blocked:
            self._report_problems(written, plan.status, plan.status, outcome)
            return Result(rate_limited=not outcome.invalid)
        if plan.delete_job:
            self._delete_job(cached)
            return Result()
        return Result(requeue_after=plan.requeue_after)

    def _retry_blocked(self, cached: JsonDict, old_status: Mapping[str, Any], plan: lifecycle.Plan) -> Result:
        """Creates that failed last time (a missing PriorityClass, a name taken by a foreign object, a
        quota), tried again: objects first, status after.

        Writing the planned status first would turn the message back into "creating ..." on every
        retry only for the failure to turn it back again, and each of those writes is a watch event
        that re-queues the job at once, bypassing the rate limiter: a hot loop of PATCHes, POSTs and
        Events. Trying first, the status changes only when the outcome does.
        """
        outcome = self._execute(cached, plan)
        if outcome.invalid or outcome.blocked:
            base = copy.deepcopy(plan.status)
            # The planner stamps these when it creates pods; none were created, so they stay.
            for stamp in CREATE_STAMPS:
                if stamp in old_status:
                    base[stamp] = old_status[stamp]
            self._report_problems(cached, old_status, base, outcome)
            for event in plan.events:
                self._events.record(cached, event.type, event.reason, event.message)
            return Result(rate_limited=not outcome.invalid)
        logger.info(
            "the objects that could not be created before were created", extra={"action": "unblocked"}
        )
        if self._write_status(cached, old_status, plan.status) is None:
            return Result()
        self._record(cached, old_status, plan)
        return Result(requeue_after=plan.requeue_after)

    def _record(self, job: JsonDict, old_status: Mapping[str, Any], plan: lifecycle.Plan) -> None:
        self._record_transitions(job, old_status, plan.status)
        for event in plan.events:
            self._events.record(job, event.type, event.reason, event.message)

    def _expectations_ttl_remaining(self, pending: object) -> float:
        age = getattr(pending, "age_seconds", 0.0)
        return max(1.0, 300.0 - float(age))

    # ------------------------------------------------------------------------------------- status

    def _write_status(self, job: JsonDict, old: Mapping[str, Any], new: Mapping[str, Any]) -> JsonDict | None:
        """PATCHes status when it changed; returns the job as the server has it now (None if it is gone)."""
        patch = mergepatch.diff(old, new)
        if not patch:
            return job
        body = {"metadata": {"resourceVersion": job["metadata"]["resourceVersion"]}, "status": patch}
        try:
            updated = self._client.patch(
                TRAININGJOBS, _namespace(job), job["metadata"]["name"], body, subresource="status"
            )
        except NotFound:
            logger.info("job deleted while reconciling")
            return None
        except Conflict:
            logger.info("job changed since it was read; reconciling again with the fresh version")
            raise
        self._status_writes.wrote(object_key(job), str(updated["metadata"]["resourceVersion"]))
        old_state, new_state = old.get("state"), new.get("state")
        if old_state != new_state:
            logger.info(
                "state %s -> %s: %s",
                old_state or "(new)",
                new_state,
                new.get("message", ""),
                extra={"action": "transition", "from": old_state, "to": new_state},
            )
        else:
            logger.debug("status updated", extra={"fields": sorted(patch)})
        return updated

    def _report_problems(
        self, job: JsonDict, current: Mapping[str, Any], base: Mapping[str, Any], outcome: _Outcome
    ) -> None:
        """Shows create failures on the job: an invalid object fails it (InvalidSpec), anything else
        (quota, a missing PriorityClass, a name taken by an object we do not own) blocks it.

        `current` is the status the server has (as of `job`), `base` the status to show the problems on.
        """
        updated: JsonDict = copy.deepcopy(dict(base))
        stamp = rfc3339(self._clock.now())
        generation = job["metadata"].get("generation")
        if generation is not None:
            updated["observedGeneration"] = generation
        if outcome.invalid:
            message = "invalid spec: " + _summary(outcome.invalid)
            updated["state"] = lifecycle.FAILED
            updated["message"] = message
            updated["failureReason"] = "InvalidSpec"
            # Finished like any failed job (lifecycle's finish): completion time, duration, and the
            # activeDeadlineSeconds clock stopped.
            now = self._clock.now()
            updated["completionTime"] = stamp
            if updated.get("startTime"):
                elapsed = (now - parse_time(str(updated["startTime"]))).total_seconds()
                updated["duration"] = lifecycle.format_duration(elapsed)
            since = updated.pop("runningSince", None)
            if since:
                active = float(updated.get("activeSeconds") or 0)
                updated["activeSeconds"] = int(active + (now - parse_time(str(since))).total_seconds())
            updated.pop("restartAt", None)
            conditions = cond.set_condition(
                updated.get("conditions"),
                cond.FAILED,
                True,
                reason="InvalidSpec",
                message=message,
                now=stamp,
                generation=generation,
            )
            updated["conditions"] = cond.set_condition(
                conditions,
                cond.RUNNING,
                False,
                reason="InvalidSpec",
                message=message,
                now=stamp,
                generation=generation,
            )
            self._events.record(job, "Warning", "InvalidSpec", message)
            self._metrics.invalid_spec.labels(namespace=_namespace(job)).inc()
        else:
            message = _summary(outcome.blocked)
            updated["message"] = message
            updated["conditions"] = cond.set_condition(
                updated.get("conditions"),
                cond.CREATED,
                False,
                reason=FAILED_CREATE,
                message=message,
                now=stamp,
                generation=generation,
            )
        if self._write_status(job, current, updated) is not None:
            # The state may have changed (InvalidSpec fails the job): count it like any transition.
            self._record_transitions(job, current, updated)

    def _record_transitions(self, job: JsonDict, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        namespace = _namespace(job)
        metrics = self._metrics
        old_state, new_state = old.get("state"), new.get("state")
        if not old_state:
            metrics.created.labels(namespace=namespace).inc()
        created = job["metadata"].get("creationTimestamp")
        age = (self._clock.now() - parse_time(created)).total_seconds() if created else None
        first_run = (
            new_state == lifecycle.RUNNING and old_state != lifecycle.RUNNING and not new.get("restartCount")
        )
        if first_run and age is not None:
            metrics.time_to_running.labels(namespace=namespace).observe(age)
        if new_state in lifecycle.FINISHED and old_state not in lifecycle.FINISHED:
            reason = str(new.get("failureReason") or "")
            if new_state == lifecycle.COMPLETED:
                metrics.completed.labels(namespace=namespace, result="succeeded").inc()
            else:
                metrics.completed.labels(namespace=namespace, result="failed").inc()
                metrics.failed.labels(namespace=namespace, reason=reason or "Unknown").inc()
            if age is not None:
                result = "succeeded" if new_state == lifecycle.COMPLETED else "failed"
                metrics.time_to_complete.labels(namespace=namespace, result=result).observe(age)
        before = old.get("restarts") or {}
        after = new.get("restarts") or {}
        counted = 0
        for cause in Cause:
            grown = int(after.get(cause.value, 0)) - int(before.get(cause.value, 0))
            if grown > 0:
                counted += grown
                metrics.restarts.labels(namespace=namespace, reason=restart_reason(cause.value)).inc(grown)
        # Restarts without a cause (a numWorkers change) show up only in restartCount.
        uncaused = int(new.get("restartCount") or 0) - int(old.get("restartCount") or 0) - counted
        if uncaused > 0:
            metrics.restarts.labels(namespace=namespace, reason=restart_reason("other")).inc(uncaused)

    # ------------------------------------------------------------------------------------ actions

    def _execute(self, job: JsonDict, plan: lifecycle.Plan) -> _Outcome:
        outcome = _Outcome()
        key = object_key(job)
        namespace = _namespace(job)
        for patch in plan.patches:
            resource = resource_for(patch.api_version, patch.kind)
            self._client.patch(resource, namespace, patch.name, patch.body)
            logger.info(
                "patched %s %s", patch.kind, patch.name, extra={"action": "patch", "object": patch.name}
            )
        pods = [obj for obj in plan.creates if obj["kind"] == "Pod"]
        others = [obj for obj in plan.creates if obj["kind"] != "Pod"]
        # The supporting objects are created in parallel, except that a RoleBinding waits for its Role:
        # the API server checks that whoever binds a Role holds its permissions, and cannot check a Role
        # that does not exist yet (only a superuser skips that check). The pods need them all
        # (ServiceAccount, ConfigMap), so they come last.
        bindings = [obj for obj in others if obj["kind"] == "RoleBinding"]
        for batch in ([obj for obj in others if obj["kind"] != "RoleBinding"], bindings):
            for future in [self._submit(self._create, job, obj, outcome) for obj in batch]:
                future.result()
        if outcome.blocked or outcome.invalid:
            return outcome
        if pods:
            self._expectations.expect_creates(key, [pod["metadata"]["name"] for pod in pods])
            for future in [self._submit(self._create_pod, job, pod, outcome) for pod in pods]:
                future.result()
        pod_deletes = [delete for delete in plan.deletes if delete.kind == "Pod"]
        if pod_deletes:
            self._expectations.expect_deletes(key, [delete.uid for delete in pod_deletes])
            for future in [self._submit(self._delete_pod, job, delete) for delete in pod_deletes]:
                future.result()
        return outcome

    def _submit(self, function: Callable[..., object], *args: Any) -> Future[Any]:
        """Runs `function` on the shared pool in a copy of this thread's context, so its log lines carry
        the job's namespace, name and reconcile id."""
        return self._executor.submit(contextvars.copy_context().run, function, *args)

    def _create(self, job: JsonDict, obj: JsonDict, outcome: _Outcome) -> bool:
        namespace = _namespace(job)
        kind, name = obj["kind"], obj["metadata"]["name"]
        resource = resource_for(obj["apiVersion"], kind)
        try:
            self._client.create(resource, namespace, obj)
        except AlreadyExists:
            existing = self._client.get(resource, namespace, name)
            owners = existing.get("metadata", {}).get("ownerReferences") or []
            if any(owner.get("uid") == job["metadata"]["uid"] for owner in owners):
                return True
            message = f"{kind} {name} already exists and is not owned by this TrainingJob"
            self._failed_create(job, kind, name, message, outcome.blocked)
            return False
        except Invalid as error:
            self._failed_create(job, kind, name, f"{kind} {name}: {error.message}", outcome.invalid)
            return False
        except (Forbidden, NotFound) as error:
            self._failed_create(job, kind, name, f"creating {kind} {name}: {error.message}", outcome.blocked)
            return False
        logger.info("created %s %s", kind, name, extra={"action": "create", "kind": kind, "object": name})
        self._events.record(job, "Normal", "SuccessfulCreate", f"Created {kind.lower()}: {name}")
        return True

    def _failed_create(self, job: JsonDict, kind: str, name: str, message: str, into: list[str]) -> None:
        into.append(message)
        logger.warning("failed to create %s %s: %s", kind, name, message, extra={"action": "create-failed"})
        self._events.record(job, "Warning", "FailedCreate", message)

    def _create_pod(self, job: JsonDict, pod: JsonDict, outcome: _Outcome) -> None:
        key = object_key(job)
        name = pod["metadata"]["name"]
        try:
            created = self._create(job, pod, outcome)
        except KubeError:
            # Not created (or not known to be): the cache will never show it, so stop waiting for it.
            self._expectations.created(key, name)
            raise
        if not created:
            self._expectations.created(key, name)

    def _delete_pod(self, job: JsonDict, delete: lifecycle.Delete) -> None:
        key = object_key(job)
        try:
            self._client.delete(
                PODS,
                _namespace(job),
                delete.name,
                uid=delete.uid,
                grace_period_seconds=0 if delete.force else None,
            )
        except (NotFound, Conflict):
            self._expectations.deleted(key, delete.uid)
            return
        except KubeError:
            self._expectations.deleted(key, delete.uid)
            raise
        verb = "force-deleted" if delete.force else "deleted"
        logger.info(
            "%s pod %s: %s",
            verb,
            delete.name,
            delete.reason,
            extra={"action": "delete", "object": delete.name},
        )
        self._events.record(
            job, "Normal", "SuccessfulDelete", f"{verb.capitalize()} pod: {delete.name} ({delete.reason})"
        )

    def _delete_job(self, job: JsonDict) -> None:
        try:
            name, uid = job["metadata"]["name"], job["metadata"]["uid"]
            self._client.delete(TRAININGJOBS, _namespace(job), name, uid=uid)
        except (NotFound, Conflict):
            return
        logger.info("deleted the job: ttlSecondsAfterFinished expired", extra={"action": "delete-job"})
