"""Helpers for the tests of hack/dev-cluster.sh: running it, reading its state, what listens where.

Why apart: the tests of the control plane (test_dev_cluster.py) and of its optional components
(test_optional_components.py) both drive the script, sometimes on a throwaway second cluster
(the `scratch_dir` fixture in conftest.py), and check processes and listeners through /proc.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

from testbed.common import process_start_time
from tests.cluster import REPO

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


def listening_addresses(pid: int, *, also_in_netns_of: int | None = None) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on, read from /proc (no external tools): in
    its own network namespace, and in that of `also_in_netns_of` (a process may hold a socket it made
    in another namespace, as the real node's API relay does)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    owners = [pid] if also_in_netns_of is None else [pid, also_in_netns_of]
    tables = [
        (f"/proc/{owner}/net/{name}", width) for owner in owners for name, width in (("tcp", 8), ("tcp6", 32))
    ]
    for table, width in tables:
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:
                continue
            address_hex, port_hex = local.split(":")
            raw = bytes.fromhex(address_hex)
            if width == 8:
                address = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                address = socket.inet_ntop(socket.AF_INET6, words)
            found.add((address, int(port_hex, 16)))
    return found


def pid_running(pid: int) -> bool:
    return process_start_time(pid) is not None  # neither gone nor a zombie


def listening_ports() -> set[int]:
    """Every TCP port something on this machine listens on."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
