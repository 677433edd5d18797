"""`make bench-peer`'s judgement: a run's figures, the medians of each contender's runs, their ratios,
which runs may be compared at all, the targets, and how each figure grows with the job count.

Why apart from the runs (testbed/harness/bench/peer.py): these are pure functions of the runs' JSON, so tests
call them directly, and the plots (testbed/harness/bench/plot.py) read the same figures.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any, Final

from testbed.common import JsonDict
from testbed.harness.bench.targets import TARGET_BRING_UP_SECONDS, TARGET_IDLE_CPU_PERCENT, check

OURS: Final = "trainingjob-operator"
# This operator from another checkout (--baseline-tree): a change measured before and after, alternating.
BASELINE: Final = "trainingjob-operator-baseline"
KUBEFLOW_TUNED: Final = "kubeflow-tuned"
KUBEFLOW_DEFAULT: Final = "kubeflow-default"
PEERS: Final = (KUBEFLOW_TUNED, KUBEFLOW_DEFAULT, BASELINE)

# The targets against Kubeflow tuned in the same run, ratios of medians (docs/bench.md).
TARGET_RATIOS: Final = {
    "seconds_to_all_jobs_running": 0.8,
    "cluster_cpu_seconds_per_job": 0.8,
    "operator_cpu_seconds": 0.8,
    "operator_requests_per_job": 0.9,
}
TARGET_RSS_RATIO: Final = 0.6
RSS_TARGET_FROM_JOBS: Final = 5000  # the peak RSS target holds at 5,000 jobs (and more)
TARGET_TIME_PER_JOB_GROWTH: Final = 1.2  # this operator's time per job, largest size / smallest
TARGET_PEER_IDLE_CPU_PERCENT: Final = 1.0

# Figures compared between contenders (ratios of medians), in the order the report lists them.
RATIO_FIELDS: Final = (
    "seconds_to_all_pods_created",
    "seconds_to_all_pods_running",
    "seconds_to_all_jobs_running",
    "cluster_cpu_seconds_per_job",
    "control_plane_cpu_seconds",
    "operator_cpu_seconds",
    "operator_peak_rss_mb",
    "operator_requests_per_job",
    "apiserver_requests_per_job",
    "pod_etcd_bytes",
    "pod_json_bytes",
    "pod_json_bytes_without_managed_fields",
)


def _get(tree: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(key)
    return tree


def _per(value: Any, count: int) -> float | None:
    return round(value / count, 4) if isinstance(value, int | float) and count else None


def figures(run: JsonDict) -> dict[str, float | None]:
    """The figures of one run, flat: times, CPU (the cluster's, per component, the operator's), memory,
    requests, latencies per job (p50, p99), the work queue, the stored size of a pod, at rest."""
    bring_up = run.get("bring_up") or {}
    jobs = int(bring_up.get("jobs_created") or 0)
    cost = bring_up.get("cluster_cpu") or {}
    pod = _get(bring_up, "stored_sizes", "pod") or {}
    created = bring_up.get("seconds_from_job_created_to_all_pods_created") or {}
    running = bring_up.get("seconds_from_last_pod_running_to_job_running") or {}
    queue = bring_up.get("work_queue_depth") or {}
    steady = run.get("steady_state") or {}
    flat: dict[str, float | None] = {
        "seconds_to_all_pods_created": bring_up.get("seconds_to_all_pods_created"),
        "seconds_to_all_pods_running": bring_up.get("seconds_to_all_pods_running"),
        "seconds_to_all_jobs_running": bring_up.get("seconds_to_all_jobs_running"),
        "seconds_per_job_to_all_jobs_running": _per(bring_up.get("seconds_to_all_jobs_running"), jobs),
        "cluster_cpu_seconds": cost.get("total_seconds"),
        "cluster_cpu_seconds_per_job": cost.get("seconds_per_job"),
        "control_plane_cpu_seconds": cost.get("control_plane_seconds"),
        "operator_cpu_seconds": bring_up.get("operator_cpu_seconds"),
        "operator_cpu_seconds_per_job": _per(bring_up.get("operator_cpu_seconds"), jobs),
        "operator_peak_rss_mb": bring_up.get("operator_peak_rss_mb"),
        "operator_requests_per_job": bring_up.get("operator_requests_per_job"),
        "apiserver_requests_per_job": _per(bring_up.get("apiserver_requests_total"), jobs),
        "job_created_to_all_pods_created_p50": created.get("median"),
        "job_created_to_all_pods_created_p99": created.get("p99"),
        "last_pod_running_to_job_running_p50": running.get("median"),
        "last_pod_running_to_job_running_p99": running.get("p99"),
        "work_queue_depth_max": queue.get("max"),
        "work_queue_depth_mean": queue.get("mean"),
        "pod_etcd_bytes": pod.get("etcd_bytes"),
        "pod_json_bytes": pod.get("json_bytes"),
        "pod_json_bytes_without_managed_fields": pod.get("json_bytes_without_managed_fields"),
        "idle_writes_per_minute": steady.get("writes_per_minute"),
        "idle_cpu_percent_of_one_core": steady.get("cpu_percent_of_one_core"),
    }
    for name, seconds in (cost.get("seconds") or {}).items():
        flat[f"cpu_seconds_{name}"] = seconds
    return flat


def far_above(load: float, others: Sequence[float], factor: float, margin: float) -> bool:
    """Whether `load` (a run's 1-minute load average before it) is too far above the other runs' to
    compare its figures with theirs."""
    if not others:
        return False
    median = statistics.median(others)
    return load > median * factor and load > median + margin


def why_not_compared(run: JsonDict, others: Sequence[JsonDict], factor: float, margin: float) -> str | None:
    """Why a run's figures cannot stand beside the others' (None: they can): its load before it was far
    above theirs, or other tests or benches ran during it."""
    loads = [other["loadavg_before"] for other in others]
    if far_above(run["loadavg_before"], loads, factor, margin):
        return (
            f"load average {run['loadavg_before']:.2f} before it, far above the other runs' "
            f"(median {statistics.median(loads):.2f})"
        )
    if run.get("bring_up", {}).get("disturbed_by"):
        return "other tests or benches ran during it: " + "; ".join(run["bring_up"]["disturbed_by"][:3])
    return None


def compared(runs: Iterable[JsonDict]) -> list[JsonDict]:
    return [run for run in runs if run.get("compared", True)]


def medians(runs: Sequence[JsonDict]) -> JsonDict:
    """Per contender, the median of each figure over its compared runs, and its requests per job by
    verb."""
    result: JsonDict = {}
    for label in dict.fromkeys(run["contender"] for run in runs):
        mine = [run for run in compared(runs) if run["contender"] == label]
        flat = [figures(run) for run in mine]
        names = dict.fromkeys(name for entry in flat for name in entry)
        values: JsonDict = {"runs": len(mine), "loadavg_before": [run["loadavg_before"] for run in mine]}
        for name in names:
            present = [value for entry in flat if (value := entry.get(name)) is not None]
            values[name] = round(statistics.median(present), 4) if present else None
        by_method = [run["bring_up"].get("operator_requests_per_job_by_method") or {} for run in mine]
        methods = sorted({method for entry in by_method for method in entry})
        values["operator_requests_per_job_by_method"] = {
            method: round(statistics.median(entry.get(method, 0) for entry in by_method), 2)
            for method in methods
        }
        result[label] = values
    return result


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or not theirs:
        return None
    return round(ours / theirs, 3)


def ratios(per_contender: JsonDict) -> JsonDict:
    """This operator's medians over each peer's."""
    result: JsonDict = {}
    ours = per_contender.get(OURS)
    for peer in PEERS:
        if ours is not None and peer in per_contender:
            theirs = per_contender[peer]
            result[f"{OURS} / {peer}"] = {
                name: ratio(ours.get(name), theirs.get(name)) for name in RATIO_FIELDS
            }
    return result


def size_targets(jobs: int, per_contender: JsonDict, against: JsonDict) -> list[JsonDict]:
    """The targets of one job count: ratios against Kubeflow tuned, idle, and the absolute bring-up
    target at 500 jobs."""
    ours = per_contender.get(OURS) or {}
    versus = against.get(f"{OURS} / {KUBEFLOW_TUNED}") or {}
    prefix = f"{jobs} jobs: "
    result = [
        check(f"{prefix}{name} vs Kubeflow tuned (ratio of medians)", versus.get(name), bound, "x", False)
        for name, bound in TARGET_RATIOS.items()
    ]
    if jobs >= RSS_TARGET_FROM_JOBS:
        result.append(
            check(
                f"{prefix}operator_peak_rss_mb vs Kubeflow tuned (ratio of medians)",
                versus.get("operator_peak_rss_mb"),
                TARGET_RSS_RATIO,
                "x",
                False,
            )
        )
    result += [
        check(
            f"{prefix}idle writes per minute (Lease renewals excepted)",
            ours.get("idle_writes_per_minute"),
            0,
            "/min",
            strict=False,  # none at all: at most 0
        ),
        check(
            f"{prefix}idle CPU, % of one core",
            ours.get("idle_cpu_percent_of_one_core"),
            TARGET_PEER_IDLE_CPU_PERCENT,
            "%",
            True,
        ),
    ]
    if jobs <= 500:
        result.append(
            check(
                f"{prefix}all jobs Running (median)",
                ours.get("seconds_to_all_jobs_running"),
                TARGET_BRING_UP_SECONDS,
                " s",
                True,
            )
        )
        result.append(
            check(
                f"{prefix}idle CPU, absolute target",
                ours.get("idle_cpu_percent_of_one_core"),
                TARGET_IDLE_CPU_PERCENT,
                "%",
                True,
            )
        )
    return result


def summarize_size(jobs: int, runs: Sequence[JsonDict]) -> JsonDict:
    per_contender = medians(runs)
    against = ratios(per_contender)
    return {
        "medians": per_contender,
        "ratios": against,
        "targets": size_targets(jobs, per_contender, against),
    }


# Figures of the curve: how each grows with the job count (per contender, medians by job count).
CURVE_FIELDS: Final = (
    "seconds_to_all_jobs_running",
    "seconds_per_job_to_all_jobs_running",
    "cluster_cpu_seconds_per_job",
    "operator_cpu_seconds_per_job",
    "operator_peak_rss_mb",
    "job_created_to_all_pods_created_p50",
    "job_created_to_all_pods_created_p99",
    "last_pod_running_to_job_running_p50",
    "last_pod_running_to_job_running_p99",
    "work_queue_depth_max",
)


GROWTH_FIELDS: Final = (
    "seconds_per_job_to_all_jobs_running",
    "cluster_cpu_seconds_per_job",
    "operator_cpu_seconds_per_job",
)


def curve(sizes: Sequence[JsonDict]) -> JsonDict:
    """Per contender and figure, the medians by job count, and the growth of each per-job figure from
    the smallest job count to the largest."""
    by_contender: JsonDict = {}
    for size in sorted(sizes, key=lambda entry: entry["jobs"]):
        for label, values in size["medians"].items():
            figures_of = by_contender.setdefault(label, {name: {} for name in CURVE_FIELDS})
            for name in CURVE_FIELDS:
                figures_of[name][str(size["jobs"])] = values.get(name)
    growth: JsonDict = {}
    for label, figures_of in by_contender.items():
        growth[label] = {}
        for name in (
            "seconds_per_job_to_all_jobs_running",
            "cluster_cpu_seconds_per_job",
            "operator_cpu_seconds_per_job",
        ):
            points = [value for value in figures_of[name].values() if value is not None]
            growth[label][name] = ratio(points[-1], points[0]) if len(points) > 1 else None
    return {"by_contender": by_contender, "growth_smallest_to_largest": growth}


def curve_targets(sizes: Sequence[JsonDict], shape: JsonDict) -> list[JsonDict]:
    """This operator's time per job at the largest job count against the smallest (no super-linear
    growth), when the curve has more than one job count."""
    counts = sorted(size["jobs"] for size in sizes)
    if len(counts) < 2:
        return []
    value = (shape["growth_smallest_to_largest"].get(OURS) or {}).get("seconds_per_job_to_all_jobs_running")
    return [
        check(
            f"time per job at {counts[-1]} jobs / at {counts[0]} jobs ({OURS})",
            value,
            TARGET_TIME_PER_JOB_GROWTH,
            "x",
            False,
        )
    ]
