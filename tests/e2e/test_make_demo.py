"""`make demo`, end to end, on a throwaway cluster of its own with its own real node.

Why: the README's first command must work as written: the machine check, the cluster with its real
node, the operator, the simple example trained in containers to Completed, a second run reusing it
all, and `make demo-down` stopping every process and undoing the node's changes to the machine.

There is one real node per machine (its network namespace and fixed paths), so the session's is taken
off for this test and put back afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import REAL_NODE, Kubectl, free_port, listening_addresses, pid_running
from tests.cluster import REPO, dev_cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def no_session_node(real_node: Kubectl) -> Iterator[None]:
    """The session's real node taken off for the test (one per machine), put back afterwards."""
    dev_cluster("remove", "real-node")
    try:
        yield
    finally:
        dev_cluster("up", "--with", "real-node")


def make(target: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), target],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_make_demo_runs_end_to_end_and_again_and_stops(tmp_path: Path, no_session_node: None) -> None:
    dev = tmp_path / "dev"
    namespace = f"demo-{uuid.uuid4().hex[:6]}"
    env = dict(
        os.environ,
        TJ_DEV_DIR=str(dev),
        TJ_DEV_NODES="2",
        DEMO_NAMESPACE=namespace,
        DEMO_METRICS_PORT=str(free_port()),
        DEMO_HEALTH_PORT=str(free_port()),
        DEMO_STEP_SECONDS="0.02",
        DEMO_TIMEOUT="300",
    )
    env.pop("KUBECONFIG", None)
    state_path = dev / "run" / "state.json"
    machine = REAL_NODE.machine_snapshot()
    pids: list[int] = []
    try:
        # Warm caches: the cluster, its node and the images start in seconds.
        first = make("demo", env, timeout=900)
        output = first.stdout + first.stderr
        assert first.returncode == 0, output
        assert "preflight: ok" in output
        assert "root and cgroup v1 for the real node" in output
        assert f"{namespace}/mnist-training  Completed" in output
        assert "make demo-down" in output
        assert re.search(r"epoch 10/10 +progress 100%", output), output
        state = json.loads(state_path.read_text())
        extras = state["extras"]
        assert set(extras) == {"operator"}
        assert "real-node" in state["optional"]
        pids = [p["pid"] for p in [*state["processes"].values(), *extras.values()]]
        assert all(pid_running(pid) for pid in pids)
        assert listening_addresses(extras["operator"]["pid"]) == {
            ("127.0.0.1", int(env["DEMO_METRICS_PORT"])),
            ("127.0.0.1", int(env["DEMO_HEALTH_PORT"])),
        }
        kubectl = Kubectl(dev / "bin" / "kubectl", dev / "kubeconfig")
        pods = kubectl.items("pods", "-n", namespace)
        assert {pod["spec"]["nodeName"] for pod in pods} == {"real-node"}
        # The `kubectl logs` command it prints works: the node's kubelet serves the trainer's output.
        [(pod, shown_namespace)] = re.findall(r"kubectl logs (\S+) -n (\S+)", output)
        assert shown_namespace == namespace
        assert "training finished: 10 epochs" in kubectl.run("logs", pod, "-n", namespace)

        # Again: everything is reused, the job is created anew and trains again.
        second = make("demo", env, timeout=600)
        output = second.stdout + second.stderr
        assert second.returncode == 0, output
        assert "already running (API server" in output
        assert "real-node is already running" in output
        assert "operator already runs" in output
        assert "is there from an earlier run: deleting it" in output
        assert f"{namespace}/mnist-training  Completed" in output
        assert json.loads(state_path.read_text())["extras"] == extras
    finally:
        down = make("demo-down", env, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopping operator" in down.stderr
    assert "taking down the real node" in down.stderr
    assert not state_path.exists()
    assert not any(pid_running(pid) for pid in pids)
    assert REAL_NODE.machine_snapshot() == machine
