"""The bench's settings: flags, each with an environment variable, and what follows from them.

Why apart: `make bench` passes its settings through the environment (BENCH_JOBS, BENCH_REPLICAS, ...),
the script through flags (the harness's parser reads both); both land in one frozen Options, and the
node count that fits every pod is computed here, once.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from testbed.harness.base import HarnessParser

PODS_PER_NODE: Final = 100  # of the 110 a node allows (testbed/cluster/nodes.py), leaving slack
GPUS_PER_NODE: Final = 8


@dataclass(frozen=True)
class Options:
    jobs: int
    replicas: int
    memory_jobs: int
    gpus_per_worker: int
    nodes: int
    window: float
    settle: float
    create_threads: int
    timeout: float
    dev_dir: Path
    operator_args: tuple[str, ...]
    profile: bool = False

    @property
    def pods(self) -> int:
        return self.jobs * self.replicas


def parse_options(argv: list[str] | None) -> Options:
    parser = HarnessParser(
        "bench",
        "BENCH",
        "Benchmark the operator on a throwaway local cluster; prints one JSON object.",
        dev_dir="bench",
        epilog="Arguments after `--` (and $BENCH_OPERATOR_ARGS) are passed to the operator.",
    )
    setting = parser.setting
    setting("--jobs", int, 500, "TrainingJobs to create")
    setting("--replicas", int, 4, "numWorkers")
    setting("--memory-jobs", int, 1000, "jobs in the memory phase, 0 to skip it")
    setting("--gpus-per-worker", int, 0)
    setting("--nodes", int, 0, "kwok nodes (0: enough for every pod)")
    setting("--window", float, 60.0, "steady-state window in seconds")
    setting("--settle", float, 10.0, "seconds to wait after all jobs are Running before the window")
    setting("--create-threads", int, 8)
    setting("--timeout", float, 900.0, "give up on a phase after this many seconds")
    parser.switch("--profile", "sample the operator with py-spy during the bring-up")
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, extra = argv[:split], argv[split + 1 :]
    args = parser.parse_args(argv)
    operator_args = tuple(shlex.split(os.environ.get("BENCH_OPERATOR_ARGS", ""))) + tuple(extra)
    if args.jobs < 1 or args.replicas < 1:
        parser.error("--jobs and --replicas must be at least 1")
    most_pods = max(args.jobs, args.memory_jobs) * args.replicas
    # Enough nodes for every pod (and GPU), plus a spare.
    nodes = args.nodes or 1 + max(
        math.ceil(most_pods / PODS_PER_NODE),
        math.ceil(most_pods * args.gpus_per_worker / GPUS_PER_NODE),
        1,
    )
    return Options(
        jobs=args.jobs,
        replicas=args.replicas,
        memory_jobs=args.memory_jobs,
        gpus_per_worker=args.gpus_per_worker,
        nodes=nodes,
        window=args.window,
        settle=args.settle,
        create_threads=max(1, args.create_threads),
        timeout=args.timeout,
        dev_dir=args.dev_dir.resolve(),
        operator_args=operator_args,
        profile=args.profile,
    )
