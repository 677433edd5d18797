"""The side-by-side bench's decisions without a cluster: which runs may be compared, the figures of a
run, the medians and ratios, the targets at each job count and of the curve, the cluster's cost, the
sizes of stored objects, the latencies per job, the sampler, and the peer's job."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import replace
from typing import Any

from controller.resources import PODS, TRAININGJOBS
from testbed.common import wait_until
from testbed.harness.bench.clustercost import cluster_cpu, etcd_key, median_sizes, object_sizes
from testbed.harness.bench.comparison import (
    KUBEFLOW_TUNED,
    OURS,
    compared,
    curve,
    curve_targets,
    far_above,
    figures,
    summarize_size,
    why_not_compared,
)
from testbed.harness.bench.kubeflow import pytorch_job, pytorch_job_running
from testbed.harness.bench.peer import options_per_size, parse, size_options
from testbed.harness.bench.quiet import ancestors, busy_processes
from testbed.harness.bench.sampler import Sampler
from testbed.harness.bench.tracker import Tracker, spread


def run(
    contender: str,
    load: float,
    jobs_running: float,
    cpu: float,
    per_job: float,
    *,
    jobs: int = 500,
    cluster: float = 80.0,
    rss: float = 80.0,
    disturbed: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "contender": contender,
        "loadavg_before": load,
        "bring_up": {
            "jobs_created": jobs,
            "seconds_to_all_pods_created": jobs_running - 1,
            "seconds_to_all_pods_running": jobs_running - 0.5,
            "seconds_to_all_jobs_running": jobs_running,
            "operator_cpu_seconds": cpu,
            "operator_peak_rss_mb": rss,
            "operator_requests_per_job": per_job,
            "operator_requests_per_job_by_method": {"POST": per_job},
            "cluster_cpu": cluster_cpu({"kube-apiserver": cluster - cpu, "etcd": 0.0}, cpu, jobs),
            "seconds_from_last_pod_running_to_job_running": spread([0.1, 0.2, 0.3]),
            "disturbed_by": disturbed or [],
        },
        "steady_state": {"writes_per_minute": 0.0, "cpu_percent_of_one_core": 0.2},
    }


def test_a_load_far_above_the_others_is_not_compared() -> None:
    assert far_above(6.0, [1.0, 1.2, 0.9], factor=1.5, margin=1.5)
    assert not far_above(2.0, [1.0, 1.2, 0.9], factor=1.5, margin=1.5)  # within the margin
    assert not far_above(9.0, [8.0, 7.0], factor=1.5, margin=1.5)  # within the factor
    assert not far_above(9.0, [], factor=1.5, margin=1.5)


def test_a_run_with_a_far_higher_load_or_another_test_beside_it_is_not_compared() -> None:
    quiet = [run(OURS, 0.4, 40, 6, 10), run(KUBEFLOW_TUNED, 0.5, 50, 7, 11)]
    loaded = run(OURS, 4.0, 40, 6, 10)
    assert "load average 4.00" in str(why_not_compared(loaded, quiet, 1.5, 1.5))
    beside = run(OURS, 0.4, 40, 6, 10, disturbed=["python -m pytest tests/e2e"])
    assert "pytest" in str(why_not_compared(beside, quiet, 1.5, 1.5))
    assert why_not_compared(quiet[0], quiet[1:], 1.5, 1.5) is None
    left_out = {**loaded, "compared": False}
    assert compared([*quiet, left_out]) == quiet


def test_medians_per_contender_ratios_and_the_targets_of_a_job_count() -> None:
    runs = [
        run(OURS, 1.0, 40.0, 10.0, 12.0, cluster=60.0),
        run(KUBEFLOW_TUNED, 1.1, 80.0, 12.0, 13.0, cluster=90.0),
        run(OURS, 1.2, 50.0, 12.0, 12.0, cluster=64.0),
        run(KUBEFLOW_TUNED, 0.9, 90.0, 14.0, 13.0, cluster=86.0),
        {**run(OURS, 9.0, 500.0, 99.0, 99.0), "compared": False},  # left out of the medians
    ]
    summary = summarize_size(500, runs)
    ours, theirs = summary["medians"][OURS], summary["medians"][KUBEFLOW_TUNED]
    assert ours["runs"] == 2
    assert ours["seconds_to_all_jobs_running"] == 45.0
    assert theirs["operator_cpu_seconds"] == 13.0
    assert ours["loadavg_before"] == [1.0, 1.2]
    assert ours["cluster_cpu_seconds_per_job"] == round((60 + 64) / 2 / 500, 4)
    assert ours["operator_requests_per_job_by_method"] == {"POST": 12.0}
    ratios = summary["ratios"][f"{OURS} / {KUBEFLOW_TUNED}"]
    assert ratios["seconds_to_all_jobs_running"] == round(45 / 85, 3)
    assert ratios["operator_cpu_seconds"] == round(11 / 13, 3)
    assert ratios["cluster_cpu_seconds_per_job"] == round(62 / 88, 3)
    judged = {target["name"]: target["met"] for target in summary["targets"]}
    assert judged["500 jobs: seconds_to_all_jobs_running vs Kubeflow tuned (ratio of medians)"]
    assert judged["500 jobs: cluster_cpu_seconds_per_job vs Kubeflow tuned (ratio of medians)"]  # 0.70x
    assert not judged["500 jobs: operator_cpu_seconds vs Kubeflow tuned (ratio of medians)"]  # 0.85x
    assert not any("peak_rss" in name for name in judged)  # the memory target holds at 5,000 jobs


def test_the_memory_target_holds_at_5000_jobs_and_the_curve_compares_time_per_job() -> None:
    small = summarize_size(
        500, [run(OURS, 1, 40, 6, 10, jobs=500), run(KUBEFLOW_TUNED, 1, 40, 7, 11, jobs=500)]
    )
    large_runs = [
        run(OURS, 1, 440, 60, 10, jobs=5000, rss=200),
        run(KUBEFLOW_TUNED, 1, 600, 90, 11, jobs=5000, rss=400),
    ]
    large = summarize_size(5000, large_runs)
    judged = {target["name"]: target["met"] for target in large["targets"]}
    assert judged["5000 jobs: operator_peak_rss_mb vs Kubeflow tuned (ratio of medians)"]  # 0.5x
    sizes = [{"jobs": 5000, **large}, {"jobs": 500, **small}]
    shape = curve(sizes)
    assert shape["by_contender"][OURS]["seconds_to_all_jobs_running"] == {"500": 40.0, "5000": 440.0}
    growth = shape["growth_smallest_to_largest"][OURS]["seconds_per_job_to_all_jobs_running"]
    assert growth == round((440 / 5000) / (40 / 500), 3)  # 1.1x
    (target,) = curve_targets(sizes, shape)
    assert target["met"]
    assert target["name"].startswith("time per job at 5000 jobs / at 500 jobs")
    assert curve_targets([{"jobs": 500, **small}], curve([{"jobs": 500, **small}])) == []


def test_a_runs_figures_are_flat_and_per_job_where_the_curve_needs_it() -> None:
    flat = figures(run(OURS, 1.0, 50.0, 10.0, 12.0, jobs=100, cluster=40.0))
    assert flat["seconds_per_job_to_all_jobs_running"] == 0.5
    assert flat["operator_cpu_seconds_per_job"] == 0.1
    assert flat["cluster_cpu_seconds_per_job"] == 0.4
    assert flat["cpu_seconds_kube-apiserver"] == 30.0
    assert flat["last_pod_running_to_job_running_p50"] == 0.2
    assert flat["pod_etcd_bytes"] is None  # not measured in this run


def test_the_clusters_cost_sums_every_component_and_the_operator_per_job() -> None:
    cost = cluster_cpu(
        {
            "kube-apiserver": 40.0,
            "etcd": 6.0,
            "kube-scheduler": 6.0,
            "kube-controller-manager": 10.0,
            "kwok": 7.0,
        },
        operator=6.0,
        jobs=500,
    )
    assert cost["total_seconds"] == 75.0
    assert cost["control_plane_seconds"] == 69.0
    assert cost["seconds_per_job"] == 0.15
    assert cost["seconds"]["operator"] == 6.0


def test_stored_sizes_with_and_without_managed_fields_and_where_etcd_keeps_them() -> None:
    pod = {
        "metadata": {"name": "a", "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {}}}]},
        "spec": {},
    }
    size = object_sizes(pod, stored=1234)
    assert size["etcd_bytes"] == 1234
    assert (
        size["json_bytes"]
        > size["json_bytes_without_managed_fields"]
        == len(b'{"metadata":{"name":"a"},"spec":{}}')
    )
    assert size["managed_fields_entries"] == 1
    assert (
        median_sizes([size, {**size, "etcd_bytes": 2000}, {**size, "etcd_bytes": None}])["etcd_bytes"] == 1617
    )
    assert etcd_key(PODS, "ns", "p") == "/registry/pods/ns/p"
    assert etcd_key(TRAININGJOBS, "ns", "j") == "/registry/ml.example.com/trainingjobs/ns/j"


def test_latencies_per_job_from_its_create_to_its_last_pod_and_percentiles() -> None:
    tracker = Tracker.__new__(Tracker)  # the bookkeeping only, no watches
    tracker._lock = threading.Lock()
    tracker.pod_created = {"j-worker-0": 10.0, "j-worker-1": 12.5, "k-worker-0": 11.0}
    tracker.job_created = {"j": 9.5, "k": 9.0}
    tracker.pod_running = {"j-worker-0": 13.0, "j-worker-1": 14.0}
    tracker.job_running = {"j": 14.25}
    assert tracker.creation_lags(2) == [3.0]  # k has one pod of two
    assert tracker.creation_lags(1) == [2.0, 3.0]
    assert tracker.running_lags() == [0.25]
    values = [float(v) for v in range(1, 101)]
    assert spread(values) == {"median": 51.0, "p90": 91.0, "p99": 100.0, "max": 100.0}
    assert spread([]) == {"median": None, "p90": None, "p99": None, "max": None}


def test_the_sampler_records_the_depth_over_time_and_who_else_ran() -> None:
    depths = iter([3.0, 5.0, 2.0] + [0.0] * 1000)
    seen = threading.Event()

    def busy() -> list[str]:
        seen.set()
        return ["123: python -m pytest tests/e2e"]

    sampler = Sampler(lambda: next(depths), interval=0.01, busy_interval=0.01, busy=busy)
    sampler.start(0.0)
    assert seen.wait(10)
    wait_until("three samples", lambda: len(sampler.samples) >= 3, timeout=10, interval=0.01)
    result = sampler.stop()
    queue = result["work_queue_depth"]
    assert [depth for _, depth in queue["samples"][:3]] == [3.0, 5.0, 2.0]
    assert queue["max"] == 5.0
    assert result["disturbed_by"] == ["python -m pytest tests/e2e"]


def test_busy_processes_are_other_tests_and_benches_never_this_process_or_its_family() -> None:
    assert os.getpid() in ancestors(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "pytest-marker"])
    try:
        # Its own child (and this pytest run itself) do not count; a process of another family does.
        assert not any(line.startswith(f"{child.pid}:") for line in busy_processes())
        assert any(line.startswith(f"{child.pid}:") for line in busy_processes(own=1 << 22))
    finally:
        child.kill()
        child.wait()


def test_each_job_count_gets_nodes_for_every_pod_and_a_time_limit_that_grows_with_it() -> None:
    options, _ = parse(["--jobs", "500", "--timeout", "900"])
    assert size_options(options, 5000).nodes == 201
    assert size_options(options, 5000).timeout == 3000
    assert size_options(options, 500).timeout == 900
    # Each job count's nodes come from the options as given, not from the count before it.
    assert [each.nodes for each in options_per_size(options, (500, 2000, 5000))] == [21, 81, 201]
    assert [each.nodes for each in options_per_size(replace(options, nodes=30), (500, 2000))] == [30, 30]


def test_the_peers_job_has_one_master_and_the_rest_workers_in_the_pytorch_container() -> None:
    job = pytorch_job("j", "ns", 4)
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1
    assert specs["Worker"]["replicas"] == 3
    assert specs["Worker"]["template"]["spec"]["containers"][0]["name"] == "pytorch"
    assert not pytorch_job_running(job)
    job["status"] = {
        "conditions": [{"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]
    }
    assert pytorch_job_running(job)
