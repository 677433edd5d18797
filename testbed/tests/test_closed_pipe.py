"""The testbed's commands when their reader stops reading (`hack/dev-cluster.sh status | head`).

Why: the output of `status`, `env` and `images list` is read through pipes, and a reader that stops
early is normal there; the command must stop quietly, not print a BrokenPipeError traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.common import REPO


@pytest.mark.parametrize(
    "command",
    [["testbed.cluster", "env"], ["testbed.cluster", "status"], ["testbed.images", "list"]],
    ids=["dev-cluster env", "dev-cluster status", "images list"],
)
def test_a_closed_pipe_ends_the_command_without_a_traceback(command: list[str], tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        result = subprocess.run(
            [sys.executable, "-m", *command],
            cwd=REPO,
            env={**os.environ, "TJ_DEV_DIR": str(tmp_path / "dev"), "TJ_CACHE_DIR": str(tmp_path / "cache")},
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 128 + 13
