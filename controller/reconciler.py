"""Reconcile one TrainingJob: wait for the cache, observe, plan, write, execute, and plan again when the
cluster refused an object. Every decision is the planner's (controller/planner/); this is the shell.

Its rules:

* Act only on a cache that has caught up with our own writes: pod creations and deletions are
  tracked by expectations (lowered by informer events), and a reconcile waits until the job informer
  has delivered the status we last wrote. Without that a reconcile could count one failure twice or
  re-create a pod it just made.
* Write status first (a merge patch with the read resourceVersion as precondition, only when it
  changed), then objects. A crash in between leaves a status the next reconcile completes. When the
  planner says so (`Plan.objects_first`: a job blocked by a refused create), objects go first and
  status after, so a failure that keeps recurring writes nothing new.
* A pod's tracking finalizer goes only after the status planned from a cache that showed its end is
  written (or, unchanged, confirmed): its last state is never lost before it is accounted for. Pods
  whose job is gone are let go at once (planner/tracking.py).
* Deletes carry UID preconditions; creates of deterministic names make a second create a 409.
* A refused create is not an error of the reconcile: it goes back to the planner as a
  `CreateFailure`, and the status it then plans is written. A blocked job is retried with the rate
  limiter's backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

from builders.podgroup import GangScheduler
from builders.pvc import reusable_claim
from controller.executor import Writes
from controller.kueue_watches import KueueWatch, queued
from controller.metrics import Metrics
from controller.planner import CreateFailure, Observed, Plan, Settings, plan, tracking
from controller.planner.model import Guards
from controller.resources import CONFIGMAPS, ROLEBINDINGS, SERVICEACCOUNTS
from controller.runtime.client import KubeClient
from controller.runtime.clock import Clock
from controller.runtime.errors import Conflict, NotFound
from controller.runtime.events import EventRecorder
from controller.runtime.expectations import Expectations
from controller.runtime.sshkeys import new_ssh_key
from controller.runtime.store import BY_OWNER_UID, object_key
from controller.runtime.trackers import StatusWrites
from controller.status import StatusWriter
from controller.volcano_watches import VolcanoQueueWatch
from controller.watches import BY_JOB, BY_SHARED, Caches
from crd import contract

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]
# The kinds of the objects a namespace's jobs share (builders/shared.py), in the order they go.
SHARED_KINDS = (ROLEBINDINGS, SERVICEACCOUNTS, CONFIGMAPS)


@dataclass(frozen=True)
class Result:
    requeue_after: float | None = None
    rate_limited: bool = False


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
        executor_size: int,
        settings: Settings,
    ) -> None:
        self._client = client
        self._caches = caches
        self._expectations = expectations
        self._status_writes = status_writes
        self._clock = clock
        self._settings = settings
        self._writes = Writes(
            client, expectations=expectations, events=events, pool=executor, pool_size=executor_size
        )
        self._status = StatusWriter(
            client, status_writes=status_writes, events=events, metrics=metrics, clock=clock
        )
        # Set by discovery (controller/discovery.py) as the cluster serves a gang scheduler's or
        # Kueue's API, and unset when it stops serving it.
        self.gang_scheduler: GangScheduler | None = None
        # Volcano's Queues, watched while Volcano is the gang scheduler.
        self.volcano: VolcanoQueueWatch | None = None
        self.kueue: KueueWatch | None = None
        # What the caches show of crd/'s admission policies (controller/guards_watch.py), set by the
        # manager; without it nothing is known, so the trainers' rights are neither granted nor taken back.
        self.guards: Callable[[], Guards] = lambda: Guards(known=False)

    def reconcile(self, key: str) -> Result:
        namespace, _, name = key.partition("/")
        if not name:
            self._release_namespace(namespace)
            return Result()
        self._release_orphans(key, self._caches.jobs.get(key))
        cached, waiting = self._ready_to_act(key)
        if cached is None:
            return waiting
        observed = self._observe(cached)
        planned = plan(observed, self._settings)
        if planned.objects_first:
            result = self._objects_first(cached, observed, planned)
        else:
            result = self._status_first(cached, observed, planned)
        logger.debug(
            "reconciled",
            extra={
                "action": "reconciled",
                "resourceVersion": cached["metadata"].get("resourceVersion"),
                "state": (cached.get("status") or {}).get("state"),
            },
        )
        return result

    # ------------------------------------------------------------------------------------ reading

    def _ready_to_act(self, key: str) -> tuple[JsonDict | None, Result]:
        """The cached job if the cache has caught up with our own writes, else why to wait."""
        cached = self._caches.jobs.get(key)
        if cached is None:
            self._expectations.forget(key)
            self._status_writes.forget(key)
            logger.debug("job is gone; nothing to do")
            return None, Result()
        if not self._expectations.satisfied(key):
            self._deletions_shown(key, cached)
        if not self._expectations.satisfied(key):
            pending = self._expectations.pending(key)
            logger.debug("waiting for the cache to show our pod writes", extra={"pending": repr(pending)})
            age = pending.age_seconds if pending is not None else 0.0
            return None, Result(requeue_after=max(1.0, 300.0 - age))
        if not self._status_writes.settled(key):
            logger.debug("waiting for the cache to show our last status write")
            return None, Result()
        kueue = self.kueue
        if kueue is not None and queued(cached) and not kueue.synced():
            logger.debug("waiting for the caches of Kueue's objects to sync")
            return None, Result(requeue_after=1.0)
        return cached, Result()

    def _deletions_shown(self, key: str, job: JsonDict) -> None:
        """Pod deletes we expect whose pod the cache shows terminating or no longer holds: seen, even if
        the event that showed it came before we expected it (someone else deleted the pod first, and
        its tracking finalizer keeps it Terminating, so no later event may come)."""
        pending = self._expectations.pending(key)
        if pending is None:
            return
        pods = {
            pod["metadata"]["uid"]: pod
            for pod in self._caches.pods.by_index(BY_OWNER_UID, job["metadata"]["uid"])
        }
        for uid in pending.deletes:
            if uid not in pods or pods[uid]["metadata"].get("deletionTimestamp"):
                self._expectations.deleted(key, uid)

    def _observe(self, job: JsonDict) -> Observed:
        uid = job["metadata"]["uid"]
        owned: dict[tuple[str, str], JsonDict] = {}
        for store in tuple(self._caches.owned.values()):  # discovery may add or drop a store meanwhile
            # The namespace's shared objects first: a job's own object of the same kind and name wins.
            for obj in store.by_index(BY_SHARED, job["metadata"]["namespace"]):
                owned[(obj["kind"], obj["metadata"]["name"])] = obj
            for obj in store.by_index(BY_OWNER_UID, uid):
                owned[(obj["kind"], obj["metadata"]["name"])] = obj
        prebuilt = ((job["metadata"].get("labels") or {}).get(contract.PREBUILT_WORKLOAD_LABEL)) or ""
        workloads = self._caches.owned.get("Workload")
        if prebuilt and workloads is not None and ("Workload", prebuilt) not in owned:
            # Kueue's Workload for the job, not adopted yet (planner/workloads.py adopts it).
            found = workloads.get(f"{job['metadata']['namespace']}/{prebuilt}")
            if found is not None and not found["metadata"].get("ownerReferences"):
                owned[("Workload", prebuilt)] = found
        claims = self._caches.owned.get("PersistentVolumeClaim")
        for claim in claims.by_index(BY_JOB, object_key(job)) if claims is not None else ():
            # A retained checkpoint claim has no owner: it is the job's by its name and labels.
            if reusable_claim(job["metadata"]["name"], claim):
                owned[(claim["kind"], claim["metadata"]["name"])] = claim
        nodes = self._caches.nodes
        nodes_known = nodes is not None and self._caches.nodes_synced()
        return Observed(
            job=job,
            pods=self._caches.pods.by_index(BY_OWNER_UID, uid),
            owned=owned,
            nodes={node["metadata"]["name"]: node for node in nodes.list()} if nodes and nodes_known else {},
            nodes_known=nodes_known,
            now=self._clock.now(),
            gang_scheduler=self.gang_scheduler,
            volcano_queues=volcano.queues() if (volcano := self.volcano) is not None else None,
            kueue=kueue.queueing() if (kueue := self.kueue) is not None else None,
            guards=self.guards(),
            # Made for every reconcile of an MPI job (an Ed25519 key is cheap); used only when its pods
            # are created (planner/transitions.py).
            ssh_key=new_ssh_key(f"{job['metadata']['name']}-mpi") if _is_mpi(job) else None,
        )

    def _release_orphans(self, key: str, job: JsonDict | None) -> None:
        """Lets go of pods labelled for `key` that its job (if any) does not control: no status will
        ever account for them (planner/tracking.py)."""
        uid = job["metadata"]["uid"] if job is not None else None
        orphans = tracking.orphans(self._caches.pods.by_index(BY_JOB, key), uid)
        if orphans:
            self._writes.release(key.partition("/")[0], orphans)

    # ------------------------------------------------------------------------- shared objects

    def _release_namespace(self, namespace: str) -> None:
        """Deletes the objects a namespace's jobs share once it has no TrainingJob left (a job created
        meanwhile finds them gone when its pods are refused, and makes them again)."""
        if any(job["metadata"].get("namespace") == namespace for job in self._caches.jobs.list()):
            return
        for resource in SHARED_KINDS:
            for obj in self._caches.owned[resource.kind].by_index(BY_SHARED, namespace):
                name = obj["metadata"]["name"]
                try:
                    self._client.delete(resource, namespace, name, uid=obj["metadata"]["uid"])
                except (NotFound, Conflict):
                    continue
                logger.info(
                    "deleted %s %s: the namespace has no TrainingJob left",
                    resource.kind,
                    name,
                    extra={"action": "delete", "object": name, "namespace": namespace},
                )

    # ---------------------------------------------------------------------------------- the orders

    def _status_first(self, cached: JsonDict, observed: Observed, planned: Plan) -> Result:
        old_status = cached.get("status") or {}
        version = self._status.write(cached, old_status, planned.status, confirm=bool(planned.releases))
        if version is None:
            return Result()
        self._status.record(cached, old_status, planned.status, planned.events)
        self._writes.release(cached["metadata"]["namespace"], planned.releases)
        failures = self._writes.execute(cached, planned)
        if failures:
            # The job has the planned status now: the failures are news about that job.
            written = replace(observed, job={**observed.job, "status": planned.status})
            replanned = self._replan(written, failures)
            if self._status.write(cached, planned.status, replanned.status, version) is not None:
                news = [event for event in replanned.events if event not in planned.events]
                self._status.record(cached, planned.status, replanned.status, news)
            return self._after_failures(failures, replanned)
        if planned.delete_job:
            self._writes.delete_job(cached)
            return Result()
        return Result(requeue_after=planned.requeue_after)

    def _objects_first(self, cached: JsonDict, observed: Observed, planned: Plan) -> Result:
        """Creates that failed last time (a missing PriorityClass, a name taken by a foreign object, a
        quota), tried again before status is written.

        Writing the planned status first would turn the message back into "creating ..." on every
        retry only for the failure to turn it back again, and each of those writes is a watch event
        that re-queues the job at once, bypassing the rate limiter: a hot loop of PATCHes, POSTs and
        Events. Trying first, the status changes only when the outcome does.
        """
        old_status = cached.get("status") or {}
        failures = self._writes.execute(cached, planned)
        if failures:
            replanned = self._replan(observed, failures)
            if self._status.write(cached, old_status, replanned.status, confirm=bool(replanned.releases)):
                self._status.record(cached, old_status, replanned.status, replanned.events)
                self._writes.release(cached["metadata"]["namespace"], replanned.releases)
            return self._after_failures(failures, replanned)
        logger.info(
            "the objects that could not be created before were created", extra={"action": "unblocked"}
        )
        if self._status.write(cached, old_status, planned.status, confirm=bool(planned.releases)) is None:
            return Result()
        self._status.record(cached, old_status, planned.status, planned.events)
        self._writes.release(cached["metadata"]["namespace"], planned.releases)
        return Result(requeue_after=planned.requeue_after)

    def _replan(self, observed: Observed, failures: Sequence[CreateFailure]) -> Plan:
        """The plan for `observed`, knowing what the API server refused."""
        return plan(replace(observed, create_failures=tuple(failures)), self._settings)

    @staticmethod
    def _after_failures(failures: Sequence[CreateFailure], replanned: Plan) -> Result:
        """A blocked job tries again with the rate limiter's backoff; a failed one waits for its TTL."""
        if any(failure.verdict == "invalid" for failure in failures):
            return Result(requeue_after=replanned.requeue_after)
        return Result(rate_limited=True)


def _is_mpi(job: JsonDict) -> bool:
    spec = job.get("spec")
    return isinstance(spec, dict) and spec.get("framework") == "mpi"
