"""The bench's settings: flags, each with an environment variable, and what follows from them.

Why apart: `make bench` passes its settings through the environment (BENCH_JOBS, BENCH_REPLICAS, ...),
the script through flags; both land in one frozen Options, and the node count that fits every pod is
computed here, once.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from testbed.common import REPO

PODS_PER_NODE: Final = 100  # of the 110 a node allows (testbed/cluster/nodes.py), leaving slack
GPUS_PER_NODE: Final = 8


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


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
    parser = argparse.ArgumentParser(
        prog="python -m testbed.harness.bench",
        description="Benchmark the operator on a throwaway local cluster; prints one JSON object.",
        epilog="Arguments after `--` (and $BENCH_OPERATOR_ARGS) are passed to the operator.",
    )
    add = parser.add_argument
    add("--jobs", type=int, default=env_int("BENCH_JOBS", 500), help="TrainingJobs to create ($BENCH_JOBS)")
    add("--replicas", type=int, default=env_int("BENCH_REPLICAS", 4), help="numWorkers ($BENCH_REPLICAS)")
    add(
        "--memory-jobs",
        type=int,
        default=env_int("BENCH_MEMORY_JOBS", 1000),
        help="jobs in the memory phase, 0 to skip it ($BENCH_MEMORY_JOBS, default 1000)",
    )
    add("--gpus-per-worker", type=int, default=env_int("BENCH_GPUS_PER_WORKER", 0))
    add("--nodes", type=int, default=env_int("BENCH_NODES", 0), help="kwok nodes (default: enough)")
    add(
        "--window",
        type=float,
        default=env_float("BENCH_WINDOW", 60.0),
        help="steady-state window in seconds ($BENCH_WINDOW, default 60)",
    )
    add(
        "--settle",
        type=float,
        default=env_float("BENCH_SETTLE", 10.0),
        help="seconds to wait after all jobs are Running before the window ($BENCH_SETTLE, default 10)",
    )
    add("--create-threads", type=int, default=env_int("BENCH_CREATE_THREADS", 8))
    add(
        "--timeout",
        type=float,
        default=env_float("BENCH_TIMEOUT", 900.0),
        help="give up on a phase after this many seconds (default 900)",
    )
    add(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("BENCH_PROFILE", "") not in ("", "0", "false"),
        help="sample the operator with py-spy during the bring-up ($BENCH_PROFILE)",
    )
    add("--dev-dir", type=Path, default=Path(os.environ.get("BENCH_DEV_DIR", REPO / ".dev" / "bench")))
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
