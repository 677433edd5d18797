"""An interrupted `make bench-peer` leaves nothing running: Ctrl-C (SIGINT) or SIGTERM while an
operator runs on the bench cluster stops that operator (this one, or Kubeflow's) and every process of
the cluster, and the bench exits 130."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from testbed.common import REPO, process_start_time, still_running, wait_until
from testbed.harness.bench.comparison import KUBEFLOW_TUNED, OURS
from testbed.tests.clusters import read_state

READY = re.compile(r"is ready \(pid (\d+),")


# The bench as a terminal starts it, whatever this session inherited: a test session started in the
# background by a non-interactive shell (`.ci/run &`) ignores SIGINT, and so would the bench it starts,
# as any program started that way does. This resets SIGINT, then becomes the bench (same pid).
INTERRUPTIBLE = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def interrupt_peer_bench(dev_dir: Path, contender: str, stop: signal.Signals) -> None:
    command = [
        sys.executable,
        "-c",
        INTERRUPTIBLE,
        "-m",
        "testbed.harness.bench.peer",
        "--jobs=3",
        "--replicas=1",
        f"--sequence={contender}",
        "--window=600",  # still measuring the idle operator when the signal comes
        "--settle=0",
        "--cooldown=0",
        f"--dev-dir={dev_dir}",
    ]
    bench = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []

    def read() -> None:
        assert bench.stderr is not None
        lines.extend(bench.stderr)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_until(
            "the bench to measure the idle operator",
            lambda: any("measuring the steady state" in line for line in lines) or bench.poll() is not None,
            timeout=300,
            interval=0.2,
        )
        assert bench.poll() is None, "".join(lines[-30:])
        (pid,) = {int(match[1]) for line in lines if (match := READY.search(line))}
        cluster = list(read_state(dev_dir)["processes"].values())
        assert cluster
        assert all(still_running(record) for record in cluster)
        bench.send_signal(stop)
        try:
            code = bench.wait(timeout=180)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running 180 s after {stop.name}:\n{''.join(lines[-40:])}") from None
        reader.join(timeout=30)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    output = "".join(lines)
    assert code == 130, output[-3000:]
    assert "interrupted" in output
    assert "stopping the bench cluster" in output
    assert process_start_time(pid) is None, f"the operator (pid {pid}) still runs"
    assert not [record for record in cluster if still_running(record)], "bench cluster processes still run"


def test_ctrl_c_stops_this_operator_and_the_bench_cluster(scratch_dir: Path) -> None:
    interrupt_peer_bench(scratch_dir, OURS, signal.SIGINT)


def test_sigterm_stops_kubeflows_operator_and_the_bench_cluster(
    scratch_dir: Path, kubeflow_operator: Path
) -> None:
    assert kubeflow_operator.is_file()  # built before the bench, which would build it on first use
    interrupt_peer_bench(scratch_dir, KUBEFLOW_TUNED, signal.SIGTERM)
