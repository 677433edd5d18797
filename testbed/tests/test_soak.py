"""The short soak the test suite makes (the long one is `make soak`, docs/soak.md): it really churns,
creating, failing, completing and deleting jobs, samples the operator, and leaves nothing held. Memory
and CPU targets belong to the benchmark, not to this test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from testbed.common import REPO


def test_a_short_soak_churns_jobs_and_samples_the_operator(scratch_dir: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "testbed.harness.soak",
            "--jobs=20",
            "--seconds=90",
            "--sample-every=5",
            f"--dev-dir={scratch_dir}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode in (0, 1), result.stdout + result.stderr[-4000:]
    [line] = [line for line in result.stdout.splitlines() if line.startswith("soak: ")]
    report = json.loads((scratch_dir / "soak-report.json").read_text())
    churn = report["churn"]
    assert churn["created"] > 20, churn  # completed jobs were replaced by new ones
    for happened in ("completions", "rank_failures", "deleted"):
        assert churn.get(happened, 0) > 0, churn
    assert len(report["samples"]) >= 6
    assert report["stuck_terminating"] == 0, line
    assert "stopping the soak cluster" in result.stderr
