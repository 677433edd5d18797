"""`make bench-peer` (`python -m hack.bench.peer`): this operator and Kubeflow's training-operator
v1.9.3 side by side on one bench cluster, alternating, with equivalent jobs; medians and ratios.

Why: `make bench` holds the operator to its own targets; this run holds it to its peer's, measured in
the same conditions. The runs alternate (by default: this operator, Kubeflow tuned, Kubeflow with its
defaults, this operator, Kubeflow tuned), each in a fresh namespace on the same cluster, so slow
drifts of the machine's load fall on both sides. Each run:

1. waits until the machine's 1-minute load average is back near the lowest seen before a run (the
   previous run's own load decays first), and records it;
2. starts the operator (this one with its defaults; Kubeflow as hack/bench/kubeflow.py describes);
3. creates N jobs: TrainingJobs of R workers, or PyTorchJobs of 1 master and R-1 workers; times all
   pods created, Running, all jobs Running; the operator's CPU seconds and peak RSS (/proc), and its
   API requests by verb from its own client metrics (`rest_client_requests_total`, client-go's counter
   of every HTTP attempt, which both operators export under that name);
4. waits until the operator is idle, then measures writes per minute and CPU over a window;
5. deletes the namespace (and waits until it is gone), then stops the operator.

A run whose load average before it is far above the others' (see `far_above`) is not compared: the
bench says so and runs it again (once). The cluster and every operator are torn down at the end, also
on failure and Ctrl-C. Progress lines go to stderr, the result (one JSON object) to stdout and to
<dev dir>/peer-result.json.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from controller.resources import NAMESPACES, SERVICEACCOUNTS
from controller.runtime.errors import NotFound
from crd import contract
from hack.bench.cluster import JobKind, create_namespace, training_jobs
from hack.bench.kubeflow import (
    PYTORCHJOBS,
    TUNED,
    KubeflowOperator,
    install,
    pytorch_job,
    pytorch_job_running,
)
from hack.bench.operator import Operator, say
from hack.bench.options import PODS_PER_NODE, Options, parse_options
from hack.bench.phases import Bench
from hack.bench.report import execute
from hack.bench.targets import TARGET_BRING_UP_SECONDS, TARGET_IDLE_CPU_PERCENT, check
from hack.bench.tracker import Tracker, training_job_running
from hack.common import JsonDict, ToolError, wait_until

OURS: Final = "trainingjob-operator"
KUBEFLOW_TUNED: Final = "kubeflow-tuned"
KUBEFLOW_DEFAULT: Final = "kubeflow-default"
CONTENDERS: Final[dict[str, tuple[str, ...]]] = {OURS: (), KUBEFLOW_TUNED: TUNED, KUBEFLOW_DEFAULT: ()}
DEFAULT_SEQUENCE: Final = (OURS, KUBEFLOW_TUNED, KUBEFLOW_DEFAULT, OURS, KUBEFLOW_TUNED)

# Targets against Kubeflow tuned, medians of the runs (docs/bench.md).
TARGET_RATIOS: Final = {
    "seconds_to_all_jobs_running": 0.67,
    "operator_cpu_seconds": 1.0,
    "operator_requests_per_job": 1.0,
    "operator_peak_rss_mb": 0.8,
}
TARGET_PEER_IDLE_CPU_PERCENT: Final = 1.0
REQUESTS_FROM: Final = "each operator's own rest_client_requests_total (client-go's, every HTTP attempt)"
MEDIAN_FIELDS: Final = (
    "seconds_to_all_pods_created",
    "seconds_to_all_pods_running",
    "seconds_to_all_jobs_running",
    "operator_cpu_seconds",
    "operator_peak_rss_mb",
    "operator_requests_per_job",
)


@dataclass(frozen=True)
class PeerOptions:
    sequence: tuple[str, ...]
    # A run's load average is "far above" the others' when it exceeds both their median times
    # `load_factor` and their median plus `load_margin`.
    load_factor: float
    load_margin: float
    cooldown: float


def far_above(load: float, others: Sequence[float], factor: float, margin: float) -> bool:
    """Whether `load` (a run's 1-minute load average before it) is too far above the other runs' to
    compare its figures with theirs."""
    if not others:
        return False
    median = statistics.median(others)
    return load > median * factor and load > median + margin


def median_of(runs: Sequence[JsonDict], section: str, name: str) -> float | None:
    values = [run[section][name] for run in runs if run[section].get(name) is not None]
    return round(statistics.median(values), 2) if values else None


def summarize(runs: Sequence[JsonDict]) -> JsonDict:
    """Per contender: the medians of its runs; ours against each peer: the ratios of the medians."""
    medians: JsonDict = {}
    for label in dict.fromkeys(run["contender"] for run in runs):
        mine = [run for run in runs if run["contender"] == label]
        methods = sorted({m for run in mine for m in run["bring_up"]["operator_requests_per_job_by_method"]})
        medians[label] = {
            "runs": len(mine),
            **{name: median_of(mine, "bring_up", name) for name in MEDIAN_FIELDS},
            "operator_requests_per_job_by_method": {
                m: round(
                    statistics.median(
                        r["bring_up"]["operator_requests_per_job_by_method"].get(m, 0) for r in mine
                    ),
                    2,
                )
                for m in methods
            },
            "idle_writes_per_minute": median_of(mine, "steady_state", "writes_per_minute"),
            "idle_cpu_percent_of_one_core": median_of(mine, "steady_state", "cpu_percent_of_one_core"),
            "loadavg_before": [run["loadavg_before"] for run in mine],
        }
    ratios: JsonDict = {}
    for peer in (KUBEFLOW_TUNED, KUBEFLOW_DEFAULT):
        if OURS in medians and peer in medians:
            ratios[f"{OURS} / {peer}"] = {
                name: _ratio(medians[OURS][name], medians[peer][name]) for name in MEDIAN_FIELDS
            }
    return {"medians": medians, "ratios": ratios}


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or not theirs:
        return None
    return round(ours / theirs, 3)


def targets(summary: JsonDict) -> list[JsonDict]:
    ours = summary["medians"].get(OURS) or {}
    ratios = summary["ratios"].get(f"{OURS} / {KUBEFLOW_TUNED}") or {}

    result = [
        check(f"{name} vs Kubeflow tuned (ratio of medians)", ratios.get(name), bound, "x", False)
        for name, bound in TARGET_RATIOS.items()
    ]
    result += [
        check(
            "idle writes per minute (Lease renewals excepted)",
            ours.get("idle_writes_per_minute"),
            0,
            "/min",
            strict=False,  # none at all: at most 0
        ),
        check(
            "idle CPU, % of one core",
            ours.get("idle_cpu_percent_of_one_core"),
            TARGET_PEER_IDLE_CPU_PERCENT,
            "%",
            True,
        ),
        check(
            "all pods created (median)",
            ours.get("seconds_to_all_pods_created"),
            TARGET_BRING_UP_SECONDS,
            " s",
            True,
        ),
        check(
            "all jobs Running (median)",
            ours.get("seconds_to_all_jobs_running"),
            TARGET_BRING_UP_SECONDS,
            " s",
            True,
        ),
        check(
            "idle CPU, absolute target",
            ours.get("idle_cpu_percent_of_one_core"),
            TARGET_IDLE_CPU_PERCENT,
            "%",
            True,
        ),
    ]
    return result


class PeerBench(Bench):
    """The runs of one `make bench-peer`, on one BenchCluster."""

    def __init__(self, options: Options, peer: PeerOptions) -> None:
        super().__init__(options)
        self.peer = peer
        self.binary: Path | None = None
        self.loads: list[float] = []

    def up(self) -> None:
        super().up()
        # Per-run trackers watch each run's namespace; the default one is not needed.
        self.tracker.stop()
        say("installing Kubeflow's training-operator (built on first use) and its PyTorchJob CRD")
        self.binary = install(self.client)

    def run(self) -> JsonDict:
        self.up()
        runs: list[JsonDict] = []
        for index, label in enumerate(self.peer.sequence):
            runs.append(self.one_run(index, label))
        runs = self.rerun_outliers(runs)
        summary = summarize(runs)
        options = self.options
        return {
            "config": {
                "jobs": options.jobs,
                "replicas": options.replicas,
                "pods": options.pods,
                "nodes": options.nodes,
                "sequence": list(self.peer.sequence),
                "requests_from": REQUESTS_FROM,
                "window_seconds": options.window,
            },
            "machine": {"cpus": os.cpu_count()},
            "runs": runs,
            **summary,
            "targets": targets(summary),
        }

    def rerun_outliers(self, runs: list[JsonDict]) -> list[JsonDict]:
        """Runs again, once, every run whose load before it was far above the others'."""
        for index, run in enumerate(runs):
            others = [other["loadavg_before"] for other in runs if other is not run]
            if far_above(run["loadavg_before"], others, self.peer.load_factor, self.peer.load_margin):
                median = statistics.median(others)
                say(
                    f"run {index + 1} ({run['contender']}) started at load {run['loadavg_before']:.2f}, "
                    f"far above the others' (median {median:.2f}): not compared; running it again"
                )
                runs[index] = self.one_run(index, run["contender"], attempt=2)
        return runs

    def one_run(self, index: int, label: str, attempt: int = 1) -> JsonDict:
        options = self.options
        namespace = f"peer-{index + 1}-{attempt}"
        say(f"run {index + 1}/{len(self.peer.sequence)}: {label} in namespace {namespace}")
        create_namespace(self.client, namespace)
        self.wait_for_default_account(namespace)
        self.prepare(label, namespace, index, attempt)
        tracker = Tracker(
            self.client,
            self.lease_name or contract.OPERATOR_NAME,
            namespace=namespace,
            resource=self.kind.resource,
            job_running=pytorch_job_running if label != OURS else training_job_running,
        )
        tracker.start()
        self._tracker = tracker
        try:
            load = self.wait_for_quiet()
            self.start_operator()
            bring_up = self.bring_up(0, options.jobs)
            per_job = {
                method: round(count / options.jobs, 2)
                for method, count in bring_up["operator_requests_by_method"].items()
            }
            bring_up["operator_requests_per_job_by_method"] = per_job
            steady = self.steady_state()
            # While the operator still runs: this operator's pods carry its tracking finalizer, which
            # only it removes (docs/accounting.md), so their namespace goes only while it is up.
            self.delete_namespace(namespace)
        finally:
            say(f"stopping {self.operator.name}")
            self.operator.stop()
            tracker.stop()
        return {
            "contender": label,
            "run": index + 1,
            "attempt": attempt,
            "namespace": namespace,
            "operator_args": self.operator.arguments(),
            "loadavg_before": load,
            "bring_up": bring_up,
            "steady_state": steady,
        }

    def prepare(self, label: str, namespace: str, index: int, attempt: int) -> None:
        """The run's job kind, operator process and Lease."""
        options = self.options
        log = self.dev_dir / "logs" / f"peer-{index + 1}-{attempt}-{label}.log"
        if label == OURS:
            self.kind = training_jobs(options, namespace)
            self.operator = Operator(self.kubeconfig, log, (*CONTENDERS[label], *options.operator_args))
            self.lease_name = contract.OPERATOR_NAME
            return
        if self.binary is None:
            raise ToolError("Kubeflow's training-operator is not installed")
        replicas = options.replicas

        def manifest(name: str) -> JsonDict:
            return pytorch_job(name, namespace, replicas)

        self.kind = JobKind(PYTORCHJOBS, namespace, manifest)
        work = self.dev_dir / "kubeflow"
        self.operator = KubeflowOperator(self.binary, self.kubeconfig, work, log, CONTENDERS[label])
        self.lease_name = None

    def wait_for_quiet(self) -> float:
        """Waits (at most `cooldown` seconds) until the 1-minute load average is not far above the
        lowest seen before a run; returns it."""
        reference = min(self.loads) if self.loads else None

        def quiet() -> bool:
            load = os.getloadavg()[0]
            return reference is None or not far_above(
                load, [reference], self.peer.load_factor, self.peer.load_margin
            )

        try:
            wait_until(
                "the machine's load average to come down",
                quiet,
                timeout=self.peer.cooldown,
                interval=1.0,
                progress=lambda: f"load average {os.getloadavg()[0]:.2f}, lowest before a run {reference}",
                say=say,
                every=15.0,
            )
        except ToolError:
            say(
                f"the load average stayed high for {self.peer.cooldown:.0f}s; running anyway (compared later)"
            )
        load = round(os.getloadavg()[0], 2)
        self.loads.append(load)
        say(f"load average before the run: {load:.2f}")
        return load

    def wait_for_default_account(self, namespace: str) -> None:
        """Pods are refused until the controller manager has made the namespace's `default` account."""

        def exists() -> bool:
            try:
                self.client.get(SERVICEACCOUNTS, namespace, "default")
            except NotFound:
                return False
            return True

        wait_until(f"ServiceAccount {namespace}/default", exists, timeout=60)

    def delete_namespace(self, namespace: str) -> None:
        say(f"deleting namespace {namespace} and waiting until it is gone")
        try:
            self.client.delete(NAMESPACES, None, namespace)
        except NotFound:
            return

        def gone() -> bool:
            try:
                self.client.get(NAMESPACES, None, namespace)
            except NotFound:
                return True
            return False

        wait_until(
            f"namespace {namespace} to be deleted",
            gone,
            timeout=self.options.timeout,
            interval=1.0,
            progress=lambda: f"namespace {namespace} still terminating",
            say=say,
            every=15.0,
        )


def parse(argv: list[str] | None) -> tuple[Options, PeerOptions]:
    parser = argparse.ArgumentParser(
        prog="python -m hack.bench.peer",
        description="This operator and Kubeflow's training-operator side by side on one bench cluster.",
        epilog="Other flags are those of `python -m hack.bench` (--jobs, --replicas, --window, ...).",
    )
    parser.add_argument(
        "--sequence",
        default=os.environ.get("BENCH_PEER_SEQUENCE", ",".join(DEFAULT_SEQUENCE)),
        help=f"the runs, in order, from {', '.join(CONTENDERS)} ($BENCH_PEER_SEQUENCE)",
    )
    parser.add_argument(
        "--load-factor", type=float, default=1.5, help="'far above': this times the median..."
    )
    parser.add_argument("--load-margin", type=float, default=1.5, help="... and this much above it")
    parser.add_argument(
        "--cooldown", type=float, default=600.0, help="longest wait for the load to come down (s)"
    )
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    sequence = tuple(label.strip() for label in args.sequence.split(",") if label.strip())
    unknown = [label for label in sequence if label not in CONTENDERS]
    if unknown or not sequence:
        parser.error(
            f"--sequence: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(CONTENDERS)}"
        )
    options = parse_options(rest)
    nodes = (
        options.nodes
        if "--nodes" in rest or os.environ.get("BENCH_NODES")
        else 1 + math.ceil(options.pods / PODS_PER_NODE)
    )
    options = replace(options, memory_jobs=0, nodes=nodes)
    return options, PeerOptions(sequence, args.load_factor, args.load_margin, args.cooldown)


def main(argv: list[str] | None = None) -> int:
    options, peer = parse(argv)
    return execute(PeerBench(options, peer), keep=options.dev_dir / "peer-result.json")


if __name__ == "__main__":
    sys.exit(main())
