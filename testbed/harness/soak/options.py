"""`make soak`'s settings: flags, each also read from a SOAK_* environment variable (the Makefile's)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from testbed.common import DEV


@dataclass(frozen=True)
class Options:
    jobs: int
    seconds: float
    sample_every: float
    tolerance_mb: float
    seed: int
    dev_dir: Path


def parse_options(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.harness.soak",
        description="Keeps TrainingJobs churning against the operator for a bounded time and reports its "
        "RSS and CPU over time (docs/soak.md).",
    )
    add = parser.add_argument
    add("--jobs", type=int, default=int(os.environ.get("SOAK_JOBS", "200")), help="jobs in flight")
    add(
        "--seconds",
        type=float,
        default=float(os.environ.get("SOAK_SECONDS", "900")),
        help="how long to churn",
    )
    add(
        "--sample-every",
        type=float,
        default=float(os.environ.get("SOAK_SAMPLE_SECONDS", "10")),
        help="seconds between samples of the operator's RSS and CPU",
    )
    add(
        "--tolerance-mb",
        type=float,
        default=float(os.environ.get("SOAK_TOLERANCE_MB", "5")),
        help="RSS growth between the two later halves of the run that still counts as levelled off",
    )
    add("--seed", type=int, default=int(os.environ.get("SOAK_SEED", "15")))
    add("--dev-dir", type=Path, default=Path(os.environ.get("SOAK_DEV_DIR", DEV / "soak")))
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
