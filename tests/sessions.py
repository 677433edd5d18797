"""Who runs which cluster in a test session, when `make test` runs the suite in parallel processes.

Why: most of the suite's time is spent waiting on a cluster (an operator to act, a pod to start, a
deadline to pass), not computing, so `make test` runs it in pytest-xdist workers. A cluster is one
test's world (its Lease, its CRDs and policies, its nodes, an API server a test restarts), so each
worker gets its own, in a directory of its own under the session's (`<TJ_DEV_DIR or .dev>/workers/gwN`),
and never sees another's. What the machine has once, the real node, goes to one worker: every test on
it is in one xdist group (`xdist_group("real-node")`), and a session takes the machine's real node
only once another session has let go of it. Tests of one module stay in one worker, in order (their
module fixtures and their waits are written for that).

Standard library only, and free of the testbed: conftest.py calls `use_worker_dir()` before anything
imports the testbed, which reads TJ_DEV_DIR once.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import IO, Final

REPO: Final = Path(__file__).resolve().parent.parent
WORKER: Final = "PYTEST_XDIST_WORKER"
TEST_RUN: Final = "PYTEST_XDIST_TESTRUNUID"  # the same in every worker of one run
REAL_NODE_GROUP: Final = "real-node"
# The fixtures that put a test on the real node.
REAL_NODE_FIXTURES: Final = frozenset({"real_node", "network_policies"})
# Whose real node it is: held by the session (process) that runs the node's tests, until it exits.
# (TJ_REAL_NODE_LOCK moves it, for a test of the lock; testbed/node/nodelock.py reads the same.)
REAL_NODE_LOCK: Final = Path(
    os.environ.get("TJ_REAL_NODE_LOCK") or Path(tempfile.gettempdir()) / "trainingjob-operator-real-node.lock"
)
# The components the session's controller found uncached, for every worker to order its tests alike.
UNCACHED: Final = "TJ_TEST_UNCACHED"
# The file where the controller writes which of the real node's later images are uncached: their keys
# take seconds to compute, which the workers' start-up and collection hide (`publish_uncached`).
UNCACHED_FILE: Final = "TJ_TEST_UNCACHED_FILE"

# Open lock files stay referenced for as long as the process runs: closing one would release it.
_held: list[IO[str]] = []


def session_dir(environ: Mapping[str, str]) -> Path:
    """The directory of the session's clusters: TJ_DEV_DIR, else the checkout's `.dev`."""
    return Path(environ.get("TJ_DEV_DIR") or REPO / ".dev")


def worker_dir(environ: Mapping[str, str]) -> Path | None:
    """The cluster directory of this xdist worker, or None outside a worker."""
    worker = environ.get(WORKER)
    return session_dir(environ) / "workers" / worker if worker else None


def use_worker_dir(environ: MutableMapping[str, str] = os.environ) -> None:
    """In an xdist worker, points TJ_DEV_DIR at the worker's own cluster directory."""
    directory = worker_dir(environ)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        environ["TJ_DEV_DIR"] = str(directory)


def group_of(module: str, fixtures: Iterable[str], marked_real_node: bool) -> str:
    """The xdist group of a test: the real node's, or its module's."""
    if marked_real_node or REAL_NODE_FIXTURES.intersection(fixtures):
        return REAL_NODE_GROUP
    return module


def _try_lock(path: Path) -> tuple[IO[str] | None, str]:
    """(the open lock file, "") when this process got the lock, else (None, who holds it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "holder unknown"
        handle.close()
        return None, holder
    handle.seek(0)
    handle.truncate()
    run = os.environ.get(TEST_RUN)
    handle.write(f"pid {os.getpid()} in {REPO}" + (f", test run {run}" if run else "") + "\n")
    handle.flush()
    return handle, ""


def claim_session(directory: Path) -> str | None:
    """Takes the session lock of a cluster directory for as long as this process runs; None when
    taken, else one line saying who holds it (another session would share, and tear down, its
    clusters)."""
    handle, holder = _try_lock(directory / "session.lock")
    if handle is None:
        return (
            f"another test session uses the clusters of {directory} ({holder}): "
            "wait for it to end, or give this one its own with TJ_DEV_DIR"
        )
    _held.append(handle)
    return None


def held_by_cluster_node(holder: str, cluster_dir: Path) -> bool:
    """Whether the lock's holder is the real node a dev cluster in `cluster_dir` runs (its holder's
    line, testbed/node/nodelock.py holder_line)."""
    return f": the real node of the cluster in {cluster_dir}, " in holder


def claim_real_node(
    say: Callable[[str], None], poll: float = 5.0, every: float = 60.0, cluster_dir: Path | None = None
) -> None:
    """Waits until no other session on the machine holds its real node, then holds it until this
    process exits (the node is torn down with the session's cluster, after every fixture). A node
    that `hack/dev-cluster.sh up` started holds the lock itself until its `down` (testbed/node/
    nodelock.py): the session waits for it too, unless it is the node of `cluster_dir`, the very
    cluster the session runs on."""
    if any(Path(handle.name) == REAL_NODE_LOCK for handle in _held):
        return
    started = time.monotonic()
    last_said = -every
    while True:
        handle, holder = _try_lock(REAL_NODE_LOCK)
        if handle is not None:
            _held.append(handle)
            return
        if cluster_dir is not None and held_by_cluster_node(holder, cluster_dir):
            return
        run = os.environ.get(TEST_RUN)
        if run and holder.endswith(f", test run {run}"):
            # Another worker of this very run: waiting would never end.
            raise RuntimeError(
                f"the real node's tests of this run are in two workers ({holder} has the node): "
                "their xdist group did not hold them together (tests/sessions.py)"
            )
        waited = time.monotonic() - started
        if waited - last_said >= every:
            say(f"waiting for the machine's real node: another session or node holds it ({holder})")
            last_said = waited
        time.sleep(poll)


def publish_uncached(path: Path, compute: Callable[[], list[str]], environ: MutableMapping[str, str]) -> None:
    """Computes `compute()` in a thread while the workers start, then writes it to `path` (renamed
    into place whole); the workers find the file through `environ` and wait for it (`read_uncached`)."""
    path.unlink(missing_ok=True)
    environ[UNCACHED_FILE] = str(path)

    def write() -> None:
        try:
            found = compute()
        except Exception as error:  # the workers must not wait for nothing: they order as if cached
            print(f"finding the uncached images failed: {error}", file=sys.stderr, flush=True)
            found = []
        partial = path.with_name(path.name + ".partial")
        partial.write_text(",".join(found))
        partial.rename(path)

    threading.Thread(target=write, name="uncached-images", daemon=True).start()


def read_uncached(environ: Mapping[str, str], timeout: float = 300.0, poll: float = 0.1) -> set[str]:
    """What the controller published with `publish_uncached` (nothing when it did not), once written."""
    where = environ.get(UNCACHED_FILE)
    if not where:
        return set()
    path = Path(where)
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the session's controller did not write {path} within {timeout:.0f}s")
        time.sleep(poll)
    return set(filter(None, path.read_text().split(",")))
