"""Metrics: names and labels as dashboards expect them, promtool-clean output, and the HTTP endpoints."""

from __future__ import annotations

import gzip
import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.metrics import JobCollector, Metrics, eviction_reason, restart_reason
from controller.planner.failures import Cause
from controller.runtime.clock import FakeClock, rfc3339
from controller.runtime.metrics import RECONCILE_BUCKETS, WORKQUEUE_BUCKETS
from controller.runtime.serving import MetricsServer, parse_address
from controller.runtime.workqueue import WorkQueue
from crd.schema_status import STATES

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def job(
    name: str, namespace: str = "ml", status: dict[str, Any] | None = None, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "ml.example.com/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": spec or {"model": "bert", "dataset": "squad", "numWorkers": 2, "gpusPerWorker": 1},
    }
    if status is not None:
        obj["status"] = status
    return obj


RUNNING = job(
    "bert",
    status={
        "state": "Running",
        "progress": "45%",
        "currentEpoch": 4,
        "totalEpochs": 10,
        "metrics": {"loss": 0.41, "accuracy": 0.87, "gpu_utilization": 73.5},
        "resources": {"gpus": 8, "workers": 4},
        "restartCount": 2,
        "startTime": rfc3339(NOW - timedelta(hours=1)),
    },
)
PENDING = job("fresh")
COMPLETED = job(
    "done",
    status={
        "state": "Completed",
        "progress": "100%",
        "startTime": rfc3339(NOW - timedelta(hours=5)),
        "completionTime": rfc3339(NOW - timedelta(hours=3)),
    },
)
OTHER_NAMESPACE = job("gpt", namespace="research", status={"state": "Failed", "restartCount": 3})


def admitted(value: str, reason: str, at: datetime) -> dict[str, Any]:
    return {"type": "Admitted", "status": value, "reason": reason, "lastTransitionTime": rfc3339(at)}


QUEUED = job(
    "waiting",
    status={"state": "Queued", "conditions": [admitted("False", "Pending", NOW - timedelta(minutes=5))]},
)


def scrape(registry: CollectorRegistry, metric: str, /, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


def label_sets(registry: CollectorRegistry, name: str) -> list[dict[str, str]]:
    return [
        sample.labels for family in registry.collect() for sample in family.samples if sample.name == name
    ]


# ---- registry and names --------------------------------------------------------------------------------


def test_each_metrics_instance_has_its_own_registry() -> None:
    first, second = Metrics(process_metrics=False), Metrics(process_metrics=False)
    first.created.labels(namespace="ml").inc()
    assert scrape(first.registry, "trainingjob_created_total", namespace="ml") == 1.0
    assert scrape(second.registry, "trainingjob_created_total", namespace="ml") is None


def test_no_created_series_and_controller_runtime_buckets() -> None:
    metrics = Metrics(process_metrics=False)
    metrics.reconcile_total.labels(controller="trainingjob", result="success").inc()
    metrics.reconcile_time.labels(controller="trainingjob").observe(0.2)
    names = {sample.name for family in metrics.registry.collect() for sample in family.samples}
    assert not any(name.endswith("_created") for name in names)
    assert "controller_runtime_reconcile_total" in names
    buckets = [
        sample.labels["le"]
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "controller_runtime_reconcile_time_seconds_bucket"
    ]
    assert len(buckets) == len(RECONCILE_BUCKETS) + 1
    assert (buckets[0], buckets[-2], buckets[-1]) == ("0.005", "60.0", "+Inf")
    assert (WORKQUEUE_BUCKETS[0], WORKQUEUE_BUCKETS[-1], len(WORKQUEUE_BUCKETS)) == (1e-8, 1000.0, 12)


def test_init_controller_publishes_zeroes_for_every_result() -> None:
    metrics = Metrics(process_metrics=False)
    metrics.init_controller("trainingjob", 4)
    for result in ("success", "error", "requeue", "requeue_after"):
        assert (
            scrape(
                metrics.registry,
                "controller_runtime_reconcile_total",
                controller="trainingjob",
                result=result,
            )
            == 0
        )
    assert (
        scrape(metrics.registry, "controller_runtime_max_concurrent_reconciles", controller="trainingjob")
        == 4
    )
    assert scrape(metrics.registry, "controller_runtime_active_workers", controller="trainingjob") == 0


def test_restart_reasons_are_a_fixed_set() -> None:
    assert [restart_reason(r) for r in ("failure", "disruption", "scheduling", "stall")] == [
        "failure",
        "disruption",
        "scheduling",
        "stall",
    ]
    assert restart_reason("NodeLost-worker-3") == "other"
    label = restart_reason(Cause.DISRUPTION)
    assert type(label) is str
    assert label == "disruption"


def test_queue_metrics_follow_the_queue() -> None:
    clock = FakeClock()
    metrics = Metrics(process_metrics=False)
    queue = WorkQueue("trainingjob", clock, metrics.queue_metrics("trainingjob", "trainingjob"))
    metrics.track_queue(queue, "trainingjob")
    registry = metrics.registry
    labels = {"name": "trainingjob", "controller": "trainingjob"}
    try:
        queue.add("ml/a")
        queue.add("ml/b")
        queue.add("ml/a")  # deduplicated: not an add
        assert scrape(registry, "workqueue_adds_total", **labels) == 2
        assert scrape(registry, "workqueue_depth", **labels) == 2
        clock.advance(0.5)
        key, _ = queue.get()
        assert key == "ml/a"
        assert scrape(registry, "workqueue_depth", **labels) == 1
        assert scrape(registry, "workqueue_queue_duration_seconds_count", **labels) == 1
        assert scrape(registry, "workqueue_queue_duration_seconds_sum", **labels) == 0.5
        clock.advance(3.0)
        # Computed at scrape time: the key has been processed for 3 s.
        assert scrape(registry, "workqueue_unfinished_work_seconds", **labels) == 3.0
        assert scrape(registry, "workqueue_longest_running_processor_seconds", **labels) == 3.0
        queue.done("ml/a")
        assert scrape(registry, "workqueue_work_duration_seconds_count", **labels) == 1
        assert scrape(registry, "workqueue_work_duration_seconds_sum", **labels) == 3.0
        assert scrape(registry, "workqueue_unfinished_work_seconds", **labels) == 0.0
        queue.add_rate_limited("ml/a")
        assert scrape(registry, "workqueue_retries_total", **labels) == 1
    finally:
        queue.shut_down()


def test_rest_and_leader_metrics() -> None:
    metrics = Metrics(process_metrics=False)
    rest = metrics.rest_metrics()
    rest.request("200", "GET", "10.0.0.1:6443")
    rest.request("200", "GET", "10.0.0.1:6443")
    rest.request("<error>", "POST", "10.0.0.1:6443")
    rest.observe_duration("GET", "10.0.0.1:6443", 0.02)
    metrics.set_leader("trainingjob-operator", True)
    registry = metrics.registry
    assert scrape(registry, "rest_client_requests_total", code="200", method="GET", host="10.0.0.1:6443") == 2
    assert (
        scrape(registry, "rest_client_requests_total", code="<error>", method="POST", host="10.0.0.1:6443")
        == 1
    )
    assert (
        scrape(registry, "rest_client_request_duration_seconds_count", verb="GET", host="10.0.0.1:6443") == 1
    )
    assert scrape(registry, "leader_election_master_status", name="trainingjob-operator") == 1
    metrics.set_leader("trainingjob-operator", False)
    assert scrape(registry, "leader_election_master_status", name="trainingjob-operator") == 0


# ---- Kueue ---------------------------------------------------------------------------------------------


def test_an_admission_records_how_long_the_job_waited_in_its_queue() -> None:
    metrics = Metrics(CollectorRegistry(), process_metrics=False)
    queued = {"state": "Queued", "conditions": [admitted("False", "Pending", NOW)], "queue": {"name": "team"}}
    running = {
        "state": "Pending",
        "conditions": [admitted("True", "Admitted", NOW + timedelta(seconds=90))],
        "queue": {"name": "team", "clusterQueue": "gpus", "admissions": 1},
    }
    metrics.record_transition("ml", 10.0, queued, running)
    labels = {"namespace": "ml", "cluster_queue": "gpus"}
    assert scrape(metrics.registry, "trainingjob_queue_wait_seconds_count", **labels) == 1
    assert scrape(metrics.registry, "trainingjob_queue_wait_seconds_sum", **labels) == 90.0
    # Other writes of an admitted or a waiting job observe nothing.
    metrics.record_transition("ml", 10.0, running, running)
    metrics.record_transition("ml", 10.0, queued, queued)
    assert scrape(metrics.registry, "trainingjob_queue_wait_seconds_count", **labels) == 1


def test_evictions_are_counted_by_a_bounded_reason() -> None:
    metrics = Metrics(CollectorRegistry(), process_metrics=False)
    before = {
        "state": "Running",
        "conditions": [admitted("True", "Admitted", NOW)],
        "queue": {"admissions": 1},
    }
    for reason, evictions in (("Preempted", 1), ("SomethingNew", 2)):
        after = {
            "state": "Queued",
            "conditions": [admitted("False", reason, NOW)],
            "queue": {"admissions": 1, "evictions": evictions},
        }
        metrics.record_transition("ml", 10.0, before, after)
        before = {**after, "conditions": [admitted("True", "Admitted", NOW)]}
    assert scrape(metrics.registry, "trainingjob_evictions_total", namespace="ml", reason="Preempted") == 1
    assert scrape(metrics.registry, "trainingjob_evictions_total", namespace="ml", reason="other") == 1
    assert eviction_reason("WorkloadDeleted") == "WorkloadDeleted"


def test_a_queued_job_shows_how_long_it_has_waited() -> None:
    registry = collector_registry([RUNNING, QUEUED])
    assert scrape(registry, "trainingjob_queued_seconds", namespace="ml", training_job="waiting") == 300.0
    assert scrape(registry, "trainingjob_queued_seconds", namespace="ml", training_job="bert") is None
    assert scrape(registry, "trainingjob_jobs", namespace="ml", state="Queued") == 1


# ---- per-job gauges ------------------------------------------------------------------------------------


def collector_registry(jobs: list[dict[str, Any]]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(JobCollector(lambda: jobs, FakeClock(NOW)))
    return registry


def test_job_collector_reports_what_the_status_says() -> None:
    registry = collector_registry([RUNNING, PENDING, COMPLETED, OTHER_NAMESPACE])
    bert = {"namespace": "ml", "training_job": "bert"}
    assert scrape(registry, "trainingjob_progress_percent", **bert) == 45.0
    assert scrape(registry, "trainingjob_current_epoch", **bert) == 4
    assert scrape(registry, "trainingjob_total_epochs", **bert) == 10
    assert scrape(registry, "trainingjob_loss", **bert) == 0.41
    assert scrape(registry, "trainingjob_accuracy", **bert) == 0.87
    assert scrape(registry, "trainingjob_gpu_utilization_percent", **bert) == 73.5
    assert scrape(registry, "trainingjob_allocated_gpus", **bert) == 8
    assert scrape(registry, "trainingjob_allocated_workers", **bert) == 4
    assert scrape(registry, "trainingjob_gang_restarts", **bert) == 2
    assert scrape(registry, "trainingjob_duration_seconds", state="Running", **bert) == 3600.0
    # A finished job's duration ends at its completionTime.
    assert (
        scrape(
            registry, "trainingjob_duration_seconds", namespace="ml", training_job="done", state="Completed"
        )
        == 7200.0
    )
    assert scrape(registry, "trainingjob_gang_restarts", namespace="research", training_job="gpt") == 3


def test_job_collector_counts_jobs_by_namespace_and_state() -> None:
    registry = collector_registry([RUNNING, PENDING, COMPLETED, OTHER_NAMESPACE])
    assert scrape(registry, "trainingjob_jobs", namespace="ml", state="Running") == 1
    assert scrape(registry, "trainingjob_jobs", namespace="ml", state="Pending") == 1  # no status yet
    assert scrape(registry, "trainingjob_jobs", namespace="ml", state="Completed") == 1
    assert scrape(registry, "trainingjob_jobs", namespace="ml", state="Failed") == 0
    assert scrape(registry, "trainingjob_jobs", namespace="research", state="Failed") == 1
    states = {labels["state"] for labels in label_sets(registry, "trainingjob_jobs")}
    assert states == set(STATES)
    assert "Queued" in states


def test_job_collector_has_no_series_for_values_not_reported() -> None:
    registry = collector_registry([PENDING, COMPLETED])
    for name in (
        "trainingjob_loss",
        "trainingjob_accuracy",
        "trainingjob_gpu_utilization_percent",
        "trainingjob_current_epoch",
        "trainingjob_allocated_gpus",
    ):
        assert label_sets(registry, name) == [], name
    assert scrape(registry, "trainingjob_progress_percent", namespace="ml", training_job="fresh") is None
    assert (
        scrape(
            registry, "trainingjob_duration_seconds", namespace="ml", training_job="fresh", state="Pending"
        )
        is None
    )
    # Restart count is well defined without status: zero.
    assert scrape(registry, "trainingjob_gang_restarts", namespace="ml", training_job="fresh") == 0


def test_job_collector_series_disappear_with_the_job() -> None:
    jobs = [RUNNING, COMPLETED]
    registry = CollectorRegistry()
    registry.register(JobCollector(lambda: list(jobs), FakeClock(NOW)))
    assert {labels["training_job"] for labels in label_sets(registry, "trainingjob_progress_percent")} == {
        "bert",
        "done",
    }
    jobs.remove(RUNNING)
    assert {labels["training_job"] for labels in label_sets(registry, "trainingjob_progress_percent")} == {
        "done"
    }


def test_job_collector_ignores_garbage_and_survives_a_failing_lister() -> None:
    weird = job(
        "weird",
        status={
            "state": "Running",
            "progress": "lots",
            "metrics": {"loss": "NaN", "accuracy": True},
            "startTime": "yesterday",
        },
    )
    nameless: dict[str, Any] = {"metadata": {}}
    registry = collector_registry([weird, nameless])
    assert label_sets(registry, "trainingjob_progress_percent") == []
    assert label_sets(registry, "trainingjob_loss") == []
    assert label_sets(registry, "trainingjob_accuracy") == []
    assert label_sets(registry, "trainingjob_duration_seconds") == []
    assert scrape(registry, "trainingjob_jobs", namespace="ml", state="Running") == 1

    def broken() -> list[dict[str, Any]]:
        raise RuntimeError("cache gone")

    failing = CollectorRegistry()
    failing.register(JobCollector(broken, FakeClock(NOW)))
    assert label_sets(failing, "trainingjob_jobs") == []


def test_job_collector_is_not_called_at_registration() -> None:
    calls: list[int] = []

    def lister() -> list[dict[str, Any]]:
        calls.append(1)
        return []

    metrics = Metrics(process_metrics=False)
    metrics.track_jobs(lister, FakeClock(NOW))
    assert calls == []
    list(metrics.registry.collect())
    assert calls == [1]


# ---- promtool ------------------------------------------------------------------------------------------


def exercise_everything(metrics: Metrics, clock: FakeClock) -> WorkQueue:
    ns = "ml"
    metrics.init_controller("trainingjob", 2)
    metrics.reconcile_total.labels(controller="trainingjob", result="success").inc()
    metrics.reconcile_errors.labels(controller="trainingjob").inc()
    metrics.reconcile_time.labels(controller="trainingjob").observe(0.03)
    metrics.active_workers.labels(controller="trainingjob").set(1)
    metrics.set_leader("trainingjob-operator", True)
    rest = metrics.rest_metrics()
    rest.request("201", "POST", "127.0.0.1:6443")
    rest.observe_duration("POST", "127.0.0.1:6443", 0.01)
    metrics.created.labels(namespace=ns).inc()
    metrics.completed.labels(namespace=ns, result="Completed").inc()
    metrics.failed.labels(namespace=ns, reason="BackoffLimitExceeded").inc()
    metrics.restarts.labels(namespace=ns, reason=restart_reason("disruption")).inc()
    metrics.time_to_running.labels(namespace=ns).observe(42.0)
    metrics.time_to_complete.labels(namespace=ns, result="Completed").observe(7200.0)
    metrics.reconciliations.labels(namespace=ns, result="requeue_after").inc()
    metrics.reconciliation_duration.labels(namespace=ns).observe(0.02)
    metrics.reconciliation_errors.labels(namespace=ns, error_type="Conflict").inc()
    metrics.invalid_spec.labels(namespace=ns).inc()
    metrics.queue_wait.labels(namespace=ns, cluster_queue="gpus").observe(30.0)
    metrics.evictions.labels(namespace=ns, reason=eviction_reason("Preempted")).inc()
    metrics.events_dropped.inc()
    metrics.track_jobs(lambda: [RUNNING, PENDING, COMPLETED, OTHER_NAMESPACE, QUEUED], FakeClock(NOW))
    queue = WorkQueue("trainingjob", clock, metrics.queue_metrics("trainingjob", "trainingjob"))
    metrics.track_queue(queue, "trainingjob")
    queue.add("ml/a")
    queue.add("ml/b")
    key, _ = queue.get()
    assert key is not None
    clock.advance(1.0)
    queue.done(key)
    queue.get()  # left in flight: unfinished work is non-zero
    clock.advance(2.0)
    queue.add_after("ml/c", 5.0)
    return queue


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (the Prometheus package) is not installed"
)
def test_promtool_finds_no_problems_in_the_exposition() -> None:
    clock = FakeClock()
    metrics = Metrics()
    queue = exercise_everything(metrics, clock)
    try:
        with serving(metrics.registry) as server:
            status, headers, body = get(server, "/metrics")
    finally:
        queue.shut_down()
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    for name in (
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        "controller_runtime_active_workers",
        "controller_runtime_max_concurrent_reconciles",
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_retries_total",
        "workqueue_queue_duration_seconds_bucket",
        "workqueue_work_duration_seconds_bucket",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "leader_election_master_status",
        "rest_client_requests_total",
        "rest_client_request_duration_seconds_bucket",
        "trainingjob_jobs",
        "trainingjob_progress_percent",
        "trainingjob_loss",
        "trainingjob_gpu_utilization_percent",
        "trainingjob_duration_seconds",
        "trainingjob_created_total",
        "trainingjob_completed_total",
        "trainingjob_failed_total",
        "trainingjob_restarts_total",
        "trainingjob_time_to_running_seconds_bucket",
        "trainingjob_time_to_complete_seconds_bucket",
        "trainingjob_reconciliation_total",
        "trainingjob_reconciliation_duration_seconds_bucket",
        "trainingjob_reconciliation_errors_total",
        "trainingjob_invalid_spec_total",
        "trainingjob_events_dropped_total",
        "process_cpu_seconds_total",
    ):
        assert f"\n{name}{{" in text or f"\n{name} " in text, name
    series = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert not [name for name in series if name.endswith("_created")]
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60, check=False
    )
    problems = (result.stdout + result.stderr).decode()
    assert result.returncode == 0, problems
    assert problems.strip() == ""


# ---- HTTP server ---------------------------------------------------------------------------------------


class Switch:
    def __init__(self, ok: bool, reason: str) -> None:
        self.ok = ok
        self.reason = reason

    def __call__(self) -> tuple[bool, str]:
        return self.ok, self.reason


@pytest.fixture
def registry() -> CollectorRegistry:
    metrics = Metrics(process_metrics=False)
    metrics.created.labels(namespace="ml").inc()
    return metrics.registry


class serving:  # noqa: N801 - used like a function in `with`
    def __init__(
        self, registry: CollectorRegistry, ready: Switch | None = None, healthy: Switch | None = None
    ) -> None:
        self.server = MetricsServer(
            "127.0.0.1",
            0,
            registry,
            ready=ready or Switch(True, ""),
            healthy=healthy or Switch(True, ""),
        )

    def __enter__(self) -> MetricsServer:
        self.server.start()
        return self.server

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def get(
    server: MetricsServer, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - http to a local server
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers.items()), error.read()


def test_server_binds_a_free_port_and_serves_metrics(registry: CollectorRegistry) -> None:
    with serving(registry) as server:
        assert server.port > 0
        status, headers, body = get(server, "/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert 'trainingjob_created_total{namespace="ml"} 1.0' in body.decode()


def test_server_honours_openmetrics_and_gzip(registry: CollectorRegistry) -> None:
    with serving(registry) as server:
        status, headers, body = get(
            server, "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"}
        )
        assert status == 200
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.decode().endswith("# EOF\n")
        status, headers, body = get(server, "/metrics", {"Accept-Encoding": "gzip"})
        assert status == 200
        assert headers["Content-Encoding"] == "gzip"
        assert b"trainingjob_created_total" in gzip.decompress(body)


def test_server_filters_by_name(registry: CollectorRegistry) -> None:
    with serving(registry) as server:
        _, _, body = get(server, "/metrics?name[]=trainingjob_created_total")
    assert b'trainingjob_created_total{namespace="ml"} 1.0' in body
    assert b"trainingjob_invalid_spec" not in body


def test_readyz_and_healthz(registry: CollectorRegistry) -> None:
    ready = Switch(False, "informer caches not synced")
    healthy = Switch(True, "")
    with serving(registry, ready=ready, healthy=healthy) as server:
        assert get(server, "/healthz")[::2] == (200, b"ok")
        assert get(server, "/livez")[::2] == (200, b"ok")
        status, _, body = get(server, "/readyz")
        assert (status, body) == (503, b"informer caches not synced\n")
        status, _, body = get(server, "/readyz?verbose")
        assert status == 503
        assert body.decode().splitlines() == [
            "[+]ping ok",
            "[-]ready failed: informer caches not synced",
            "readyz check failed",
        ]
        ready.ok = True
        assert get(server, "/readyz")[::2] == (200, b"ok")
        status, _, body = get(server, "/readyz?verbose")
        assert (status, body.decode().splitlines()) == (
            200,
            ["[+]ping ok", "[+]ready ok", "readyz check passed"],
        )
        healthy.ok, healthy.reason = False, "worker thread died"
        assert get(server, "/healthz")[::2] == (503, b"worker thread died\n")


def test_named_checks_and_a_check_that_raises(registry: CollectorRegistry) -> None:
    def explode() -> tuple[bool, str]:
        raise RuntimeError("boom")

    server = MetricsServer(
        "127.0.0.1",
        0,
        registry,
        ready={"informers": lambda: (True, ""), "leader": lambda: (False, "not the leader")},
        healthy=explode,
    )
    server.start()
    try:
        status, _, body = get(server, "/readyz")
        assert (status, body) == (503, b"leader: not the leader\n")
        _, _, body = get(server, "/readyz?verbose=1")
        assert body.decode().splitlines() == [
            "[+]ping ok",
            "[+]informers ok",
            "[-]leader failed: not the leader",
            "readyz check failed",
        ]
        status, _, body = get(server, "/healthz")
        assert status == 503
        assert b"RuntimeError: boom" in body
    finally:
        server.stop()


def test_unknown_paths_are_404_and_requests_are_not_logged(
    registry: CollectorRegistry, capfd: pytest.CaptureFixture[str]
) -> None:
    with serving(registry) as server:
        assert get(server, "/nope")[0] == 404
        assert get(server, "/")[0] == 404
        assert get(server, "/metrics")[0] == 200
    captured = capfd.readouterr()
    assert captured.err == ""


def test_concurrent_scrapes(registry: CollectorRegistry) -> None:
    results: list[int] = []
    lock = threading.Lock()
    with serving(registry) as server:

        def scrape_once() -> None:
            status = get(server, "/metrics")[0]
            with lock:
                results.append(status)

        threads = [threading.Thread(target=scrape_once) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert results == [200] * 8


def test_stop_closes_the_port(registry: CollectorRegistry) -> None:
    server = MetricsServer("127.0.0.1", 0, registry, ready=Switch(True, ""), healthy=Switch(True, ""))
    port = server.start()
    assert server.start() == port  # idempotent
    server.stop()
    server.stop()  # idempotent
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)


# ---- addresses -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":8080", ("", 8080)),
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:9090", ("0.0.0.0", 9090)),  # noqa: S104 - parsing only
        ("[::1]:8080", ("::1", 8080)),
        ("[::]:0", ("::", 0)),
        ("localhost:8443", ("localhost", 8443)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["8080", "", "host:", "host:http", ":70000", "::1:8080", "[::1:8080", ":-1"])
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid listen address"):
        parse_address(text)


@pytest.fixture(autouse=True)
def _no_server_threads_left() -> Iterator[None]:
    yield
    assert not [thread for thread in threading.enumerate() if thread.name == "metrics-server"]


def ipv6_loopback_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback_available(), reason="this machine has no IPv6 loopback")
def test_server_on_ipv6_loopback(registry: CollectorRegistry) -> None:
    host, port = parse_address("[::1]:0")
    server = MetricsServer(host, port, registry, ready=Switch(True, ""), healthy=Switch(True, ""))
    bound = server.start()
    try:
        with urllib.request.urlopen(f"http://[::1]:{bound}/healthz", timeout=10) as response:
            assert response.read() == b"ok"
    finally:
        server.stop()
