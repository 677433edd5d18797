"""`make soak`'s settings: flags, each also read from a SOAK_* environment variable (the Makefile's)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.harness.base import HarnessParser


@dataclass(frozen=True)
class Options:
    jobs: int
    seconds: float
    sample_every: float
    tolerance_mb: float
    seed: int
    dev_dir: Path


def parse_options(argv: list[str] | None = None) -> Options:
    parser = HarnessParser(
        "soak",
        "SOAK",
        "Keeps TrainingJobs churning against the operator for a bounded time and reports its RSS and CPU "
        "over time (docs/soak.md).",
        dev_dir="soak",
    )
    setting = parser.setting
    setting("--jobs", int, 200, "jobs in flight")
    setting("--seconds", float, 900.0, "how long to churn")
    setting(
        "--sample-every",
        float,
        10.0,
        "seconds between samples of the operator's RSS and CPU",
        variable="SOAK_SAMPLE_SECONDS",
    )
    setting(
        "--tolerance-mb",
        float,
        5.0,
        "RSS growth between the two later halves of the run that still counts as levelled off",
    )
    setting("--seed", int, 15)
    parsed = parser.parse_args(argv)
    if parsed.jobs < 1 or parsed.seconds <= 0 or parsed.sample_every <= 0:
        parser.error("--jobs, --seconds and --sample-every must be positive")
    return Options(
        parsed.jobs,
        parsed.seconds,
        parsed.sample_every,
        parsed.tolerance_mb,
        parsed.seed,
        parsed.dev_dir.resolve(),
    )
