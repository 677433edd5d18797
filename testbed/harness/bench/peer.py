"""`make bench-peer` (`python -m testbed.harness.bench.peer`): this operator and Kubeflow's training-operator
v1.9.3 side by side, alternating, with equivalent jobs, at one or several job counts; medians, ratios,
what the whole cluster paid, and the curve.

Why: `make bench` holds the operator to its own targets; this run holds it to its peer's, measured in
the same conditions. The runs alternate (by default: this operator, Kubeflow tuned, this operator,
Kubeflow tuned), so slow drifts of the machine's load fall on both sides. For every job count of
`--sizes` (default: `--jobs`), each run:

1. starts a fresh bench cluster with nodes for every pod (a run never inherits another's objects, its
   etcd history or its watch caches, and needs no clean-up of thousands of pods between runs);
2. waits until the machine is quiet (testbed/harness/bench/quiet.py: the load average, other tests and
   benches) and records the load average;
3. starts the operator (this one with its defaults, or the baseline: this operator from another
   checkout; Kubeflow as testbed/harness/bench/kubeflow.py describes);
4. creates N jobs: TrainingJobs of R workers, or PyTorchJobs of 1 master and R-1 workers, and times
   all pods created, Running, all jobs Running and the latencies per job; the CPU seconds of every
   control-plane component and of the operator (testbed/harness/bench/clustercost.py), the operator's peak
   RSS,
   its API requests by verb, its work queue depth over time, and the stored size of a pod;
5. waits until the operator is idle, then measures writes per minute and CPU over a window;
6. stops the operator.

A run whose load average before it is far above the others' at its job count, or during which another
test or bench ran, is not compared: the bench says so and runs it again (once); if the second attempt
is no better, it stays out of the medians. The cluster and every operator are torn down at the end,
also on failure, Ctrl-C and SIGTERM. Progress lines go to stderr, the result (one JSON object) to
stdout and to <dev dir>/peer-result.json.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from controller.resources import SERVICEACCOUNTS
from controller.runtime.errors import NotFound
from crd import contract
from testbed.common import JsonDict, ToolError, wait_until
from testbed.harness.base import create_namespace
from testbed.harness.bench.cluster import JobKind, training_jobs
from testbed.harness.bench.comparison import (
    BASELINE,
    KUBEFLOW_DEFAULT,
    KUBEFLOW_TUNED,
    OURS,
    curve,
    curve_targets,
    summarize_size,
    why_not_compared,
)
from testbed.harness.bench.kubeflow import (
    PYTORCHJOBS,
    TUNED,
    KubeflowOperator,
    binary,
    install,
    pytorch_job,
    pytorch_job_running,
)
from testbed.harness.bench.operator import Operator, say
from testbed.harness.bench.options import PODS_PER_NODE, Options, parse_options
from testbed.harness.bench.phases import Bench
from testbed.harness.bench.quiet import busy_processes, load_average
from testbed.harness.bench.report import execute
from testbed.harness.bench.tracker import Tracker, training_job_running

CONTENDERS: Final[dict[str, tuple[str, ...]]] = {
    OURS: (),
    BASELINE: (),
    KUBEFLOW_TUNED: TUNED,
    KUBEFLOW_DEFAULT: (),
}
DEFAULT_SEQUENCE: Final = (OURS, KUBEFLOW_TUNED, OURS, KUBEFLOW_TUNED)
REQUESTS_FROM: Final = "each operator's own rest_client_requests_total (client-go's, every HTTP attempt)"
NAMESPACE: Final = "peer"
# A phase's time limit grows with the job count: this many seconds per job, at least --timeout.
TIMEOUT_PER_JOB: Final = 0.6


@dataclass(frozen=True)
class PeerOptions:
    sequence: tuple[str, ...]
    sizes: tuple[int, ...]
    # A run's load average is "far above" the others' when it exceeds both their median times
    # `load_factor` and their median plus `load_margin`.
    load_factor: float
    load_margin: float
    # Before a run: wait (at most `cooldown` seconds, checking every `quiet_poll`) until the 1-minute
    # load average is below `quiet_load` (None: not far above the lowest seen before a run) and no other
    # test or bench runs.
    cooldown: float
    quiet_load: float | None
    quiet_poll: float
    baseline_tree: Path | None


def size_options(options: Options, jobs: int) -> Options:
    """The bench's options for one job count: nodes for every pod (unless --nodes says otherwise) and a
    time limit that grows with the job count."""
    nodes = options.nodes or 1 + math.ceil(jobs * options.replicas / PODS_PER_NODE)
    return replace(options, jobs=jobs, nodes=nodes, timeout=max(options.timeout, jobs * TIMEOUT_PER_JOB))


def options_per_size(options: Options, sizes: tuple[int, ...]) -> list[Options]:
    """`size_options` for each job count, all from the options as given: a run replaces the bench's
    options with its job count's, and the nodes of the first count must not become the next's."""
    return [size_options(options, jobs) for jobs in sizes]


class PeerBench(Bench):
    """The runs of one `make bench-peer`, each on a fresh bench cluster."""

    def __init__(self, options: Options, peer: PeerOptions) -> None:
        super().__init__(options)
        self.peer = peer
        self.binary: Path | None = None
        self.loads: list[float] = []

    def run(self) -> JsonDict:
        if any(label.startswith("kubeflow") for label in self.peer.sequence):
            say("building Kubeflow's training-operator on first use")
            self.binary = binary()
        sizes = []
        for options in options_per_size(self.options, self.peer.sizes):
            jobs = options.jobs
            runs = [self.one_run(options, index, label) for index, label in enumerate(self.peer.sequence)]
            runs = self.judge(options, runs)
            sizes.append(
                {
                    "jobs": jobs,
                    "replicas": options.replicas,
                    "pods": options.pods,
                    "nodes": options.nodes,
                    "runs": runs,
                    **summarize_size(jobs, runs),
                }
            )
        shape = curve(sizes)
        return {
            "config": {
                "sizes": list(self.peer.sizes),
                "replicas": self.options.replicas,
                "sequence": list(self.peer.sequence),
                "requests_from": REQUESTS_FROM,
                "window_seconds": self.options.window,
                "baseline_tree": str(self.peer.baseline_tree) if self.peer.baseline_tree else None,
            },
            "machine": {"cpus": os.cpu_count()},
            "sizes": sizes,
            "curve": shape,
            "targets": [target for size in sizes for target in size["targets"]] + curve_targets(sizes, shape),
        }

    def judge(self, options: Options, runs: list[JsonDict]) -> list[JsonDict]:
        """Runs again, once, every run that cannot be compared with the others; a second attempt that
        cannot either stays out of the medians, with the reason."""
        peer = self.peer

        def reason(index: int) -> str | None:
            others = [other for position, other in enumerate(runs) if position != index]
            return why_not_compared(runs[index], others, peer.load_factor, peer.load_margin)

        for index, run in enumerate(runs):
            first = reason(index)
            if first is None:
                continue
            say(f"run {index + 1} ({run['contender']}) is not compared ({first}): running it again")
            runs[index] = self.one_run(options, index, run["contender"], attempt=2)
            again = reason(index)
            if again is not None:
                say(f"run {index + 1} ({run['contender']}) again not compared ({again}): not in the medians")
                runs[index]["compared"] = False
                runs[index]["not_compared_because"] = again
        return runs

    def one_run(self, options: Options, index: int, label: str, attempt: int = 1) -> JsonDict:
        say(f"{options.jobs} jobs, run {index + 1}/{len(self.peer.sequence)}: {label} (attempt {attempt})")
        self.options = options
        self.stop_earlier_cluster()  # before the wait: the last run's cluster is what loads the machine
        self.wait_for_quiet()
        self.start_cluster(options.nodes)
        create_namespace(self.client, NAMESPACE)
        self.wait_for_default_account(NAMESPACE)
        self.prepare(label, index, attempt)
        tracker = Tracker(
            self.client,
            self.lease_name or contract.OPERATOR_NAME,
            namespace=NAMESPACE,
            resource=self.kind.resource,
            job_running=training_job_running if label in (OURS, BASELINE) else pytorch_job_running,
        )
        tracker.start()
        self._tracker = tracker
        try:
            load = self.wait_for_quiet()
            self.start_operator()
            bring_up = self.bring_up(0, options.jobs)
            bring_up["operator_requests_per_job_by_method"] = {
                method: round(count / options.jobs, 2)
                for method, count in bring_up["operator_requests_by_method"].items()
            }
            steady = self.steady_state()
        finally:
            say(f"stopping {self.operator.name}")
            self.operator.stop()
            tracker.stop()
        return {
            "contender": label,
            "jobs": options.jobs,
            "run": index + 1,
            "attempt": attempt,
            "operator_args": self.operator.arguments(),
            "operator_tree": str(self.operator.tree) if label in (OURS, BASELINE) else None,
            "loadavg_before": load,
            "loadavg_after": round(load_average(), 2),
            "bring_up": bring_up,
            "steady_state": steady,
        }

    def prepare(self, label: str, index: int, attempt: int) -> None:
        """The run's job kind, operator process and Lease, on the run's cluster."""
        options = self.options
        log = self.dev_dir / "logs" / f"peer-{options.jobs}-{index + 1}-{attempt}-{label}.log"
        if label in (OURS, BASELINE):
            tree = self.peer.baseline_tree if label == BASELINE else None
            if label == BASELINE and tree is None:
                raise ToolError(f"{BASELINE} needs --baseline-tree (or $BENCH_BASELINE_TREE)")
            self.kind = training_jobs(options, NAMESPACE)
            self.operator = Operator(self.kubeconfig, log, (*CONTENDERS[label], *options.operator_args), tree)
            self.lease_name = contract.OPERATOR_NAME
            return
        if self.binary is None:
            raise ToolError("Kubeflow's training-operator is not installed")
        install(self.client)
        replicas = options.replicas

        def manifest(name: str) -> JsonDict:
            return pytorch_job(name, NAMESPACE, replicas)

        self.kind = JobKind(PYTORCHJOBS, NAMESPACE, manifest)
        work = self.dev_dir / "kubeflow"
        self.operator = KubeflowOperator(self.binary, self.kubeconfig, work, log, CONTENDERS[label])
        self.lease_name = None

    def wait_for_quiet(self) -> float:
        """Waits (at most `cooldown` seconds) until the machine is quiet: the 1-minute load average below
        `quiet_load` (or not far above the lowest seen before a run) and no other test or bench running;
        returns the load average."""
        peer = self.peer
        reference = min(self.loads) if self.loads else None
        busy: list[str] = []

        def quiet() -> bool:
            busy[:] = busy_processes()
            load = load_average()
            if peer.quiet_load is not None:
                calm = load < peer.quiet_load
            else:
                calm = reference is None or not far_above_reference(load, reference, peer)
            return calm and not busy

        def progress() -> str:
            others = f"; also running: {'; '.join(busy[:2])}" if busy else ""
            return f"load average {load_average():.2f} (waiting for {self.quiet_rule(reference)}){others}"

        try:
            wait_until(
                "the machine to be quiet",
                quiet,
                timeout=peer.cooldown,
                interval=peer.quiet_poll,
                progress=progress,
                say=say,
                every=max(60.0, peer.quiet_poll),
            )
        except ToolError:
            say(f"the machine was not quiet within {peer.cooldown:.0f}s; running anyway (judged afterwards)")
        load = round(load_average(), 2)
        self.loads.append(load)
        say(f"load average before the run: {load:.2f}")
        return load

    def quiet_rule(self, reference: float | None) -> str:
        if self.peer.quiet_load is not None:
            return f"below {self.peer.quiet_load}"
        return "any" if reference is None else f"not far above {reference:.2f}"

    def wait_for_default_account(self, namespace: str) -> None:
        """Pods are refused until the controller manager has made the namespace's `default` account."""

        def exists() -> bool:
            try:
                self.client.get(SERVICEACCOUNTS, namespace, "default")
            except NotFound:
                return False
            return True

        wait_until(f"ServiceAccount {namespace}/default", exists, timeout=60)


def far_above_reference(load: float, reference: float, peer: PeerOptions) -> bool:
    return load > reference * peer.load_factor and load > reference + peer.load_margin


def parse(argv: list[str] | None) -> tuple[Options, PeerOptions]:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.harness.bench.peer",
        description="This operator and Kubeflow's training-operator side by side, each run on a fresh "
        "cluster.",
        epilog="Other flags are those of `python -m testbed.harness.bench` (--jobs, --replicas, --window, "
        "...).",
    )
    parser.add_argument(
        "--sequence",
        default=os.environ.get("BENCH_PEER_SEQUENCE", ",".join(DEFAULT_SEQUENCE)),
        help=f"the runs at each job count, in order, from {', '.join(CONTENDERS)} ($BENCH_PEER_SEQUENCE)",
    )
    parser.add_argument(
        "--sizes",
        default=os.environ.get("BENCH_SIZES", ""),
        help="job counts, e.g. 500,2000,5000: the sequence at each (default: --jobs) ($BENCH_SIZES)",
    )
    parser.add_argument(
        "--load-factor", type=float, default=1.5, help="'far above': this times the median..."
    )
    parser.add_argument("--load-margin", type=float, default=1.5, help="... and this much above it")
    parser.add_argument(
        "--cooldown", type=float, default=600.0, help="longest wait for the machine to be quiet (s)"
    )
    parser.add_argument(
        "--quiet-load",
        type=float,
        default=None,
        help="before a run, wait until the 1-minute load average is below this (default: not far above "
        "the lowest seen before a run)",
    )
    parser.add_argument(
        "--quiet-poll", type=float, default=15.0, help="how often the machine is checked while waiting (s)"
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=Path(os.environ["BENCH_BASELINE_TREE"]) if os.environ.get("BENCH_BASELINE_TREE") else None,
        help=f"the checkout whose operator runs as {BASELINE} ($BENCH_BASELINE_TREE)",
    )
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    sequence = tuple(label.strip() for label in args.sequence.split(",") if label.strip())
    unknown = [label for label in sequence if label not in CONTENDERS]
    if unknown or not sequence:
        parser.error(
            f"--sequence: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(CONTENDERS)}"
        )
    if BASELINE in sequence and args.baseline_tree is None:
        parser.error(f"--sequence has {BASELINE}: --baseline-tree (or $BENCH_BASELINE_TREE) is needed")
    options = parse_options(rest)
    try:
        sizes = tuple(int(size) for size in args.sizes.split(",") if size.strip()) or (options.jobs,)
    except ValueError:
        parser.error(f"--sizes: {args.sizes!r} is not a list of job counts")
    if min(sizes) < 1:
        parser.error("--sizes: every job count must be at least 1")
    explicit_nodes = "--nodes" in rest or bool(os.environ.get("BENCH_NODES"))
    options = replace(options, memory_jobs=0, nodes=options.nodes if explicit_nodes else 0)
    peer = PeerOptions(
        sequence=sequence,
        sizes=sizes,
        load_factor=args.load_factor,
        load_margin=args.load_margin,
        cooldown=args.cooldown,
        quiet_load=args.quiet_load,
        quiet_poll=args.quiet_poll,
        baseline_tree=args.baseline_tree.resolve() if args.baseline_tree else None,
    )
    return options, peer


def main(argv: list[str] | None = None) -> int:
    options, peer = parse(argv)
    return execute(PeerBench(options, peer), keep=options.dev_dir / "peer-result.json")


if __name__ == "__main__":
    sys.exit(main())
