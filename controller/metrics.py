"""Prometheus metrics and the /metrics, /healthz and /readyz endpoints of the operator.

Why this module exists: an operator is only operable if people can see what it does. Dashboards and
alerts written for Go operators read controller-runtime's and client-go's metric names
(`controller_runtime_reconcile_total`, `workqueue_depth`, `rest_client_requests_total`, ...), so this
module publishes the same names, labels and histogram buckets; the product's own `trainingjob_*`
series sit next to them. Everything lives in one `CollectorRegistry` per process (never the global
default registry, so tests and embedders never see each other's series) and the `_created` series are
switched off, as Go clients have none.

Cardinality is bounded on purpose: no series is labelled by pod, and series labelled by job exist only
while the job exists, because they are computed at scrape time from the informer cache
(`JobCollector`) instead of being stored in long-lived gauges that would outlive deleted jobs.

Work queue "unfinished work" gauges: client-go refreshes them from a goroutine every 500 ms. Here a
custom collector asks each tracked queue at scrape time instead (`WorkQueue.update_unfinished_work`),
which needs no thread, costs nothing between scrapes and is never up to half a second stale.

Listening address: `parse_address` reads Go-style `host:port` strings. An empty host (":8080") means
every interface, like Go's `net.Listen`, which is what the operator needs inside a cluster so that
Prometheus can scrape the pod IP; "127.0.0.1:8080" listens on loopback only, which is what local
development uses.
"""

from __future__ import annotations

import gzip
import logging
import math
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, cast
from urllib.parse import parse_qs, urlsplit

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from controller.clock import Clock, RealClock, parse_time
from controller.workqueue import WorkQueue
from crd.schema_status import STATES

logger = logging.getLogger("controller.metrics")

JsonObject = dict[str, Any]
Check = Callable[[], tuple[bool, str]]

# controller-runtime's buckets for controller_runtime_reconcile_time_seconds (and, in the versions that
# registered it, rest_client_request_duration_seconds).
RECONCILE_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0,
    30.0, 40.0, 50.0, 60.0,
)  # fmt: skip
# client-go's workqueue histograms: 12 exponential buckets from 10 ns to 1000 s.
WORKQUEUE_BUCKETS: Final = tuple(10.0**exponent for exponent in range(-8, 4))
# From "pods created" to "every worker running": image pulls and gang scheduling take minutes to hours.
TIME_TO_RUNNING_BUCKETS: Final = (
    1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0,
)  # fmt: skip
# Training runs last from minutes to weeks.
TIME_TO_COMPLETE_BUCKETS: Final = (
    60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0, 86400.0, 172800.0, 345600.0,
    604800.0, 1209600.0,
)  # fmt: skip

# Values of controller_runtime_reconcile_total{result} and trainingjob_reconciliation_total{result}.
RECONCILE_RESULTS: Final = ("success", "error", "requeue", "requeue_after")
# Values of trainingjob_restarts_total{reason}: the causes counted in status.restarts, plus "other".
RESTART_REASONS: Final = ("failure", "disruption", "scheduling", "stall")
OTHER: Final = "other"
# A job without status.state has not been seen by the operator yet.
INITIAL_STATE: Final = "Pending"


def restart_reason(reason: str) -> str:
    """Maps a restart cause to the fixed label set of trainingjob_restarts_total (unknown -> "other").

    Returns the plain string, so a `str` enum member (e.g. `failures.Cause`) becomes its value.
    """
    return next((known for known in RESTART_REASONS if known == reason), OTHER)


def _disable_created_series() -> None:
    """Go clients publish no `*_created` series; prometheus_client's switch for that is process-wide."""
    disable_created_metrics()  # type: ignore[no-untyped-call]


def new_registry() -> CollectorRegistry:
    """A fresh registry for one process; also turns off the `_created` series."""
    _disable_created_series()
    return CollectorRegistry(auto_describe=True)


class Metrics:
    """Every metric of the operator, registered in one registry; callers use the attributes directly:

    `metrics.restarts.labels(namespace=ns, reason=restart_reason(cause)).inc()`.
    """

    registry: CollectorRegistry
    # controller-runtime
    reconcile_total: Counter
    reconcile_errors: Counter
    reconcile_time: Histogram
    active_workers: Gauge
    max_concurrent_reconciles: Gauge
    # client-go work queue
    workqueue_depth: Gauge
    workqueue_adds: Counter
    workqueue_retries: Counter
    workqueue_queue_duration: Histogram
    workqueue_work_duration: Histogram
    # client-go leader election and REST client
    leader_election_master_status: Gauge
    rest_requests: Counter
    rest_request_duration: Histogram
    # trainingjob_*: event-driven, owned by the reconciler
    created: Counter
    completed: Counter
    failed: Counter
    restarts: Counter
    time_to_running: Histogram
    time_to_complete: Histogram
    reconciliations: Counter
    reconciliation_duration: Histogram
    reconciliation_errors: Counter
    invalid_spec: Counter
    events_dropped: Counter
    events_pending: Gauge

    def __init__(self, registry: CollectorRegistry | None = None, *, process_metrics: bool = True) -> None:
        self.registry = registry if registry is not None else new_registry()
        _disable_created_series()
        r = self.registry
        if process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)

        self.reconcile_total = Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ["controller"],
            registry=r,
        )
        self.reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.active_workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ["controller"],
            registry=r,
        )
        self.max_concurrent_reconciles = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
            registry=r,
        )

        queue_labels = ["name", "controller"]
        self.workqueue_depth = Gauge(
            "workqueue_depth", "Current depth of workqueue", queue_labels, registry=r
        )
        self.workqueue_adds = Counter(
            "workqueue_adds_total", "Total number of adds handled by workqueue", queue_labels, registry=r
        )
        self.workqueue_retries = Counter(
            "workqueue_retries_total",
            "Total number of retries handled by workqueue",
            queue_labels,
            registry=r,
        )
        self.workqueue_queue_duration = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            queue_labels,
            buckets=WORKQUEUE_BUCKETS,
            registry=r,
        )
        self.workqueue_work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            queue_labels,
            buckets=WORKQUEUE_BUCKETS,
            registry=r,
        )
        self._queues = WorkQueueCollector()
        r.register(self._queues)

        self.leader_election_master_status = Gauge(
            "leader_election_master_status",
            "1 while this process holds the lease called 'name', 0 while it is a standby",
            ["name"],
            registry=r,
        )
        self.rest_requests = Counter(
            "rest_client_requests_total",
            "Number of HTTP requests, partitioned by status code, method, and host",
            ["code", "method", "host"],
            registry=r,
        )
        self.rest_request_duration = Histogram(
            "rest_client_request_duration_seconds",
            "Request latency in seconds, by verb and host",
            ["verb", "host"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )

        self.created = Counter(
            "trainingjob_created_total", "TrainingJobs first seen by the operator", ["namespace"], registry=r
        )
        self.completed = Counter(
            "trainingjob_completed_total",
            "TrainingJobs that finished, by result (the terminal state or reason)",
            ["namespace", "result"],
            registry=r,
        )
        self.failed = Counter(
            "trainingjob_failed_total",
            "TrainingJobs that failed, by reason",
            ["namespace", "reason"],
            registry=r,
        )
        self.restarts = Counter(
            "trainingjob_restarts_total",
            "Gang restarts of TrainingJobs, by cause (failure, disruption, scheduling, stall, other)",
            ["namespace", "reason"],
            registry=r,
        )
        self.time_to_running = Histogram(
            "trainingjob_time_to_running_seconds",
            "Seconds from a job's creation until every worker first runs",
            ["namespace"],
            buckets=TIME_TO_RUNNING_BUCKETS,
            registry=r,
        )
        self.time_to_complete = Histogram(
            "trainingjob_time_to_complete_seconds",
            "Seconds from a job's creation until it finished, by result",
            ["namespace", "result"],
            buckets=TIME_TO_COMPLETE_BUCKETS,
            registry=r,
        )
        self.reconciliations = Counter(
            "trainingjob_reconciliation_total",
            "Reconciliations of TrainingJobs, by result (success, error, requeue, requeue_after)",
            ["namespace", "result"],
            registry=r,
        )
        self.reconciliation_duration = Histogram(
            "trainingjob_reconciliation_duration_seconds",
            "Seconds per reconciliation of a TrainingJob",
            ["namespace"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.reconciliation_errors = Counter(
            "trainingjob_reconciliation_errors_total",
            "Failed reconciliations of TrainingJobs, by error type",
            ["namespace", "error_type"],
            registry=r,
        )
        self.invalid_spec = Counter(
            "trainingjob_invalid_spec_total",
            "Reconciliations that found a spec the operator cannot run",
            ["namespace"],
            registry=r,
        )
        self.events_dropped = Counter(
            "trainingjob_events_dropped_total",
            "Kubernetes Events not written because the event queue was full",
            registry=r,
        )
        self.events_pending = Gauge(
            "trainingjob_events_pending",
            "Kubernetes Events recorded and not yet written (queued or being written)",
            registry=r,
        )

    def init_controller(self, controller: str, max_concurrent_reconciles: int) -> None:
        """Publishes a controller's worker count and zero counters, so rate() works from the first scrape."""
        self.max_concurrent_reconciles.labels(controller=controller).set(max_concurrent_reconciles)
        self.active_workers.labels(controller=controller).set(0)
        for result in RECONCILE_RESULTS:
            self.reconcile_total.labels(controller=controller, result=result)
        self.reconcile_errors.labels(controller=controller)

    def queue_metrics(self, name: str, controller: str) -> PrometheusQueueMetrics:
        return PrometheusQueueMetrics(self, name, controller)

    def track_queue(self, queue: WorkQueue, controller: str) -> None:
        """Publishes the queue's unfinished-work gauges, computed at each scrape."""
        self._queues.track(queue, controller)

    def rest_metrics(self) -> PrometheusRestMetrics:
        return PrometheusRestMetrics(self)

    def set_leader(self, lease_name: str, leader: bool) -> None:
        self.leader_election_master_status.labels(name=lease_name).set(1.0 if leader else 0.0)

    def track_jobs(
        self, list_jobs: Callable[[], Sequence[JsonObject]], clock: Clock | None = None
    ) -> JobCollector:
        """Registers a `JobCollector` reading TrainingJobs from `list_jobs` (the informer cache)."""
        collector = JobCollector(list_jobs, clock)
        self.registry.register(collector)
        return collector


class PrometheusQueueMetrics:
    """The `QueueMetrics` of one work queue: children bound once, so the hooks (run under the queue's
    lock) do no label lookups."""

    def __init__(self, metrics: Metrics, name: str, controller: str) -> None:
        labels = {"name": name, "controller": controller}
        self._depth = metrics.workqueue_depth.labels(**labels)
        self._adds = metrics.workqueue_adds.labels(**labels)
        self._retries = metrics.workqueue_retries.labels(**labels)
        self._queue_duration = metrics.workqueue_queue_duration.labels(**labels)
        self._work_duration = metrics.workqueue_work_duration.labels(**labels)
        self._depth.set(0)

    def on_add(self, depth: int) -> None:
        self._adds.inc()
        self._depth.set(depth)

    def on_get(self, depth: int, queue_seconds: float) -> None:
        self._depth.set(depth)
        self._queue_duration.observe(max(0.0, queue_seconds))

    def on_done(self, work_seconds: float) -> None:
        self._work_duration.observe(max(0.0, work_seconds))

    def on_retry(self) -> None:
        self._retries.inc()

    def on_unfinished_work(self, unfinished_seconds: float, longest_running_seconds: float) -> None:
        """Nothing to store: `WorkQueueCollector` reads these values from the queue at scrape time."""


class PrometheusRestMetrics:
    """The `RestMetrics` of `KubeClient`: rest_client_requests_total and the request latency."""

    def __init__(self, metrics: Metrics) -> None:
        self._requests = metrics.rest_requests
        self._duration = metrics.rest_request_duration

    def request(self, code: str, method: str, host: str) -> None:
        self._requests.labels(code=code, method=method, host=host).inc()

    def observe_duration(self, verb: str, host: str, seconds: float) -> None:
        self._duration.labels(verb=verb, host=host).observe(max(0.0, seconds))


class WorkQueueCollector:
    """workqueue_unfinished_work_seconds and workqueue_longest_running_processor_seconds, per queue."""

    _UNFINISHED: Final = "workqueue_unfinished_work_seconds"
    _LONGEST: Final = "workqueue_longest_running_processor_seconds"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: list[tuple[WorkQueue, str]] = []

    def track(self, queue: WorkQueue, controller: str) -> None:
        with self._lock:
            self._queues.append((queue, controller))

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        labels = ["name", "controller"]
        return (
            GaugeMetricFamily(
                self._UNFINISHED,
                "How many seconds of work has been done that is in progress and has not been observed by "
                "work_duration. Large values indicate stuck threads.",
                labels=labels,
            ),
            GaugeMetricFamily(
                self._LONGEST,
                "How many seconds the longest running processor for workqueue has been running.",
                labels=labels,
            ),
        )

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        unfinished, longest = self._families()
        with self._lock:
            queues = list(self._queues)
        for queue, controller in queues:
            total, longest_running = queue.update_unfinished_work()
            unfinished.add_metric([queue.name, controller], total)
            longest.add_metric([queue.name, controller], longest_running)
        return unfinished, longest


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _percent(value: object) -> float | None:
    if isinstance(value, str):
        try:
            return _number(float(value.strip().rstrip("%").strip()))
        except ValueError:
            return None
    return _number(value)


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class JobCollector:
    """The per-job `trainingjob_*` gauges, computed at scrape time from the TrainingJobs in the cache.

    Series exist exactly while their job exists; a value the trainer has not reported (loss, accuracy,
    GPU utilisation) has no series rather than a made-up zero.
    """

    _JOB: Final = ("namespace", "training_job")
    _SCALARS: Final = (
        ("trainingjob_progress_percent", "Training progress in percent (status.progress)"),
        ("trainingjob_current_epoch", "Epoch the trainer last reported (status.currentEpoch)"),
        ("trainingjob_total_epochs", "Epochs planned (status.totalEpochs)"),
        ("trainingjob_loss", "Latest loss reported by rank 0 (status.metrics.loss)"),
        ("trainingjob_accuracy", "Latest accuracy reported by rank 0 (status.metrics.accuracy)"),
        (
            "trainingjob_gpu_utilization_percent",
            "Latest GPU utilisation in percent reported by rank 0 (status.metrics.gpu_utilization)",
        ),
        (
            "trainingjob_allocated_gpus",
            "GPUs requested by the current attempt's pods (status.resources.gpus)",
        ),
        ("trainingjob_allocated_workers", "Worker pods of the current attempt (status.resources.workers)"),
        ("trainingjob_gang_restarts", "Gang restarts of any cause (status.restartCount)"),
    )

    def __init__(self, list_jobs: Callable[[], Sequence[JsonObject]], clock: Clock | None = None) -> None:
        self._list_jobs = list_jobs
        self._clock: Clock = clock or RealClock()

    def _families(self) -> dict[str, GaugeMetricFamily]:
        families = {
            "trainingjob_jobs": GaugeMetricFamily(
                "trainingjob_jobs", "TrainingJobs by namespace and state", labels=["namespace", "state"]
            ),
            "trainingjob_duration_seconds": GaugeMetricFamily(
                "trainingjob_duration_seconds",
                "Seconds from the job's start to its completion, or to now while it has not finished",
                labels=[*self._JOB, "state"],
            ),
        }
        for name, documentation in self._SCALARS:
            families[name] = GaugeMetricFamily(name, documentation, labels=list(self._JOB))
        return families

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        try:
            jobs = list(self._list_jobs())
        except Exception:
            logger.exception("listing TrainingJobs for metrics failed")
            return list(families.values())
        now = self._clock.now()
        by_state: dict[str, dict[str, int]] = {}
        for job in jobs:
            try:
                self._add_job(families, by_state, job, now)
            except Exception:
                logger.exception("skipping a TrainingJob the metrics cannot read")
        jobs_family = families["trainingjob_jobs"]
        for namespace, counts in sorted(by_state.items()):
            for state, count in counts.items():
                jobs_family.add_metric([namespace, state], count)
        return list(families.values())

    def _add_job(
        self,
        families: dict[str, GaugeMetricFamily],
        by_state: dict[str, dict[str, int]],
        job: JsonObject,
        now: datetime,
    ) -> None:
        metadata = _mapping(job.get("metadata"))
        namespace = str(metadata.get("namespace") or "")
        name = str(metadata.get("name") or "")
        if not name:
            return
        status = _mapping(job.get("status"))
        state_value = status.get("state")
        state = state_value if isinstance(state_value, str) and state_value else INITIAL_STATE
        counts = by_state.setdefault(namespace, dict.fromkeys(STATES, 0))
        counts[state] = counts.get(state, 0) + 1

        reported = _mapping(status.get("metrics"))
        resources = _mapping(status.get("resources"))
        values: dict[str, float | None] = {
            "trainingjob_progress_percent": _percent(status.get("progress")),
            "trainingjob_current_epoch": _number(status.get("currentEpoch")),
            "trainingjob_total_epochs": _number(status.get("totalEpochs")),
            "trainingjob_loss": _number(reported.get("loss")),
            "trainingjob_accuracy": _number(reported.get("accuracy")),
            "trainingjob_gpu_utilization_percent": _number(reported.get("gpu_utilization")),
            "trainingjob_allocated_gpus": _number(resources.get("gpus")),
            "trainingjob_allocated_workers": _number(resources.get("workers")),
            "trainingjob_gang_restarts": _number(status.get("restartCount")) or 0.0,
        }
        labels = [namespace, name]
        for family_name, value in values.items():
            if value is not None:
                families[family_name].add_metric(labels, value)

        started = _time(status.get("startTime"))
        if started is not None:
            finished = _time(status.get("completionTime")) or now
            seconds = max(0.0, (finished - started).total_seconds())
            families["trainingjob_duration_seconds"].add_metric([*labels, state], seconds)


# ---- HTTP endpoints ----------------------------------------------------------------------------------


def parse_address(text: str) -> tuple[str, int]:
    """Parses a Go-style listen address: "host:port", "[ipv6]:port" or ":port".

    An empty host means every interface (IPv4 and, where available, IPv6), like Go's net.Listen; use
    "127.0.0.1:port" to listen on loopback only. Port 0 asks the kernel for a free port.
    """
    host, separator, port_text = text.strip().rpartition(":")
    if not separator:
        raise ValueError(f"invalid listen address {text!r}: expected host:port or :port")
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            raise ValueError(f"invalid listen address {text!r}: unbalanced brackets")
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"invalid listen address {text!r}: write IPv6 addresses as [address]:port")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"invalid listen address {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"invalid listen address {text!r}: port must be between 0 and 65535")
    return host, port


def _normalise_checks(checks: Check | Mapping[str, Check], default_name: str) -> dict[str, Check]:
    if callable(checks):
        return {default_name: checks}
    return dict(checks)


def _run_check(check: Check) -> tuple[bool, str]:
    try:
        ok, reason = check()
    except Exception as exc:
        logger.exception("health check raised")
        return False, f"check raised {type(exc).__name__}: {exc}"
    return bool(ok), str(reason)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: MetricsServer, *, dual_stack: bool) -> None:
        self.app = app
        self._dual_stack = dual_stack
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self._dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # HTTPServer.server_bind would resolve our own name (socket.getfqdn), a DNS lookup that can hang.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "trainingjob-operator"
    # Idle keep-alive connections are closed after this many seconds.
    timeout = 60

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        app = cast(_HttpServer, self.server).app
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        query = parse_qs(split.query, keep_blank_values=True)
        if path == "/metrics":
            self._metrics(app, query)
        elif path in ("/healthz", "/livez"):
            self._checks("healthz", app.health_checks, query)
        elif path == "/readyz":
            self._checks("readyz", app.ready_checks, query)
        else:
            self._send(404, b"404 page not found\n")

    def _metrics(self, app: MetricsServer, query: dict[str, list[str]]) -> None:
        try:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            registry: Collector = app.registry
            names = query.get("name[]")
            if names:
                registry = app.registry.restricted_registry(names)
            body = encoder(registry)
        except Exception:
            logger.exception("rendering metrics failed")
            self._send(500, b"rendering metrics failed\n")
            return
        headers = {}
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, content_type, headers)

    def _checks(self, endpoint: str, checks: Mapping[str, Check], query: dict[str, list[str]]) -> None:
        results = {name: _run_check(check) for name, check in checks.items()}
        healthy = all(ok for ok, _ in results.values())
        if "verbose" in query:
            lines = ["[+]ping ok"]
            for name, (ok, reason) in results.items():
                lines.append(f"[+]{name} ok" if ok else f"[-]{name} failed: {reason}")
            lines.append(f"{endpoint} check {'passed' if healthy else 'failed'}")
            self._send(200 if healthy else 503, ("\n".join(lines) + "\n").encode())
            return
        if healthy:
            self._send(200, b"ok")
            return
        failed = [(name, reason) for name, (ok, reason) in results.items() if not ok]
        if len(results) == 1:
            text = failed[0][1]
        else:
            text = "\n".join(f"{name}: {reason}" for name, reason in failed)
        self._send(503, (text + "\n").encode())

    def _send(
        self,
        code: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class MetricsServer:
    """Serves /metrics, /healthz (alias /livez) and /readyz from a daemon thread.

    `ready` and `healthy` are checks returning `(ok, reason)`, or mappings of named checks; /readyz and
    /healthz answer 200 "ok", or 503 with the failing reasons; `?verbose` lists every check the way
    Kubernetes components do. Request logging is off (probes would flood the logs).
    """

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        *,
        ready: Check | Mapping[str, Check],
        healthy: Check | Mapping[str, Check],
    ) -> None:
        self.host = host
        self.registry = registry
        self.ready_checks = _normalise_checks(ready, "ready")
        self.health_checks = _normalise_checks(healthy, "healthy")
        self._requested_port = port
        self._server: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        """The bound port once started (the requested one before)."""
        with self._lock:
            return self._server.server_port if self._server is not None else self._requested_port

    def start(self) -> int:
        """Binds and starts serving; returns the bound port (useful with port 0)."""
        with self._lock:
            if self._server is not None:
                return self._server.server_port
            host = self.host
            dual_stack = False
            if not host:
                dual_stack = socket.has_dualstack_ipv6()
                host = "::" if dual_stack else "0.0.0.0"  # noqa: S104 - ":port" means every interface
            server = _HttpServer((host, self._requested_port), self, dual_stack=dual_stack)
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="metrics-server", daemon=True
            )
            thread.start()
            self._server, self._thread = server, thread
            logger.info(
                "serving metrics and health checks",
                extra={"address": f"{host}:{server.server_port}"},
            )
            return server.server_port

    def stop(self, timeout: float = 5.0) -> None:
        """Stops accepting requests and closes the listening socket."""
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout)
