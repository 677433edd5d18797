"""`make chaos`'s settings: flags, each also read from a CHAOS_* environment variable (the Makefile's)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.harness.base import HarnessParser


@dataclass(frozen=True)
class Options:
    jobs: int
    leader_kills: int
    sigterm_kills: int
    apiserver_restarts: int
    node_losses: int
    faults_per_round: int
    job_deletions: int
    in_place_every: int
    seed: int
    round_timeout: float
    dev_dir: Path


def parse_options(argv: list[str] | None = None) -> Options:
    parser = HarnessParser(
        "chaos",
        "CHAOS",
        "The chaos suite (docs/chaos.md): many jobs, two operator replicas, leader kills, API server "
        "restarts, injected failures, preemptions, node loss, job deletions; then an audit.",
        dev_dir="chaos",
    )
    setting = parser.setting
    setting("--jobs", int, 60, "TrainingJobs (2 workers each)")
    setting("--leader-kills", int, 20, "kill -9 of the leader")
    setting("--sigterm-kills", int, 3, "SIGTERM of the leader")
    setting("--apiserver-restarts", int, 3, "restarts of kube-apiserver")
    setting("--node-losses", int, 2, "nodes whose kubelet dies")
    setting("--faults-per-round", int, 6, "jobs faulted in each round")
    setting("--job-deletions", int, 6, "jobs deleted while they restart")
    setting(
        "--in-place-every",
        int,
        4,
        "every Nth job not strict restarts in place (restartStrategy InPlace; 0: none)",
    )
    setting("--seed", int, 15)
    setting(
        "--round-timeout",
        float,
        240.0,
        "seconds a round may take to settle before its jobs count as unconverged",
    )
    parsed = parser.parse_args(argv)
    if parsed.jobs < 2:
        parser.error("--jobs must be at least 2")
    if parsed.in_place_every < 0:
        parser.error("--in-place-every must be 0 or more")
    return Options(
        jobs=parsed.jobs,
        leader_kills=parsed.leader_kills,
        sigterm_kills=parsed.sigterm_kills,
        apiserver_restarts=parsed.apiserver_restarts,
        node_losses=parsed.node_losses,
        faults_per_round=parsed.faults_per_round,
        job_deletions=parsed.job_deletions,
        in_place_every=parsed.in_place_every,
        seed=parsed.seed,
        round_timeout=parsed.round_timeout,
        dev_dir=parsed.dev_dir.resolve(),
    )
