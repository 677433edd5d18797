"""The machine's real-node lock as `hack/dev-cluster.sh up` takes it (testbed/node/nodelock.py).

The promises: a node started by `up` outside a test session holds the lock through a holder process
that outlives the command and names the node's cluster; `release` frees it; while another holds it,
`up --with real-node` is refused in one line, exit code 2, naming the holder, before it builds or
starts anything; a caller that holds the lock already (a test session or the bench running `up`,
`flock LOCK hack/dev-cluster.sh up ...`) gets no holder. Against a scratch lock file (TJ_REAL_NODE_LOCK
moves it), never the machine's. Starting and taking down a real node with it: test_real_node.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.common import REPO, process_start_time
from testbed.node import nodelock
from testbed.tests.clusters import SCRIPT
from tests import sessions

CLAIMS = """
import json, sys
from pathlib import Path
from testbed.node import nodelock
print(json.dumps(nodelock.claim(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))))
"""


def claim_in_a_child(dev: Path, lock: Path, *, under: tuple[str, ...] = ()) -> dict[str, object] | None:
    """nodelock.claim in a process of its own (as `up` runs it), which then exits."""
    command = [*under, sys.executable, "-c", CLAIMS, str(dev), str(dev / "lock.log"), str(lock)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    record: dict[str, object] | None = json.loads(result.stdout)
    return record


def test_the_holders_line_names_its_cluster_for_sessions_and_refusals(tmp_path: Path) -> None:
    line = nodelock.holder_line(4321, tmp_path)
    assert nodelock.holder_pid(line) == 4321
    assert nodelock.held_by_caller(line, [4321, 1])
    assert not nodelock.held_by_caller(line, [1234, 1])
    assert nodelock.holder_pid("pid 77 in /repo, test run gw") == 77  # a test session's line
    assert nodelock.holder_pid("holder unknown") is None
    assert not nodelock.held_by_caller("holder unknown", [1])
    # A test session on that very cluster uses its node; on another it waits.
    assert sessions.held_by_cluster_node(line, tmp_path)
    assert not sessions.held_by_cluster_node(line, tmp_path / "other")
    assert not sessions.held_by_cluster_node(f"pid 77 in {tmp_path}, test run gw", tmp_path)
    assert sessions.REAL_NODE_LOCK == nodelock.LOCK
    refused = nodelock.refusal(line)
    assert "\n" not in refused
    assert line in refused
    assert nodelock.ancestors()[0] == os.getppid()


def test_a_holder_keeps_the_lock_after_up_exits_until_it_is_released(tmp_path: Path) -> None:
    lock = tmp_path / "real-node.lock"
    record = claim_in_a_child(tmp_path, lock)
    assert record is not None
    try:
        assert process_start_time(int(str(record["pid"]))) == record["start_time"]
        assert nodelock.current_holder(lock) == nodelock.holder_line(int(str(record["pid"])), tmp_path)
        with pytest.raises(
            nodelock.RealNodeHeld, match=f"held by another session or node \\(pid {record['pid']}:"
        ):
            nodelock.check(lock)
        assert nodelock.RealNodeHeld.exit_code == 2
    finally:
        nodelock.release(record)
    assert nodelock.current_holder(lock) is None
    nodelock.release(record)  # a second release does nothing


def test_a_caller_holding_the_lock_already_gets_no_holder(tmp_path: Path) -> None:
    lock = tmp_path / "real-node.lock"
    # As a test session: this process holds it, and `up` runs below it.
    with lock.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        handle.write(f"pid {os.getpid()} in {REPO}\n")
        handle.flush()
        assert claim_in_a_child(tmp_path, lock) is None
        fcntl.flock(handle, fcntl.LOCK_UN)
    # As the brief's `flock LOCK hack/dev-cluster.sh up ...`: the lock's open file is inherited.
    assert claim_in_a_child(tmp_path, lock, under=("flock", str(lock))) is None
    assert nodelock.current_holder(lock) is None  # nothing left holding it


def test_up_with_the_real_node_is_refused_in_one_line_while_another_holds_it(tmp_path: Path) -> None:
    lock = tmp_path / "real-node.lock"
    record = claim_in_a_child(tmp_path / "elsewhere", lock)
    assert record is not None
    dev = tmp_path / "dev"
    env = {**os.environ, "TJ_DEV_DIR": str(dev), "TJ_REAL_NODE_LOCK": str(lock)}
    try:
        result = subprocess.run(
            [str(SCRIPT), "up", "--with", "real-node"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        nodelock.release(record)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    assert f"the machine's real node is held by another session or node (pid {record['pid']}: " in errors[0]
    assert f"the real node of the cluster in {tmp_path / 'elsewhere'}" in errors[0]
    assert not (dev / "run" / "state.json").exists()  # nothing was started
