"""Wires the runtime together: watches -> work queue -> worker threads -> reconciler.

Building a `Manager` talks to nothing; `run()` does, in the order client-go controllers use: serve
the probes and /metrics (unless the caller started the servers already), find out which optional APIs
(a gang scheduler's PodGroups, Kueue) the cluster serves (discovery.py, which decides what is watched,
and asks again every --discovery-interval), start the caches (standbys keep them warm too), and start
workers only after every required cache has synced and this process leads. Shutdown runs the other
way: workers drain, the lease is released (a standby takes over at once), informers stop. Losing the
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

from builders.podgroup import GangScheduler
from controller import planner
from controller.discovery import Discovery
from controller.guards_watch import GuardsWatch
from controller.metrics import Metrics
from controller.reconciler import Reconciler, Result
from controller.resources import GANG_SCHEDULER_CHOICES
from controller.runtime.authfilter import DelegatingAuth
from controller.runtime.client import KubeClient
from controller.runtime.clock import Clock, RealClock
from controller.runtime.errors import KubeError
from controller.runtime.events import EventRecorder
from controller.runtime.expectations import Expectations
from controller.runtime.informer import Informer
from controller.runtime.leaderelection import LeaderElector, LeaseLock
from controller.runtime.logs import log_context, new_reconcile_id
from controller.runtime.ratelimit import default_controller_rate_limiter
from controller.runtime.serving import MetricsServer, Probes, ProbeServer, parse_address
from controller.runtime.servingcert import ServingCertificate
from controller.runtime.store import object_key
from controller.runtime.trackers import StatusWrites
from controller.runtime.workqueue import WorkQueue
from controller.watches import RESYNC_PRIORITY, Watches
from crd import contract

logger = logging.getLogger(__name__)

CONTROLLER = "trainingjob"
# Threads writing Events; each object's Events stay on one of them, in order.
EVENT_WRITERS = 4
# Distinct messages of one reason per job before Events fold into a combined one (client-go: 10): a
# job's changes of state with their messages ("Running: 3/4 workers running", ...) keep their own Events.
EVENT_MAX_SIMILAR = 128
# A listen address that turns a server off, as controller-runtime's bind address flags take it.
DISABLED = "0"


@dataclass(frozen=True)
class Options:
    namespace: str | None = None
    workers: int = 4
    # /metrics (HTTPS when the Manager is given a certificate) and the probes, each on its own port.
    metrics_bind_address: str = ":8443"
    health_probe_bind_address: str = ":8081"
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
    # How often the cluster is asked again which optional APIs (PodGroups, Kueue) it serves.
    discovery_interval: float = 30.0
    # --gang-scheduler: the gang schedulers to use, in order of preference (controller/resources.py).
    gang_preference: tuple[GangScheduler, ...] = GANG_SCHEDULER_CHOICES["auto"]
    settings: planner.Settings = field(default_factory=planner.Settings)


class WorkerPool:
    """Worker threads taking job keys off the queue, one reconcile at a time per key, with the
    controller-runtime metrics of each reconcile and client-go's requeue rules for its result."""

    def __init__(self, queue: WorkQueue, reconciler: Reconciler, metrics: Metrics, clock: Clock) -> None:
        self._queue = queue
        self._reconciler = reconciler
        self._metrics = metrics
        self._clock = clock
        self.threads: list[threading.Thread] = []

    def start(self, count: int) -> None:
        for index in range(count):
            thread = threading.Thread(target=self._work, name=f"worker-{index}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def join(self, timeout: float) -> None:
        for thread in self.threads:
            thread.join(timeout=timeout)

    def dead(self) -> list[str]:
        return [thread.name for thread in self.threads if not thread.is_alive()]

    def _work(self) -> None:
        while True:
            key, shutting_down = self._queue.get()
            if shutting_down or key is None:
                return
            try:
                self._process(key)
            finally:
                self._queue.done(key)

    def _process(self, key: str) -> None:
        namespace, _, name = key.partition("/")
        metrics = self._metrics
        active = metrics.active_workers.labels(controller=CONTROLLER)
        active.inc()
        start = self._clock.monotonic()
        with log_context(namespace=namespace, name=name, reconcile_id=new_reconcile_id()):
            try:
                result = self._reconciler.reconcile(key)
            except Exception as error:
                outcome = "error"
                retries = self._queue.num_requeues(key)
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
                self._queue.add_rate_limited(key)
            else:
                outcome = self._requeue(key, result)
            finally:
                elapsed = self._clock.monotonic() - start
                active.dec()
        metrics.reconcile_total.labels(controller=CONTROLLER, result=outcome).inc()
        metrics.reconcile_time.labels(controller=CONTROLLER).observe(elapsed)
        metrics.reconciliations.labels(namespace=namespace, result=outcome).inc()
        metrics.reconciliation_duration.labels(namespace=namespace).observe(elapsed)

    def _requeue(self, key: str, result: Result) -> str:
        if result.rate_limited:
            self._queue.add_rate_limited(key)
            return "requeue"
        self._queue.forget(key)
        if result.requeue_after is not None:
            self._queue.add_after(key, result.requeue_after)
            return "requeue_after"
        return "success"


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
        metrics_certificate: ServingCertificate | None = None,
        metrics_auth: DelegatingAuth | None = None,
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
        self.status_writes = StatusWrites(self.clock)
        self.events = EventRecorder(
            events_client or client,
            contract.OPERATOR_NAME,
            clock=self.clock,
            on_drop=metrics.events_dropped.inc,
            writers=EVENT_WRITERS,
            max_similar=EVENT_MAX_SIMILAR,
            start=False,
        )
        metrics.events_pending.set_function(lambda: self.events.pending)
        self.watches = Watches(
            client,
            self.queue,
            self.clock,
            namespace=options.namespace,
            expectations=self.expectations,
            status_writes=self.status_writes,
        )
        self.guards = GuardsWatch(self.watches)
        self.executor = ThreadPoolExecutor(
            max_workers=options.create_concurrency, thread_name_prefix="create"
        )
        self.reconciler = Reconciler(
            client,
            self.watches.caches,
            expectations=self.expectations,
            status_writes=self.status_writes,
            events=self.events,
            metrics=metrics,
            clock=self.clock,
            executor=self.executor,
            executor_size=options.create_concurrency,
            settings=options.settings,
        )
        self.reconciler.guards = self.guards.snapshot
        self.workers = WorkerPool(self.queue, self.reconciler, metrics, self.clock)
        self.metrics.track_jobs(self.watches.caches.jobs.list, self.clock)
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
        self._leading = threading.Event()
        self.probes = Probes(ready=self._readiness(), healthy=self._health)
        self.probe_server: ProbeServer | None = None
        if options.health_probe_bind_address != DISABLED:
            host, port = parse_address(options.health_probe_bind_address)
            self.probe_server = ProbeServer(host, port, self.probes)
        self.metrics_server: MetricsServer | None = None
        if options.metrics_bind_address != DISABLED:
            host, port = parse_address(options.metrics_bind_address)
            self.metrics_server = MetricsServer(
                host, port, metrics.registry, certificate=metrics_certificate, auth=metrics_auth
            )
        self.discovery = Discovery(
            client,
            self.watches,
            self.reconciler,
            self.probes,
            interval=options.discovery_interval,
            gang_preference=options.gang_preference,
        )

    # ---------------------------------------------------------------------------------------- run

    def run(self) -> int:
        """Runs until SIGTERM/SIGINT (stop_event) or the loss of the lease; returns the exit code."""
        for server in self.servers():
            server.start()
        self.discovery.refresh()
        self.events.start()
        threads = [
            threading.Thread(
                target=informer.run, args=(self.stop_event,), name=f"informer-{informer.name}", daemon=True
            )
            for informer in self.watches.informers
        ]
        for thread in threads:
            thread.start()
        resync = threading.Thread(target=self._resync, name="resync", daemon=True)
        resync.start()
        rediscovery = threading.Thread(
            target=self.discovery.run, args=(self.stop_event,), name="discovery", daemon=True
        )
        rediscovery.start()
        while not self.stop_event.is_set() and not all(
            informer.has_synced() for informer in [*self._required(), *self.discovery.informers()]
        ):
            self.stop_event.wait(0.1)
        if not self.stop_event.is_set():
            logger.info("caches synced")
            self.guards.report()
            if self.options.leader_elect:
                self.elector.run(self.stop_event)
            else:
                self._start_workers()
                self.stop_event.wait()
                self._stop_workers()
        for informer in self.watches.informers:
            informer.stop()
        self.discovery.stop()
        self.events.stop(timeout=5)
        self.executor.shutdown(wait=False, cancel_futures=True)
        for server in self.servers():
            server.stop()
        code = 1 if self.lost_leadership.is_set() else 0
        logger.info("stopped", extra={"exit_code": code})
        return code

    def servers(self) -> list[MetricsServer | ProbeServer]:
        """The HTTP servers this manager runs (a bind address of "0" leaves one out)."""
        return [server for server in (self.probe_server, self.metrics_server) if server is not None]

    def shutdown(self) -> None:
        logger.info("shutting down")
        self.stop_event.set()

    def _resync(self) -> None:
        """Periodically re-queues every job from the cache (no API call), as client-go's resync does."""
        while not self.stop_event.wait(self.options.resync_period):
            if self._leading.is_set():
                for job in self.watches.caches.jobs.list():
                    self.queue.add(object_key(job), RESYNC_PRIORITY)

    # ------------------------------------------------------------------------------ health checks

    def _required(self) -> list[Informer]:
        return [informer for informer in self.watches.informers if informer.name not in self.watches.optional]

    def _readiness(self) -> Mapping[str, Callable[[], tuple[bool, str]]]:
        return {f"informer {informer.name}": _informer_check(informer) for informer in self._required()}

    def _health(self) -> tuple[bool, str]:
        if self.lost_leadership.is_set():
            return False, "lost the leader lease"
        dead = self.workers.dead()
        if self._leading.is_set() and dead and not self.stop_event.is_set():
            return False, f"worker threads died: {', '.join(dead)}"
        return True, "ok"

    # ------------------------------------------------------------------------------------ leading

    def _start_workers(self) -> None:
        self.metrics.set_leader(self.options.lease_name, True)
        logger.info("became the leader; starting %d workers", self.options.workers)
        self._leading.set()
        for job in self.watches.caches.jobs.list():
            self.queue.add(object_key(job))
        self.workers.start(self.options.workers)

    def _stop_workers(self) -> None:
        self.metrics.set_leader(self.options.lease_name, False)
        if not self.stop_event.is_set():
            logger.error("lost the leader lease; stopping (crash-only: a standby takes over)")
            self.lost_leadership.set()
            self.stop_event.set()
        logger.info("draining workers")
        self.queue.shut_down_with_drain()
        self.workers.join(timeout=30)
        self._leading.clear()


def _informer_check(informer: Informer) -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        if not informer.has_synced():
            return False, "not synced"
        error = informer.last_sync_error
        if error is not None:
            return False, f"watch failing: {error}"
        return True, "ok"

    return check
