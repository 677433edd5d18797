"""`make test` and `make test-long` on a machine that cannot run the real node still run the tests.

README ("Quick start") says what such a machine gets: the real node's tests skipped, each with its
reason, and everything else run. The targets build the real node before the tests only where it can
run (root and cgroup v1); on a machine with cgroup v2 only (the default of current Debian and Ubuntu
releases) the build would stop the whole target, so they say why instead and go on. Run here with
TJ_CGROUP_FS (read as hack/preflight.sh reads it) pointing at a directory without cgroup v1's
hierarchies, the target's other prerequisites left as they are (`make -o`) and the test run replaced
by an echo of its command.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DONE_ALREADY = (".venv/.installed", "promtool", "node-tools")


@pytest.mark.parametrize(("target", "selection"), [("test", "not long"), ("test-long", "long")])
def test_the_test_targets_go_on_without_cgroup_v1(tmp_path: Path, target: str, selection: str) -> None:
    keep = [argument for prerequisite in DONE_ALREADY for argument in ("-o", prerequisite)]
    result = subprocess.run(
        ["make", "--no-print-directory", *keep, target, "VENV_PY=echo python"],
        cwd=REPO,
        env={**os.environ, "TJ_CGROUP_FS": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1].startswith(f"python -m pytest -m {selection}"), lines[-1]
    assert not any("build real-node" in line for line in lines)
    if target == "test":
        why = "not root" if os.geteuid() != 0 else "no cgroup v1 (this machine has cgroup v2 only)"
        assert lines[0].startswith(f"{why}: the real node's tests will be skipped"), lines
