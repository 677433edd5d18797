"""What the operator watches, what its caches keep, and which TrainingJob each event wakes up.

This is the first stop of a job key: an informer event on any object is mapped to the key
(namespace/name) of the TrainingJob that controls it, through its controller ownerReference, and
queued. Along the way the handlers feed what the reconciler needs to trust its caches:

* a pod seen created or deleted lowers the job's expectations (controller.runtime.expectations);
* a job seen at a resourceVersion settles the status write that produced it (`StatusWrites`).

A pod's end is never only in an event: the tracking finalizer keeps a deleted pod, with its last
state, in the cache until its job's status accounts for it (planner/tracking.py); a pod that ends or
starts terminating wakes its job ahead of other work, and one whose job is gone wakes that job's key,
whose reconcile lets the pod go.

Caches hold only what the planner reads (transforms): pods without their spec, nodes as their Ready
condition. The objects a namespace's jobs share (builders/shared.py) have no owner: their events
wake the namespace's key (`namespace_key`), whose reconcile deletes them once no job is left.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from builders.shared import is_shared
from controller.planner import podstate
from controller.resources import NAMED, NODES, OWNED, PODS, TRAININGJOBS, name_selector
from controller.runtime.client import KubeClient
from controller.runtime.clock import Clock
from controller.runtime.expectations import Expectations, Seen
from controller.runtime.informer import Informer
from controller.runtime.resource import Resource
from controller.runtime.store import OWNER_INDEXERS, IndexFunc, Store, object_key
from controller.runtime.trackers import StatusWrites
from controller.runtime.workqueue import NORMAL_PRIORITY, WorkQueue
from crd import contract

JsonDict = dict[str, Any]

BY_JOB: Final = "by-job"
BY_NODE: Final = "by-node"
BY_SHARED: Final = "by-shared-namespace"
# How long after a namespace's last TrainingJob went its shared objects are deleted (a job deleted
# and applied again right away keeps them).
RELEASE_AFTER_SECONDS: Final = 30.0

# Work-queue priorities. News that may move a job to another state (its last pod started, a pod
# ended or went, the status write or the last of the creates and deletes a reconcile waited for
# arrived) is taken before the first reconciles of newer jobs, so a burst of new jobs does not keep
# running ones from showing Running; the periodic resync, which only re-checks, comes last. Other pod
# news (created, bound, one of several started) waits its turn: taken at once, each would cost a
# reconcile and a status write of counters.
URGENT_PRIORITY: Final = 1
RESYNC_PRIORITY: Final = -1


def _priority(seen: Seen) -> int:
    """An object's arrival that lets a turned-away reconcile go on is urgent; other arrivals are not."""
    return URGENT_PRIORITY if seen is Seen.AWAITED else NORMAL_PRIORITY


def namespace_key(namespace: str) -> str:
    """The work-queue key of a namespace's shared objects: "<namespace>/" (no job has an empty name)."""
    return f"{namespace}/"


def shared_namespace(obj: JsonDict) -> list[str]:
    """The namespace of an object the namespace's jobs share."""
    return [str(obj["metadata"].get("namespace", ""))] if is_shared(obj) else []


def by_job(obj: JsonDict) -> list[str]:
    """The key of the TrainingJob named by the object's `training-job` label, if it has one."""
    metadata = obj.get("metadata") or {}
    job_name = (metadata.get("labels") or {}).get(contract.JOB_NAME_LABEL)
    if not job_name:
        return []
    namespace = metadata.get("namespace")
    return [f"{namespace}/{job_name}" if namespace else str(job_name)]


def by_node(obj: JsonDict) -> list[str]:
    node = obj.get("spec", {}).get("nodeName")
    return [str(node)] if node else []


# The indexes of every cache of the job's objects: by controller owner UID, and by the job's label.
STANDARD_INDEXERS: Final[dict[str, IndexFunc]] = {
    **OWNER_INDEXERS,
    BY_JOB: by_job,
    BY_SHARED: shared_namespace,
}


def owner_key(obj: Mapping[str, Any]) -> str | None:
    """namespace/name of the TrainingJob controlling `obj`, from its controller ownerReference."""
    for owner in obj.get("metadata", {}).get("ownerReferences") or []:
        if (
            owner.get("controller")
            and owner.get("kind") == contract.KIND
            and str(owner.get("apiVersion", "")).startswith(contract.GROUP + "/")
        ):
            return f"{obj['metadata'].get('namespace')}/{owner['name']}"
    return None


# ------------------------------------------------------------------------------------ transforms


def node_readiness(node: JsonDict) -> JsonDict:
    """All the controller keeps of a Node: its name and Ready condition."""
    ready = [c for c in node.get("status", {}).get("conditions") or [] if c.get("type") == "Ready"]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node["metadata"]["name"],
            "resourceVersion": node["metadata"].get("resourceVersion"),
        },
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": c.get("status"),
                    "lastTransitionTime": c.get("lastTransitionTime"),
                }
                for c in ready
            ]
        },
    }


def pod_essentials(pod: JsonDict) -> JsonDict:
    """All the controller keeps of a Pod: metadata, the node it is bound to, and status. The spec (env,
    volumes, containers) is most of a Pod's size and the controller never reads it back."""
    node = (pod.get("spec") or {}).get("nodeName")
    return {
        "apiVersion": pod.get("apiVersion", "v1"),
        "kind": pod.get("kind", "Pod"),
        "metadata": pod["metadata"],
        "spec": {"nodeName": node} if node else {},
        "status": pod.get("status") or {},
    }


# ---------------------------------------------------------------------------------------- caches


@dataclass(frozen=True)
class Caches:
    """The informers' stores the reconciler reads, and whether the optional node cache can be trusted.

    `owned` maps a kind to the store of the job's objects of that kind; the PodGroup and Workload
    stores join it (and leave it) as discovery finds a gang scheduler's or Kueue's API served (and
    gone). Readers take a snapshot of it (`tuple(owned.values())`), which is atomic.
    """

    jobs: Store
    pods: Store
    owned: dict[str, Store]
    nodes: Store | None
    nodes_synced: Callable[[], bool]


class Watches:
    """Builds the operator's informers and routes their events to the work queue.

    Nothing here talks to the API server until the informers run (`informers`, started by the manager).
    """

    def __init__(
        self,
        client: KubeClient,
        queue: WorkQueue,
        clock: Clock,
        *,
        namespace: str | None,
        expectations: Expectations,
        status_writes: StatusWrites,
    ) -> None:
        self._client = client
        self._queue = queue
        self._clock = clock
        self._namespace = namespace
        self._expectations = expectations
        self._status_writes = status_writes
        self.informers: list[Informer] = []
        # Informers whose sync the operator does not wait for (readiness, start of work).
        self.optional: set[str] = set()

        jobs = self.informer(TRAININGJOBS, label_selector=None)
        jobs.add_handler(
            on_add=self._job_changed,
            on_update=lambda _old, new: self._job_changed(new),
            on_delete=self._job_deleted,
        )
        pods = self.informer(PODS, indexers={BY_NODE: by_node}, transform=pod_essentials)
        pods.add_handler(on_add=self._pod_added, on_update=self._pod_updated, on_delete=self._pod_deleted)
        owned = {resource.kind: self.watch_owned(resource).store for resource in OWNED}
        nodes = self.informer(NODES, label_selector=None, cluster=True, transform=node_readiness)
        nodes.add_handler(on_add=self._node_gone, on_update=self._node_changed, on_delete=self._node_gone)
        self.optional.add(nodes.name)
        self.caches = Caches(jobs.store, pods.store, owned, nodes.store, nodes.has_synced)

    def watch_owned(
        self,
        resource: Resource,
        transform: Callable[[JsonDict], JsonDict] | None = None,
        *,
        optional: bool = False,
    ) -> Informer:
        """Watches the job's objects of `resource`: a change or a delete wakes the job (to repair it).
        `optional`: an API found by discovery (controller/discovery.py), whose informer is started,
        stopped and added to the caches by it, not with the others. A kind with one name (NAMED) is
        watched by that name only."""
        named = NAMED.get(resource.kind)
        informer = self.informer(
            resource,
            transform=transform,
            optional=optional,
            field_selector=name_selector(named) if named else None,
        )
        informer.add_handler(
            on_add=self._owned_changed,
            on_update=lambda _old, new: self._owned_changed(new),
            on_delete=self._owned_deleted,
        )
        return informer

    def informer(
        self,
        resource: Resource,
        *,
        label_selector: str | None = contract.MANAGED_SELECTOR,
        field_selector: str | None = None,
        cluster: bool = False,
        indexers: Mapping[str, IndexFunc] | None = None,
        transform: Callable[[JsonDict], JsonDict] | None = None,
        optional: bool = False,
    ) -> Informer:
        """An informer of `resource` in the watched namespace (`cluster`: everywhere); the manager starts
        it with the others unless it is `optional`."""
        informer = Informer(
            self._client,
            resource,
            Store({**STANDARD_INDEXERS, **(indexers or {})}),
            namespace=None if cluster else self._namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            clock=self._clock,
            transform=transform,
        )
        if not optional:
            self.informers.append(informer)
        return informer

    def wake_jobs(self, wanted: Callable[[JsonDict], bool]) -> None:
        """Queues every cached job `wanted` says something changed for."""
        for job in self.caches.jobs.list():
            if wanted(job):
                self._queue.add(object_key(job))

    # ----------------------------------------------------------------------------------- handlers

    def _job_changed(self, obj: JsonDict) -> None:
        key = object_key(obj)
        settled = self._status_writes.observed(key, str(obj["metadata"].get("resourceVersion", "")))
        # A reconcile that found our last status write not yet in the cache waits for exactly this.
        self._queue.add(key, URGENT_PRIORITY if settled else NORMAL_PRIORITY)

    def _pod_added(self, obj: JsonDict) -> None:
        key = owner_key(obj)
        if key:
            self._queue.add(key, _priority(self._expectations.created(key, obj["metadata"]["name"])))

    def _pod_updated(self, old: JsonDict, new: JsonDict) -> None:
        key = owner_key(new)
        if key is None:
            self._foreign_pod_changed(new)
            return
        seen = Seen.UNEXPECTED
        if new["metadata"].get("deletionTimestamp"):
            # Every update of a terminating pod, not only the first: a delete we expect may have been
            # someone else's first (the Job controller does the same).
            seen = self._expectations.deleted(key, new["metadata"]["uid"])
        siblings = self.caches.pods.by_index(BY_JOB, key)
        urgent = podstate.changes_the_gang(old, new, siblings) or seen is Seen.AWAITED
        self._queue.add(key, URGENT_PRIORITY if urgent else NORMAL_PRIORITY)

    def _pod_deleted(self, obj: JsonDict) -> None:
        key = owner_key(obj)
        if key is None:
            self._foreign_pod_changed(obj)
            return
        self._expectations.deleted(key, obj["metadata"]["uid"])
        self._queue.add(key, URGENT_PRIORITY)

    def _foreign_pod_changed(self, obj: JsonDict) -> None:
        """A pod with the job's labels but not owned by it may be what blocks the job (it holds a rank's
        name); when it changes or goes, the job tries again at once."""
        for key in by_job(obj):
            self._queue.add(key)

    def _job_deleted(self, obj: JsonDict) -> None:
        self._queue.add(object_key(obj))
        namespace = obj["metadata"].get("namespace")
        if namespace:
            self._queue.add_after(namespace_key(namespace), RELEASE_AFTER_SECONDS)

    def _owned_changed(self, obj: JsonDict) -> None:
        key = owner_key(obj)
        if key:
            # A Service we created is seen (the executor expects a job's Services like its pods).
            self._queue.add(key, _priority(self._expectations.created(key, obj["metadata"]["name"])))
            return
        if is_shared(obj):
            # Seen (also at start-up): still needed? The namespace's reconcile decides.
            self._queue.add_after(namespace_key(obj["metadata"]["namespace"]), RELEASE_AFTER_SECONDS)
            return
        # A checkpoint claim retained past its job (builders/pvc.py) is the job's by its label.
        for labelled in by_job(obj):
            self._queue.add(labelled)

    def _owned_deleted(self, obj: JsonDict) -> None:
        """A deleted object is repaired by its job; a deleted shared one by every job of its namespace
        (the next pods need it)."""
        self._owned_changed(obj)
        if owner_key(obj) is None and is_shared(obj):
            namespace = obj["metadata"]["namespace"]
            for job in self.caches.jobs.list():
                if job["metadata"].get("namespace") == namespace:
                    self._queue.add(object_key(job))

    def _node_changed(self, old: JsonDict, new: JsonDict) -> None:
        if old.get("status") != new.get("status"):
            self._jobs_on_node(new["metadata"]["name"])

    def _node_gone(self, obj: JsonDict) -> None:
        self._jobs_on_node(obj["metadata"]["name"])

    def _jobs_on_node(self, node: str) -> None:
        for pod in self.caches.pods.by_index(BY_NODE, node):
            key = owner_key(pod)
            if key:
                self._queue.add(key)
