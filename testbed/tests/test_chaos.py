"""The short chaos run the test suite makes (the long one is `make chaos`, docs/chaos.md): six jobs,
two leader kills, a SIGTERM, an API server restart and a node loss, with every kind of fault (two of the
jobs restart in place, and the leader is killed in the middle of their restarts); every invariant must
hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from testbed.common import REPO

SHORT = (
    "--jobs=6",
    "--leader-kills=2",
    "--sigterm-kills=1",
    "--apiserver-restarts=1",
    "--node-losses=1",
    "--faults-per-round=3",
    "--job-deletions=1",
    "--seed=44",
    "--round-timeout=180",
)


def test_a_short_chaos_run_keeps_every_invariant(scratch_dir: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "testbed.harness.chaos", *SHORT, f"--dev-dir={scratch_dir}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    [line] = [line for line in result.stdout.splitlines() if line.startswith("chaos ")]
    assert line.startswith("chaos PASS"), line
    report = json.loads((scratch_dir / "chaos-report.json").read_text())
    assert report["leader_kills"] == 2
    assert set(report["faults"]) >= {
        "fail",
        "fail-in-place",
        "preempt",
        "preempt-peer-fails",
        "force-delete",
        "delete-job",
    }
    assert all(findings == [] for findings in report["findings"].values()), report["findings"]
    # Every process it started is gone: its cluster is down.
    assert "stopping the chaos cluster" in result.stderr
