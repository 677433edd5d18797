"""A parallel test run (`make test`'s) interrupted with Ctrl-C halfway leaves nothing on the machine:
no process of its workers' clusters, nothing mounted from their directories (conftest.py's
pytest_unconfigure sweeps what a worker ended mid-teardown could not stop).

The run is a real one: pytest with two xdist workers and this repository's conftest.py, each worker's
test waiting on a cluster of its own, interrupted as a terminal's Ctrl-C does (SIGINT to the run's
process group) once both tests are running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import Cluster, wait_for
from tests import sessions
from tests.cluster import REPO

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# This run's settings, which the interrupted run must not inherit: it has clusters of its own.
RUN_SETTINGS = {"TJ_DEV_DIR", "TJ_KEEP_CLUSTER", sessions.UNCACHED}

# A test that holds its worker's cluster until the run is interrupted (its deadline is far beyond
# this module's waits).
WAITS_ON_ITS_CLUSTER = """
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="module", autouse=True)
def slow_to_tear_down():
    # Torn down before the cluster, for longer than xdist gives an interrupted worker before it
    # kills it (the real node's drain can take that long): the worker never stops its cluster.
    yield
    time.sleep(120)


def test_waits_on_its_cluster(cluster):
    cluster.run("get", "namespaces")
    Path(__file__).with_suffix(".started").touch()
    deadline = time.monotonic() + 900  # until the interrupt comes
    while time.monotonic() < deadline:
        time.sleep(0.5)
"""


def processes_naming(text: str) -> dict[int, str]:
    """Every process whose command line names `text`: pid -> command line."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            command = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in command:
            found[int(cmdline.parent.name)] = command
    return found


def test_an_interrupted_parallel_run_leaves_no_process_and_no_mount(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    for name in ("test_first.py", "test_second.py"):
        (tests / name).write_text(WAITS_ON_ITS_CLUSTER)
    dev = tmp_path / "dev"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k not in RUN_SETTINGS},
        "PYTHONPATH": str(REPO),
        "TJ_DEV_DIR": str(dev),
    }
    command = [
        sys.executable, "-m", "pytest", "-c", str(REPO / "setup.cfg"), "--rootdir", str(REPO),
        "-p", "conftest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
        "--basetemp", str(tmp_path / "basetemp"), str(tests),
    ]  # fmt: skip
    log = tmp_path / "run.log"
    with log.open("wb") as output:
        # A session of its own: its process group is the run's alone, as a terminal's foreground job
        # is; and Ctrl-C's signal not ignored, as in a terminal (a shell's background job, which this
        # test may run in, ignores it, and what it starts inherits that).
        run = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - one call
        )
    try:

        def both_started() -> bool:
            assert run.poll() is None, log.read_text(errors="replace")[-3000:]
            return len(list(tests.glob("*.started"))) == 2

        wait_for("both workers' tests to run on their clusters", both_started, timeout=300)
        assert processes_naming(str(dev / "workers")), "the workers' clusters run"
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=180)
        left_running = processes_naming(str(tmp_path))
        left_mounted = [
            line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(tmp_path) in line
        ]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        for worker in dev.glob("workers/gw*"):  # whatever the run left, not for the rest of the session
            Cluster(worker).script("down", check=False, quiet=True)
    output_text = log.read_text(errors="replace")[-3000:]
    assert run.returncode == 2, output_text  # pytest's "interrupted"
    assert "KeyboardInterrupt" in output_text, output_text
    assert left_running == {}, output_text
    assert left_mounted == [], output_text
