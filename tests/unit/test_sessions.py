"""tests/sessions.py: each parallel worker's cluster directory, the tests' groups, the session and real
node locks (a second session refused in one line, a waiting real node)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests import sessions


def test_a_worker_gets_a_directory_of_its_own_under_the_sessions() -> None:
    assert sessions.worker_dir({}) is None
    assert sessions.worker_dir({"TJ_DEV_DIR": "/d"}) is None
    assert sessions.worker_dir({"TJ_DEV_DIR": "/d", sessions.WORKER: "gw2"}) == Path("/d/workers/gw2")
    assert sessions.worker_dir({sessions.WORKER: "gw0"}) == sessions.REPO / ".dev" / "workers" / "gw0"


def test_use_worker_dir_points_tj_dev_dir_at_it(tmp_path: Path) -> None:
    environ = {"TJ_DEV_DIR": str(tmp_path), sessions.WORKER: "gw1"}
    sessions.use_worker_dir(environ)
    assert environ["TJ_DEV_DIR"] == str(tmp_path / "workers" / "gw1")
    assert (tmp_path / "workers" / "gw1").is_dir()
    outside = {"TJ_DEV_DIR": str(tmp_path)}
    sessions.use_worker_dir(outside)
    assert outside == {"TJ_DEV_DIR": str(tmp_path)}


@pytest.mark.parametrize(
    ("fixtures", "marked", "group"),
    [
        (("cluster", "namespace"), False, "tests/e2e/test_x.py"),
        (("cluster", "real_node"), False, sessions.REAL_NODE_GROUP),
        (("cluster", "network_policies"), False, sessions.REAL_NODE_GROUP),
        (("cluster",), True, sessions.REAL_NODE_GROUP),
    ],
)
def test_the_real_nodes_tests_share_a_group_and_the_rest_stay_with_their_module(
    fixtures: tuple[str, ...], marked: bool, group: str
) -> None:
    assert sessions.group_of("tests/e2e/test_x.py", fixtures, marked) == group


# A process that holds a session's lock (argv: "session" and its directory, or "lock" and a lock file).
HOLD = """
import sys, time
from pathlib import Path
from tests import sessions
kind, path = sys.argv[1], Path(sys.argv[2])
handle = sessions._try_lock(path)[0] if kind == "lock" else None  # kept: a closed file lets go
held = handle is not None if kind == "lock" else sessions.claim_session(path) is None
print("held" if held else "refused", flush=True)
time.sleep(60)
"""


def holding(kind: str, path: Path) -> subprocess.Popen[str]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, kind, str(path)], cwd=sessions.REPO, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_session_on_the_same_clusters_is_refused_in_one_line(tmp_path: Path) -> None:
    holder = holding("session", tmp_path)
    try:
        refused = sessions.claim_session(tmp_path)
        assert refused is not None
        assert "\n" not in refused
        assert f"another test session uses the clusters of {tmp_path} (pid {holder.pid} in" in refused
        assert "TJ_DEV_DIR" in refused
    finally:
        holder.kill()
        holder.wait()
    assert sessions.claim_session(tmp_path) is None  # its holder gone, the lock is free


def test_the_real_node_is_waited_for_while_another_session_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "real-node.lock"
    monkeypatch.setattr(sessions, "REAL_NODE_LOCK", lock)
    monkeypatch.delenv(sessions.TEST_RUN, raising=False)  # set in make test's workers: the holder is not one
    holder = holding("lock", lock)
    said: list[str] = []

    def say_and_let_go(line: str) -> None:
        said.append(line)
        holder.kill()
        holder.wait()

    try:
        sessions.claim_real_node(say=say_and_let_go, poll=0.05)
    finally:
        holder.kill()
        holder.wait()
    holds = f"pid {holder.pid} in {sessions.REPO}"
    assert said == [f"waiting for the machine's real node: another session or node holds it ({holds})"]
    assert any(Path(handle.name) == lock for handle in sessions._held)
    sessions.claim_real_node(say=said.append)  # held already: returns at once, says nothing
    assert len(said) == 1


GROUPING_CONFTEST = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.xdist_group("together"))
"""
GROUPED_TESTS = """
import pytest

@pytest.mark.parametrize("i", range(4))
def test_it(i):
    pass
"""


def test_xdist_keeps_a_group_added_at_collection_on_one_worker(tmp_path: Path) -> None:
    """What make test's grouping rests on, with the pytest and pytest-xdist installed: a group added by
    a conftest hook (as conftest.py does) sends all its tests to one worker (pytest 9.2 broke this
    silently: pytest-dev/pytest-xdist#1386, so setup.cfg keeps pytest below it)."""
    (tmp_path / "conftest.py").write_text(GROUPING_CONFTEST)
    (tmp_path / "test_a.py").write_text(GROUPED_TESTS)
    (tmp_path / "test_b.py").write_text(GROUPED_TESTS)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    passed = [line.split() for line in result.stdout.splitlines() if " PASSED " in line]
    assert len(passed) == 8, result.stdout
    assert {fields[0] for fields in passed} in ({"[gw0]"}, {"[gw1]"}), result.stdout
    assert all(fields[-1].endswith("@together") for fields in passed), result.stdout


def test_a_worker_of_the_same_run_holding_the_real_node_is_an_error_not_a_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "real-node.lock"
    monkeypatch.setattr(sessions, "REAL_NODE_LOCK", lock)
    monkeypatch.setenv(sessions.TEST_RUN, "run-1")
    holder = holding("lock", lock)  # inherits the run's id, as a sibling worker would
    try:
        with pytest.raises(RuntimeError, match="the real node's tests of this run are in two workers"):
            sessions.claim_real_node(say=lambda line: None, poll=0.05)
    finally:
        holder.kill()
        holder.wait()


# A dev cluster's real node started by `hack/dev-cluster.sh up` holds the lock through a holder process
# (testbed/node/nodelock.py, run the way `up` runs it): argv the lock file and the cluster's directory.
DEV_NODE_HOLDER = (
    "import sys; from pathlib import Path; from testbed.node.nodelock import hold; "
    "sys.exit(hold(Path(sys.argv[1]), Path(sys.argv[2])))"
)


def test_a_dev_clusters_node_is_waited_for_naming_it_unless_it_is_the_sessions_own_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = tmp_path / "real-node.lock"
    monkeypatch.setattr(sessions, "REAL_NODE_LOCK", lock)
    monkeypatch.delenv(sessions.TEST_RUN, raising=False)
    dev = tmp_path / "dev"
    holder = subprocess.Popen(
        [sys.executable, "-c", DEV_NODE_HOLDER, str(lock), str(dev)],
        cwd=sessions.REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    said: list[str] = []

    def say_and_let_go(line: str) -> None:
        said.append(line)
        holder.terminate()
        holder.wait()

    try:
        # The session runs on that cluster (it found it running): the node is its own; nothing held.
        sessions.claim_real_node(say=said.append, poll=0.05, cluster_dir=dev)
        assert said == []
        assert not any(Path(handle.name) == lock for handle in sessions._held)
        # Another cluster's session waits, naming the dev node, and takes the lock once it is down.
        sessions.claim_real_node(say=say_and_let_go, poll=0.05, cluster_dir=tmp_path / "mine")
    finally:
        holder.kill()
        holder.wait()
    assert len(said) == 1
    assert said[0].startswith(
        f"waiting for the machine's real node: another session or node holds it (pid {holder.pid}: "
        f"the real node of the cluster in {dev}, started by hack/dev-cluster.sh up"
    )
    assert any(Path(handle.name) == lock for handle in sessions._held)


def test_the_uncached_images_are_published_to_the_workers_once_computed(tmp_path: Path) -> None:
    """The controller computes the later images' keys (seconds) in a thread while its workers start;
    each worker waits for the file and orders its tests by it, as every other worker does."""
    environ: dict[str, str] = {}
    assert sessions.read_uncached(environ) == set()  # nothing published: a session without images
    computing = threading.Event()

    def slow() -> list[str]:
        computing.wait(10)
        return ["image:trainer-mpi", "image:mlflow"]

    path = tmp_path / "uncached-images"
    path.write_text("left from an earlier run")
    sessions.publish_uncached(path, slow, environ)
    assert environ[sessions.UNCACHED_FILE] == str(path)
    assert not path.exists()  # an earlier run's answer is not this one's
    with pytest.raises(RuntimeError, match="did not write"):
        sessions.read_uncached(environ, timeout=0.2, poll=0.05)
    computing.set()
    assert sessions.read_uncached(environ, timeout=10, poll=0.05) == {"image:trainer-mpi", "image:mlflow"}

    def failing() -> list[str]:
        raise OSError("apt-cache failed")

    sessions.publish_uncached(path, failing, environ)
    assert sessions.read_uncached(environ, timeout=10, poll=0.05) == set()  # ordered as if cached
