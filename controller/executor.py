"""Carries out a plan's writes to the job's objects, and brings back what the API server refused.

Order: patches of supporting objects, then their creates (in parallel), then the pods (they need the
account and the trainer's sources), then the Services, then pod deletes, then deletes of other objects
(a Kueue Workload, the trainers' RoleBinding). Services come after the pods, as nothing in a pod needs
them before it runs (they give its DNS names): the endpoints
controllers then find the pods when they first sync a new Service, instead of writing its Endpoints
and EndpointSlice empty and again for each pod (a third of the API server's requests in a burst of
new jobs). The reconciler releases the tracking finalizers of pods apart (`release`), after it wrote
status. Pod creates and deletes are announced to the expectations first and lowered again for every
one that fails or is not tried, so a reconcile never waits for a cache event that will not come.

Pods are created in batches that stop at a refusal that holds for every pod of the job (a quota, a
missing ServiceAccount or PriorityClass, an invalid field): the rest are not tried. A job whose last
creates were refused (`Plan.slow_start`) starts from a batch of 1 and doubles it (the Job
controller's slow start), so a blocked 100-worker job costs one refused request per retry, not a
hundred; any other job's first batch is as large as the create pool, so the pods of a job that
nothing blocks go in one round trip instead of log2(workers) + 1 of them.

Refusals come back as `CreateFailure`s for the planner to judge: an object the API server will never
take in this form (400 BadRequest, 413 too large, 422 Invalid) is `invalid`; one that something
outside the job stands in the way of (403 Forbidden: a quota, a missing PriorityClass, a terminating
namespace; 404; a name taken by an object the job does not own) is `blocked`. Anything else (a 5xx,
a 429 or a lost connection the client gave up retrying) is raised: the worker retries the whole
reconcile with backoff.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any, Literal

from builders.pvc import reusable_claim
from builders.shared import is_shared
from controller.planner import CreateFailure, Delete, Plan
from controller.planner.supporting import Patch
from controller.planner.texts import event_message, objects_listed
from controller.planner.tracking import Release
from controller.resources import CREATED_ONLY, PODS, TRAININGJOBS, WORKLOADS, resource_for
from controller.runtime.client import KubeClient
from controller.runtime.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
)
from controller.runtime.events import EventRecorder
from controller.runtime.expectations import Expectations
from controller.runtime.store import object_key
from crd.contract import TRACKING_FINALIZER

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]
REQUEST_TOO_LARGE = 413


class Writes:
    """Writes a plan's objects with the API client on a shared thread pool."""

    def __init__(
        self,
        client: KubeClient,
        *,
        expectations: Expectations,
        events: EventRecorder,
        pool: Executor,
        pool_size: int,
    ) -> None:
        self._client = client
        self._expectations = expectations
        self._events = events
        self._pool = pool
        self._pool_size = pool_size

    def execute(self, job: JsonDict, plan: Plan) -> list[CreateFailure]:
        """The plan's writes; one Event names what was created, one per kind of delete (even when a
        write raises half-way: what was written is news either way)."""
        written = _Written()
        try:
            return self._execute(job, plan, written)
        finally:
            self._announce(job, written)

    def _execute(self, job: JsonDict, plan: Plan, written: _Written) -> list[CreateFailure]:
        key = object_key(job)
        for patch in plan.patches:
            self._patch(job, patch)
        by_kind: dict[str, list[JsonDict]] = {"Pod": [], "Service": [], "": []}
        for obj in plan.creates:
            by_kind.get(obj["kind"], by_kind[""]).append(obj)
        failures = _in_parallel(self._pool, written.create(self._create), job, by_kind[""])
        if failures:
            return failures
        if by_kind["Pod"]:
            first_batch = 1 if plan.slow_start else self._pool_size
            failures += self._create_pods(job, by_kind["Pod"], written, first_batch)
        if by_kind["Service"]:
            # Expected like pods: the pods' events may reach the cache first, and a reconcile they bring
            # must not take the Services for missing.
            services = by_kind["Service"]
            self._expectations.expect_creates(key, [obj["metadata"]["name"] for obj in services])
            failures += _in_parallel(self._pool, written.create(self._create_expected), job, services)
        deletes = [delete for delete in plan.deletes if delete.kind == "Pod"]
        if deletes:
            self._expectations.expect_deletes(key, [delete.uid for delete in deletes])
            _in_parallel(self._pool, written.delete(self._delete_pod), job, deletes)
        for delete in plan.deletes:
            if delete.kind != "Pod":
                self._delete(job, delete)
        return failures

    def _patch(self, job: JsonDict, patch: Patch) -> None:
        """A merge patch; one written on a Kueue Workload that Kueue changed or deleted meanwhile is
        dropped (409, 404; 422 when its quota was reserved meanwhile): the Workload's informer event
        brings the job back with the news."""
        resource = resource_for(patch.api_version, patch.kind)
        try:
            self._client.patch(
                resource, _namespace(job), patch.name, patch.body, subresource=patch.subresource, answer=False
            )
        except (Conflict, NotFound, Invalid) as error:
            if patch.kind != WORKLOADS.kind:
                raise
            logger.info(
                "not patching %s %s: %s", patch.kind, patch.name, error.message, extra={"action": "patch"}
            )
            return
        what = f"{patch.kind} {patch.name}" + (f" {patch.subresource}" if patch.subresource else "")
        logger.info("patched %s", what, extra={"action": "patch", "object": patch.name})

    def _delete(self, job: JsonDict, delete: Delete) -> None:
        """Deletes one of the job's other objects (a Kueue Workload, the namespace's trainer RoleBinding),
        if it is still the one planned."""
        try:
            self._client.delete(resource_for("", delete.kind), _namespace(job), delete.name, uid=delete.uid)
        except (NotFound, Conflict):
            return
        logger.info(
            "deleted %s %s: %s",
            delete.kind,
            delete.name,
            delete.reason,
            extra={"action": "delete", "object": delete.name},
        )
        self._events.record(
            job,
            "Normal",
            "SuccessfulDelete",
            event_message(f"Deleted {delete.kind.lower()}: {delete.name} ({delete.reason})"),
        )

    def _announce(self, job: JsonDict, written: _Written) -> None:
        if written.created:
            # One line for what the plan created, as one Event (a line per object was 3% of the
            # operator's CPU in a burst of new jobs).
            created = [f"{kind}/{name}" for kind, name in sorted(written.created)]
            logger.info("created %s", ", ".join(created), extra={"action": "create", "objects": created})
            self._events.record(
                job, "Normal", "SuccessfulCreate", f"Created {objects_listed(written.created)}"
            )
        for (verb, reason), names in written.deleted.items():
            pods = objects_listed([("Pod", name) for name in names])
            self._events.record(job, "Normal", "SuccessfulDelete", event_message(f"{verb} {pods} ({reason})"))

    def release(self, namespace: str, releases: Sequence[Release]) -> None:
        """Removes the tracking finalizer of each pod, if it is still that pod and still has it there (a
        JSON patch that tests both); a pod gone or changed meanwhile is left to its next event."""
        if releases:
            _in_parallel(self._pool, lambda _job, item: self._release(namespace, item), {}, releases)

    def _release(self, namespace: str, release: Release) -> None:
        path = f"/metadata/finalizers/{release.position}"
        operations = [
            {"op": "test", "path": "/metadata/uid", "value": release.uid},
            {"op": "test", "path": path, "value": TRACKING_FINALIZER},
            {"op": "remove", "path": path},
        ]
        try:
            self._client.patch(PODS, namespace, release.name, operations, patch_type="json", answer=False)
        except (NotFound, Conflict, Invalid) as error:
            logger.info("not releasing pod %s: %s", release.name, error.message, extra={"action": "release"})
            return
        logger.info(
            "released pod %s: its end is accounted for",
            release.name,
            extra={"action": "release", "object": release.name},
        )

    def delete_job(self, job: JsonDict) -> None:
        try:
            self._client.delete(
                TRAININGJOBS, _namespace(job), job["metadata"]["name"], uid=job["metadata"]["uid"]
            )
        except (NotFound, Conflict):
            return
        logger.info("deleted the job: ttlSecondsAfterFinished expired", extra={"action": "delete-job"})

    def _create(self, job: JsonDict, obj: JsonDict) -> CreateFailure | bool:
        """Creates `obj`: True, or False when it exists already as the job's (or the namespace's)
        own, or why it was refused."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        resource = resource_for(obj["apiVersion"], kind)
        try:
            self._client.create(resource, _namespace(job), obj, answer=False)
        except AlreadyExists:
            # The operator may not read CREATED_ONLY kinds: by its name, the MPI job's SSH key of an
            # earlier attempt (one made by someone who may write the namespace's Secrets serves too).
            if resource in CREATED_ONLY or _ours(job, obj, self._client.get(resource, _namespace(job), name)):
                return False
            taken = f"{kind} {name} already exists and is not owned by this TrainingJob"
            return self._refused(job, kind, name, "blocked", taken, alone=True)
        except (BadRequest, Invalid) as error:
            return self._refused(job, kind, name, "invalid", f"{kind} {name}: {error.message}")
        except (Forbidden, NotFound) as error:
            return self._refused(job, kind, name, "blocked", f"creating {kind} {name}: {error.message}")
        except ApiError as error:
            if error.status != REQUEST_TOO_LARGE:
                raise
            return self._refused(job, kind, name, "invalid", f"{kind} {name}: {error.message}")
        return True

    def _refused(
        self,
        job: JsonDict,
        kind: str,
        name: str,
        verdict: Literal["invalid", "blocked"],
        message: str,
        *,
        alone: bool = False,
    ) -> CreateFailure:
        logger.warning("failed to create %s %s: %s", kind, name, message, extra={"action": "create-failed"})
        self._events.record(job, "Warning", "FailedCreate", event_message(message))
        return CreateFailure(kind, name, verdict, message, alone)

    def _create_pods(
        self, job: JsonDict, pods: list[JsonDict], written: _Written, first_batch: int
    ) -> list[CreateFailure]:
        """Creates `pods` in batches of doubling size, from `first_batch`, until a batch is refused for
        every pod's reason."""
        key = object_key(job)
        self._expectations.expect_creates(key, [pod["metadata"]["name"] for pod in pods])
        failures: list[CreateFailure] = []
        size, start = max(1, first_batch), 0
        while start < len(pods):
            batch = pods[start : start + size]
            start += size
            try:
                refused = _in_parallel(self._pool, written.create(self._create_expected), job, batch)
            except KubeError:
                for pod in pods[start:]:  # not tried: the cache will never show them
                    self._expectations.created(key, pod["metadata"]["name"])
                raise
            failures += refused
            if any(not failure.alone for failure in refused):
                for pod in pods[start:]:  # not tried: the cache will never show them
                    self._expectations.created(key, pod["metadata"]["name"])
                break
            size *= 2
        return failures

    def _create_expected(self, job: JsonDict, obj: JsonDict) -> CreateFailure | bool:
        """`_create` of an object whose create the expectations were told of."""
        key, name = object_key(job), obj["metadata"]["name"]
        try:
            outcome = self._create(job, obj)
        except KubeError:
            # Not created (or not known to be): the cache will never show it, so stop waiting for it.
            self._expectations.created(key, name)
            raise
        if isinstance(outcome, CreateFailure):
            self._expectations.created(key, name)
        return outcome

    def _delete_pod(self, job: JsonDict, delete: Delete) -> bool:
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
            return False
        except KubeError:
            self._expectations.deleted(key, delete.uid)
            raise
        logger.info(
            "%s pod %s: %s",
            "force-deleted" if delete.force else "deleted",
            delete.name,
            delete.reason,
            extra={"action": "delete", "object": delete.name},
        )
        return True


class _Written:
    """What one plan's writes created and deleted, for its Events (appended from the pool's threads)."""

    def __init__(self) -> None:
        self.created: list[tuple[str, str]] = []
        self.deleted: dict[tuple[str, str], list[str]] = {}

    def create(
        self, write: Callable[[JsonDict, JsonDict], CreateFailure | bool]
    ) -> Callable[[JsonDict, JsonDict], CreateFailure | None]:
        """`write` counting what it created (not what it found there already: no Event announces that)."""

        def counted(job: JsonDict, obj: JsonDict) -> CreateFailure | None:
            outcome = write(job, obj)
            if isinstance(outcome, CreateFailure):
                return outcome
            if outcome:
                self.created.append((obj["kind"], obj["metadata"]["name"]))
            return None

        return counted

    def delete(self, write: Callable[[JsonDict, Delete], bool]) -> Callable[[JsonDict, Delete], None]:
        def counted(job: JsonDict, delete: Delete) -> None:
            if write(job, delete):
                verb = "Force-deleted" if delete.force else "Deleted"
                self.deleted.setdefault((verb, delete.reason), []).append(delete.name)

        return counted


def _in_parallel(
    pool: Executor,
    write: Callable[[JsonDict, Any], CreateFailure | None],
    job: JsonDict,
    items: Sequence[Any],
) -> list[CreateFailure]:
    """Runs `write` for every item, all but the last on the pool in a copy of this thread's context (so
    log lines carry the job and the reconcile id) and the last here, as this thread would only wait;
    the failures, or the first error raised."""
    if not items:
        return []
    futures: list[Future[CreateFailure | None]] = [
        pool.submit(contextvars.copy_context().run, write, job, item) for item in items[:-1]
    ]
    last = write(job, items[-1])
    outcomes = [future.result() for future in futures] + [last]
    return [failure for failure in outcomes if failure is not None]


def _namespace(job: JsonDict) -> str:
    return str(job["metadata"]["namespace"])


def _ours(job: JsonDict, wanted: JsonDict, existing: JsonDict) -> bool:
    """An object found under the name of one the job wants is the job's own (made before a crash), a
    shared one another job of the namespace made, or a checkpoint claim retained for the job's name
    (builders/pvc.py)."""
    owners = existing.get("metadata", {}).get("ownerReferences") or []
    if any(owner.get("uid") == job["metadata"]["uid"] for owner in owners):
        return True
    if reusable_claim(job["metadata"]["name"], existing):
        return True
    return is_shared(wanted) and is_shared(existing)
