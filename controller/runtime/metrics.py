"""The runtime's Prometheus metrics, under the names dashboards written for Go operators read.

Dashboards and alerts for Go operators read controller-runtime's and client-go's metric names
(`controller_runtime_reconcile_total`, `workqueue_depth`, `rest_client_requests_total`,
`leader_election_master_status`, ...), so the runtime publishes the same names, labels and histogram
buckets. Everything lives in one `CollectorRegistry` per process (never the global default registry,
so tests and embedders never see each other's series) and the `_created` series are switched off, as
Go clients have none. A controller adds its own series by extending `RuntimeMetrics`
(controller/metrics.py).

Work queue "unfinished work" gauges: client-go refreshes them from a goroutine every 500 ms. Here a
custom collector asks each tracked queue at scrape time instead (`WorkQueue.update_unfinished_work`),
which needs no thread, costs nothing between scrapes and is never up to half a second stale.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Final

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
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from controller.runtime.workqueue import WorkQueue

# controller-runtime's buckets for controller_runtime_reconcile_time_seconds (and, in the versions that
# registered it, rest_client_request_duration_seconds).
RECONCILE_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0,
    30.0, 40.0, 50.0, 60.0,
)  # fmt: skip
# client-go's workqueue histograms: 12 exponential buckets from 10 ns to 1000 s.
WORKQUEUE_BUCKETS: Final = tuple(10.0**exponent for exponent in range(-8, 4))

# Values of controller_runtime_reconcile_total{result}.
RECONCILE_RESULTS: Final = ("success", "error", "requeue", "requeue_after")


def _disable_created_series() -> None:
    """Go clients publish no `*_created` series; prometheus_client's switch for that is process-wide."""
    disable_created_metrics()  # type: ignore[no-untyped-call]


def new_registry() -> CollectorRegistry:
    """A fresh registry for one process; also turns off the `_created` series."""
    _disable_created_series()
    return CollectorRegistry(auto_describe=True)


class RuntimeMetrics:
    """The runtime's metrics under controller-runtime's and client-go's names, registered in one registry;
    callers use the attributes directly: `metrics.reconcile_total.labels(controller=c, result=r).inc()`.
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


class PrometheusQueueMetrics:
    """The `QueueMetrics` of one work queue: children bound once, so the hooks (run under the queue's
    lock) do no label lookups."""

    def __init__(self, metrics: RuntimeMetrics, name: str, controller: str) -> None:
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

    def __init__(self, metrics: RuntimeMetrics) -> None:
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
