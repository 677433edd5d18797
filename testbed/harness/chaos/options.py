"""`make chaos`'s settings: flags, each also read from a CHAOS_* environment variable (the Makefile's)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from testbed.common import DEV


@dataclass(frozen=True)
class Options:
    jobs: int
    leader_kills: int
    sigterm_kills: int
    apiserver_restarts: int
    node_losses: int
    faults_per_round: int
    job_deletions: int
    seed: int
    round_timeout: float
    dev_dir: Path


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def parse_options(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.harness.chaos",
        description="The chaos suite (docs/chaos.md): many jobs, two operator replicas, leader kills, API "
        "server restarts, injected failures, preemptions, node loss, job deletions; then an audit.",
    )
    add = parser.add_argument
    add("--jobs", type=int, default=_env_int("CHAOS_JOBS", 60), help="TrainingJobs (2 workers each)")
    add("--leader-kills", type=int, default=_env_int("CHAOS_LEADER_KILLS", 20), help="kill -9 of the leader")
    add("--sigterm-kills", type=int, default=_env_int("CHAOS_SIGTERM_KILLS", 3), help="SIGTERM of the leader")
    add(
        "--apiserver-restarts",
        type=int,
        default=_env_int("CHAOS_APISERVER_RESTARTS", 3),
        help="restarts of kube-apiserver",
    )
    add("--node-losses", type=int, default=_env_int("CHAOS_NODE_LOSSES", 2), help="nodes whose kubelet dies")
    add(
        "--faults-per-round",
        type=int,
        default=_env_int("CHAOS_FAULTS_PER_ROUND", 6),
        help="jobs faulted in each round",
    )
    add(
        "--job-deletions",
        type=int,
        default=_env_int("CHAOS_JOB_DELETIONS", 6),
        help="jobs deleted while they restart",
    )
    add("--seed", type=int, default=_env_int("CHAOS_SEED", 15))
    add(
        "--round-timeout",
        type=float,
        default=float(os.environ.get("CHAOS_ROUND_TIMEOUT", "240")),
        help="seconds a round may take to settle before its jobs count as unconverged",
    )
    add("--dev-dir", type=Path, default=Path(os.environ.get("CHAOS_DEV_DIR", DEV / "chaos")))
    parsed = parser.parse_args(argv)
    if parsed.jobs < 2:
        parser.error("--jobs must be at least 2")
    return Options(
        jobs=parsed.jobs,
        leader_kills=parsed.leader_kills,
        sigterm_kills=parsed.sigterm_kills,
        apiserver_restarts=parsed.apiserver_restarts,
        node_losses=parsed.node_losses,
        faults_per_round=parsed.faults_per_round,
        job_deletions=parsed.job_deletions,
        seed=parsed.seed,
        round_timeout=parsed.round_timeout,
        dev_dir=parsed.dev_dir.resolve(),
    )
