"""The side-by-side bench's decisions without a cluster: when a run's load is too far above the
others' to compare, the medians and ratios it reports, the targets, and the peer's job."""

from __future__ import annotations

from typing import Any

from hack.bench.kubeflow import pytorch_job, pytorch_job_running
from hack.bench.peer import KUBEFLOW_TUNED, OURS, far_above, summarize, targets


def run(contender: str, load: float, jobs_running: float, cpu: float, per_job: float) -> dict[str, Any]:
    return {
        "contender": contender,
        "loadavg_before": load,
        "bring_up": {
            "seconds_to_all_pods_created": jobs_running - 1,
            "seconds_to_all_pods_running": jobs_running - 0.5,
            "seconds_to_all_jobs_running": jobs_running,
            "operator_cpu_seconds": cpu,
            "operator_peak_rss_mb": 80.0,
            "operator_requests_per_job": per_job,
            "operator_requests_per_job_by_method": {"POST": per_job},
        },
        "steady_state": {"writes_per_minute": 0.0, "cpu_percent_of_one_core": 0.2},
    }


def test_a_load_far_above_the_others_is_not_compared() -> None:
    assert far_above(6.0, [1.0, 1.2, 0.9], factor=1.5, margin=1.5)
    assert not far_above(2.0, [1.0, 1.2, 0.9], factor=1.5, margin=1.5)  # within the margin
    assert not far_above(9.0, [8.0, 7.0], factor=1.5, margin=1.5)  # within the factor
    assert not far_above(9.0, [], factor=1.5, margin=1.5)


def test_medians_per_contender_and_ratios_against_the_peer() -> None:
    runs = [
        run(OURS, 1.0, 40.0, 10.0, 12.0),
        run(KUBEFLOW_TUNED, 1.1, 80.0, 12.0, 13.0),
        run(OURS, 1.2, 50.0, 12.0, 12.0),
        run(KUBEFLOW_TUNED, 0.9, 90.0, 14.0, 13.0),
    ]
    summary = summarize(runs)
    assert summary["medians"][OURS]["seconds_to_all_jobs_running"] == 45.0
    assert summary["medians"][KUBEFLOW_TUNED]["operator_cpu_seconds"] == 13.0
    assert summary["medians"][OURS]["loadavg_before"] == [1.0, 1.2]
    ratios = summary["ratios"][f"{OURS} / {KUBEFLOW_TUNED}"]
    assert ratios["seconds_to_all_jobs_running"] == round(45 / 85, 3)
    assert ratios["operator_cpu_seconds"] == round(11 / 13, 3)
    judged = {target["name"]: target["met"] for target in targets(summary)}
    assert judged["seconds_to_all_jobs_running vs Kubeflow tuned (ratio of medians)"]
    assert not judged["operator_peak_rss_mb vs Kubeflow tuned (ratio of medians)"]  # 1.0x, not <= 0.8x


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
