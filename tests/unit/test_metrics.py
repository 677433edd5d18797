"""Metrics: names and labels as dashboards expect them, promtool-clean output, and the HTTP endpoints."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from controller.metrics import JobCollector, Metrics, eviction_reason, restart_reason
from controller.planner.failures import Cause
from controller.runtime.clock import FakeClock
from controller.runtime.metrics import RECONCILE_BUCKETS, WORKQUEUE_BUCKETS
from controller.runtime.workqueue import WorkQueue
from crd.schema_status import STATES
from tests.unit.metrics_jobs import COMPLETED, NOW, OTHER_NAMESPACE, PENDING, QUEUED, RUNNING, admitted, job


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
