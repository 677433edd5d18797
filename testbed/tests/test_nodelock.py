"""The machine's real-node lock as `hack/dev-cluster.sh up` takes it (testbed/node/nodelock.py).

The promises: a node started by `up` outside a test session holds the lock through a holder process
that outlives the command and names the node's cluster; `release` frees it; while another holds it,
`up --with real-node` is refused in one line, exit code 2, naming the holder, before it builds or
starts anything; under a caller that holds the lock already (a test session or the bench running
`up`, `flock LOCK hack/dev-cluster.sh up ...`) the holder waits and takes over when the caller lets
go; a holder whose node is gone lets go by itself. Against a scratch lock file (TJ_REAL_NODE_LOCK
moves it), never the machine's. Starting and taking down a real node with it: test_real_node.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.common import REPO, process_start_time, wait_until
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


def test_a_caller_holding_the_lock_already_gets_a_holder_that_takes_over_when_it_lets_go(
    tmp_path: Path,
) -> None:
    """A test session (or the bench) runs `up` while it holds the lock: the node's holder waits, and
    keeps the node's lock once the session ends with its cluster kept (TJ_KEEP_CLUSTER=1)."""
    lock = tmp_path / "real-node.lock"
    with lock.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        handle.write(f"pid {os.getpid()} in {REPO}\n")
        handle.flush()
        record = claim_in_a_child(tmp_path, lock)
        assert record is not None
        try:
            assert nodelock.current_holder(lock) == f"pid {os.getpid()} in {REPO}"  # still the session's
            fcntl.flock(handle, fcntl.LOCK_UN)  # the session ends, its cluster kept
            line = nodelock.holder_line(int(str(record["pid"])), tmp_path)
            wait_until("the holder to take over", lambda: nodelock.current_holder(lock) == line, timeout=30)
        finally:
            nodelock.release(record)
    assert nodelock.current_holder(lock) is None


def test_under_flock_the_holder_takes_over_when_flock_ends(tmp_path: Path) -> None:
    """`flock LOCK hack/dev-cluster.sh up ...`: the lock's open file is inherited, so `up` is not
    refused; its node's holder takes the lock when flock lets go (a `down` in the same command stops
    it before)."""
    lock = tmp_path / "real-node.lock"
    record = claim_in_a_child(tmp_path, lock, under=("flock", str(lock)))
    assert record is not None
    try:
        line = nodelock.holder_line(int(str(record["pid"])), tmp_path)
        wait_until("the holder to take over", lambda: nodelock.current_holder(lock) == line, timeout=30)
    finally:
        nodelock.release(record)
    assert nodelock.current_holder(lock) is None


def test_a_holder_lets_go_once_its_node_has_been_gone_a_while_or_never_came() -> None:
    """A node killed without its `down` (its processes gone) frees the machine's lock after GONE_FOR;
    an `up` killed before its node started, after START_WITHIN; an unreadable cgroup proves nothing."""
    answers = iter([None, False, True, None, True, False, None, False, False, False])
    calls: list[float] = []

    def processes() -> bool | None:
        calls.append(time.monotonic())
        return next(answers)

    nodelock.watch_the_node(processes, poll=0.01, gone_for=0.025, start_within=60)
    assert len(calls) >= 8  # gone since the 6th answer, long enough by the 8th or later
    waited = time.monotonic()
    nodelock.watch_the_node(lambda: False, poll=0.01, gone_for=60, start_within=0.05)
    assert time.monotonic() - waited < 30


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
