"""Wires the runtime together: informers -> handlers -> work queue -> worker threads -> reconciler.

Start-up order follows client-go controllers: caches first (standbys keep them warm too), workers
only after every required cache has synced and this process leads. Shutdown runs the other way:
workers drain, the lease is released (a standby takes over at once), informers stop. Losing the
lease ends the process (crash-only): there is never a half-leader.
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from builders.configmap import TRAINER_SOURCES
from builders.podgroup import Gang
from controller import lifecycle, podstate
from controller.clock import Clock, RealClock
from controller.errors import KubeError
from controller.events import EventRecorder
from controller.expectations import Expectations
from controller.informer import Informer
from controller.kube import (
    CONFIGMAPS,
    NODES,
    PODS,
    PVCS,
    ROLEBINDINGS,
    ROLES,
    SERVICEACCOUNTS,
    SERVICES,
    TRAININGJOBS,
    KubeClient,
    Resource,
)
from controller.leaderelection import LeaderElector, LeaseLock
from controller.logs import log_context, new_reconcile_id
from controller.metrics import Metrics, MetricsServer, parse_address
from controller.ratelimit import default_controller_rate_limiter
from controller.reconciler import POD_GROUP_RESOURCES, Caches, Reconciler, Result, StatusWrites, Tombstones
from controller.store import STANDARD_INDEXERS, Store, object_key
from controller.workqueue import WorkQueue
from crd import contract

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]
CONTROLLER = "trainingjob"
# Threads writing Events; each object's Events stay on one of them, in order.
EVENT_WRITERS = 4
# Distinct messages of one reason per job before Events fold into a combined one (client-go: 10). A gang
# start records one create per pod and per supporting object; up to 100 workers keep their own Events.
EVENT_MAX_SIMILAR = 128
BY_NODE = "by-node"


@dataclass(frozen=True)
class Options:
    namespace: str | None = None
    workers: int = 4
    metrics_addr: str = ":8080"
    leader_elect: bool = True
    lease_name: str = contract.OPERATOR_NAME
    lease_namespace: str = "default"
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}_{uuid.uuid4()}")
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    create_concurrency: int = 16
    rate_limit_base: float = 0.005
    # client-go's cap is 1000 s; a job blocked by something outside it (a quota, a missing
    # PriorityClass) should not wait that long to notice the fix.
    rate_limit_cap: float = 300.0
    rate_limit_qps: float = 10.0
    rate_limit_burst: int = 100
    resync_period: float = 600.0
    settings: lifecycle.Settings = field(default_factory=lifecycle.Settings)


def by_node(obj: JsonDict) -> list[str]:
    node = obj.get("spec", {}).get("nodeName")
    return [str(node)] if node else []


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


def share_trainer_sources(config_map: JsonDict) -> JsonDict:
    """Every job's ConfigMap carries the same reference-trainer sources; the cache keeps one copy of
    each (values stay equal, so comparisons with what the builders want are unchanged)."""
    data = config_map.get("data")
    if isinstance(data, dict):
        for key, source in TRAINER_SOURCES.items():
            if data.get(key) == source:
                data[key] = source
    return config_map


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


def detect_gang_scheduler(client: KubeClient) -> Gang | None:
    """Which gang scheduler's PodGroup API the cluster serves (discovery), preferring scheduler-plugins."""
    for api_version, resource in POD_GROUP_RESOURCES.items():
        try:
            listing = client.request("GET", f"/apis/{api_version}")
        except KubeError:
            continue
        if any(entry.get("name") == resource.plural for entry in listing.get("resources", [])):
            return (
                contract.GANG_COSCHEDULING
                if resource.group == "scheduling.x-k8s.io"
                else contract.GANG_VOLCANO
            )
    return None


class Manager:
    def __init__(
        self,
        client: KubeClient,
        lease_client: KubeClient,
        options: Options,
        metrics: Metrics,
        *,
        clock: Clock | None = None,
        events_client: KubeClient | None = None,
    ) -> None:
        self.client = client
        self.options = options
        self.metrics = metrics
        self.clock: Clock = clock or RealClock()
        self.stop_event = threading.Event()
        self.lost_leadership = threading.Event()
        self.queue = WorkQueue(
            CONTROLLER,
            clock=self.clock,
            metrics=metrics.queue_metrics(CONTROLLER, CONTROLLER),
            rate_limiter=default_controller_rate_limiter(
                options.rate_limit_base,
                options.rate_limit_cap,
                options.rate_limit_qps,
                options.rate_limit_burst,
                clock=self.clock,
            ),
        )
        metrics.track_queue(self.queue, CONTROLLER)
        metrics.init_controller(CONTROLLER, options.workers)
        self.expectations = Expectations(self.clock)
        self.tombstones = Tombstones(self.clock)
        self.status_writes = StatusWrites(self.clock)
        self.events = EventRecorder(
            events_client or client,
            clock=self.clock,
            on_drop=metrics.events_dropped.inc,
            writers=EVENT_WRITERS,
            max_similar=EVENT_MAX_SIMILAR,
        )
        metrics.events_pending.set_function(lambda: self.events.pending)
        self.gang = detect_gang_scheduler(client)
        if self.gang:
            logger.info("gang scheduling available through %s PodGroups", self.gang)
        self.informers: list[Informer] = []
        self.optional: set[str] = set()
        self.jobs = self._informer(TRAININGJOBS, label_selector=None).store
        self.pods = self._informer(PODS, indexers={BY_NODE: by_node}, transform=pod_essentials).store
        owned_resources = [SERVICES, CONFIGMAPS, SERVICEACCOUNTS, ROLES, ROLEBINDINGS, PVCS]
        if self.gang:
            owned_resources.append(
                POD_GROUP_RESOURCES[
                    contract.COSCHEDULING_GROUP_VERSION
                    if self.gang == contract.GANG_COSCHEDULING
                    else contract.VOLCANO_GROUP_VERSION
                ]
            )
        owned = {
            res.kind: self._informer(
                res, transform=share_trainer_sources if res == CONFIGMAPS else None
            ).store
            for res in owned_resources
        }
        node_informer = self._informer(NODES, label_selector=None, cluster=True, transform=node_readiness)
        self.optional.add(node_informer.name)
        self._wire_handlers()
        self.executor = ThreadPoolExecutor(
            max_workers=options.create_concurrency, thread_name_prefix="create"
        )
        self.reconciler = Reconciler(
            client,
            Caches(self.jobs, self.pods, owned, node_informer.store, node_informer.has_synced),
            expectations=self.expectations,
            status_writes=self.status_writes,
            events=self.events,
            metrics=metrics,
            clock=self.clock,
            executor=self.executor,
            settings=options.settings,
            gang=self.gang,
            tombstones=self.tombstones,
        )
        self.metrics.track_jobs(self.jobs.list, self.clock)
        lock = LeaseLock(lease_client, options.lease_namespace, options.lease_name)
        self.elector = LeaderElector(
            lock,
            options.identity,
            self.clock,
            lease_duration=options.lease_duration,
            renew_deadline=options.renew_deadline,
            retry_period=options.retry_period,
            on_started_leading=self._start_workers,
            on_stopped_leading=self._stop_workers,
            on_new_leader=lambda identity: logger.info(
                "leader is now %s", identity, extra={"leader": identity}
            ),
        )
        # A standby must publish 0, not nothing: "exactly one replica reports 1" is how dashboards and
        # alerts tell one leader from none or two, and an absent series cannot be told from a dead target.
        metrics.set_leader(options.lease_name, False)
        self.workers: list[threading.Thread] = []
        self._leading = threading.Event()
        host, port = parse_address(options.metrics_addr)
        self.server = MetricsServer(
            host, port, metrics.registry, ready=self._readiness(), healthy=self._health
        )

    # ---------------------------------------------------------------------------------- informers

    def _informer(
        self,
        resource: Resource,
        *,
        label_selector: str | None = contract.MANAGED_SELECTOR,
        cluster: bool = False,
        indexers: Mapping[str, Callable[[JsonDict], list[str]]] | None = None,
        transform: Callable[[JsonDict], JsonDict] | None = None,
    ) -> Informer:
        store = Store({**STANDARD_INDEXERS, **(indexers or {})})
        informer = Informer(
            self.client,
            resource,
            store,
            namespace=None if cluster else self.options.namespace,
            label_selector=label_selector,
            clock=self.clock,
            transform=transform,
        )
        self.informers.append(informer)
        return informer

    def _wire_handlers(self) -> None:
        jobs, pods = self.informers[0], self.informers[1]

        def job_changed(obj: JsonDict) -> None:
            key = object_key(obj)
            self.status_writes.observed(key, str(obj["metadata"].get("resourceVersion", "")))
            self.queue.add(key)

        jobs.add_handler(
            on_add=job_changed,
            on_update=lambda _old, new: job_changed(new),
            on_delete=lambda obj: self.queue.add(object_key(obj)),
        )

        def pod_added(obj: JsonDict) -> None:
            key = owner_key(obj)
            if key:
                self.expectations.created(key, obj["metadata"]["name"])
                self.queue.add(key)

        def pod_updated(old: JsonDict, new: JsonDict) -> None:
            key = owner_key(new)
            if key is None:
                foreign_pod_changed(new)
                return
            if new["metadata"].get("deletionTimestamp") and not old["metadata"].get("deletionTimestamp"):
                self.expectations.deleted(key, new["metadata"]["uid"])
            self.queue.add(key)

        def pod_deleted(obj: JsonDict) -> None:
            key = owner_key(obj)
            if key:
                self.expectations.deleted(key, obj["metadata"]["uid"])
                if podstate.disruption_reason(obj) is not None or podstate.phase(obj) == "Failed":
                    self.tombstones.record(key, obj)
                self.queue.add(key)
            else:
                foreign_pod_changed(obj)

        def foreign_pod_changed(obj: JsonDict) -> None:
            """A pod with the job's labels but not owned by it may be what blocks the job (it holds a
            rank's name); when it changes or goes, the job tries again at once."""
            job = (obj["metadata"].get("labels") or {}).get(contract.JOB_NAME_LABEL)
            if job:
                self.queue.add(f"{obj['metadata'].get('namespace')}/{job}")

        pods.add_handler(on_add=pod_added, on_update=pod_updated, on_delete=pod_deleted)

        def owned_changed(obj: JsonDict) -> None:
            key = owner_key(obj)
            if key:
                self.queue.add(key)

        for informer in self.informers[2:]:
            if informer.resource == NODES:
                informer.add_handler(
                    on_update=self._node_changed, on_delete=self._node_gone, on_add=self._node_gone
                )
            else:
                informer.add_handler(
                    on_add=owned_changed,
                    on_update=lambda _old, new: owned_changed(new),
                    on_delete=owned_changed,
                )

    def _jobs_on_node(self, node: str) -> None:
        for pod in self.pods.by_index(BY_NODE, node):
            key = owner_key(pod)
            if key:
                self.queue.add(key)

    def _node_changed(self, old: JsonDict, new: JsonDict) -> None:
        if old.get("status") != new.get("status"):
            self._jobs_on_node(new["metadata"]["name"])

    def _node_gone(self, obj: JsonDict) -> None:
        self._jobs_on_node(obj["metadata"]["name"])

    # ------------------------------------------------------------------------------ health checks

    def _readiness(self) -> Mapping[str, Callable[[], tuple[bool, str]]]:
        checks: dict[str, Callable[[], tuple[bool, str]]] = {}
        for informer in self.informers:
            if informer.name in self.optional:
                continue
            checks[f"informer {informer.name}"] = _informer_check(informer)
        return checks

    def _health(self) -> tuple[bool, str]:
        if self.lost_leadership.is_set():
            return False, "lost the leader lease"
        dead = [thread.name for thread in self.workers if not thread.is_alive()]
        if self._leading.is_set() and dead and not self.stop_event.is_set():
            return False, f"worker threads died: {', '.join(dead)}"
        return True, "ok"

    # -------------------------------------------------------------------------------------- workers

    def _start_workers(self) -> None:
        self.metrics.set_leader(self.options.lease_name, True)
        logger.info("became the leader; starting %d workers", self.options.workers)
        self._leading.set()
        for job in self.jobs.list():
            self.queue.add(object_key(job))
        for index in range(self.options.workers):
            thread = threading.Thread(target=self._work, name=f"worker-{index}", daemon=True)
            thread.start()
            self.workers.append(thread)

    def _stop_workers(self) -> None:
        self.metrics.set_leader(self.options.lease_name, False)
        if not self.stop_event.is_set():
            logger.error("lost the leader lease; stopping (crash-only: a standby takes over)")
            self.lost_leadership.set()
            self.stop_event.set()
        logger.info("draining workers")
        self.queue.shut_down_with_drain()
        for thread in self.workers:
            thread.join(timeout=30)
        self._leading.clear()

    def _work(self) -> None:
        while True:
            key, shutting_down = self.queue.get()
            if shutting_down or key is None:
                return
            try:
                self._process(key)
            finally:
                self.queue.done(key)

    def _process(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        metrics = self.metrics
        active = metrics.active_workers.labels(controller=CONTROLLER)
        active.inc()
        start = self.clock.monotonic()
        with log_context(namespace=namespace, name=name, reconcile_id=new_reconcile_id()):
            try:
                result = self.reconciler.reconcile(key)
            except Exception as error:
                outcome = "error"
                retries = self.queue.num_requeues(key)
                logger.warning(
                    "reconcile failed; retrying with backoff (attempt %d): %s",
                    retries + 1,
                    error,
                    exc_info=not isinstance(error, KubeError),
                    extra={"action": "retry"},
                )
                metrics.reconcile_errors.labels(controller=CONTROLLER).inc()
                metrics.reconciliation_errors.labels(
                    namespace=namespace, error_type=type(error).__name__
                ).inc()
                self.queue.add_rate_limited(key)
            else:
                outcome = self._requeue(key, result)
            finally:
                elapsed = self.clock.monotonic() - start
                active.dec()
        metrics.reconcile_total.labels(controller=CONTROLLER, result=outcome).inc()
        metrics.reconcile_time.labels(controller=CONTROLLER).observe(elapsed)
        metrics.reconciliations.labels(namespace=namespace, result=outcome).inc()
        metrics.reconciliation_duration.labels(namespace=namespace).observe(elapsed)

    def _requeue(self, key: str, result: Result) -> str:
        if result.rate_limited:
            self.queue.add_rate_limited(key)
            return "requeue"
        self.queue.forget(key)
        if result.requeue_after is not None:
            self.queue.add_after(key, result.requeue_after)
            return "requeue_after"
        return "success"

    # ---------------------------------------------------------------------------------------- run

    def run(self) -> int:
        """Runs until SIGTERM/SIGINT (stop_event) or the loss of the lease; returns the exit code."""
        port = self.server.start()
        logger.info("serving /metrics, /healthz and /readyz on port %d", port)
        threads = [
            threading.Thread(
                target=informer.run, args=(self.stop_event,), name=f"informer-{informer.name}", daemon=True
            )
            for informer in self.informers
        ]
        for thread in threads:
            thread.start()
        resync = threading.Thread(target=self._resync, name="resync", daemon=True)
        resync.start()
        required = [informer for informer in self.informers if informer.name not in self.optional]
        while not self.stop_event.is_set() and not all(informer.has_synced() for informer in required):
            self.stop_event.wait(0.1)
        if not self.stop_event.is_set():
            logger.info("caches synced")
            if self.options.leader_elect:
                self.elector.run(self.stop_event)
            else:
                self._start_workers()
                self.stop_event.wait()
                self._stop_workers()
        for informer in self.informers:
            informer.stop()
        self.events.stop(timeout=5)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.server.stop()
        code = 1 if self.lost_leadership.is_set() else 0
        logger.info("stopped", extra={"exit_code": code})
        return code

    def _resync(self) -> None:
        """Periodically re-queues every job from the cache (no API call), as client-go's resync does."""
        while not self.stop_event.wait(self.options.resync_period):
            if self._leading.is_set():
                for job in self.jobs.list():
                    self.queue.add(object_key(job))

    def shutdown(self) -> None:
        logger.info("shutting down")
        self.stop_event.set()


def _informer_check(informer: Informer) -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        if not informer.has_synced():
            return False, "not synced"
        error = informer.last_sync_error
        if error is not None:
            return False, f"watch failing: {error}"
        return True, "ok"

    return check
