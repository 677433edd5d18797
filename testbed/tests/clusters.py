"""Helpers for the tests of hack/dev-cluster.sh: running it, reading its state, what listens where.

Why apart: the tests of the control plane (test_dev_cluster.py) and of its optional components
(test_optional_components.py) both drive the script, sometimes on a throwaway second cluster
(the `scratch_dir` fixture in conftest.py), and check processes and listeners through /proc.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from testbed.common import REPO

SCRIPT = REPO / "hack" / "dev-cluster.sh"


def dev_cluster(
    *args: str, dev_dir: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if dev_dir is not None:
        env["TJ_DEV_DIR"] = str(dev_dir)
    result = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"dev-cluster.sh {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def read_state(dev_dir: Path) -> dict[str, Any]:
    state = json.loads((dev_dir / "run" / "state.json").read_text())
    assert isinstance(state, dict)
    return state


def listening_ports() -> set[int]:
    """Every TCP port something on this machine listens on."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
