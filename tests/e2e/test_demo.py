"""`make demo` end to end on a throwaway cluster: one command trains a TrainingJob to Completed.

Why: the demo is a newcomer's first contact with the project, so it must work from a fresh machine,
again on a second run (everything reused, the job created anew), and stop everything it started. The
loop it shows (operator -> pods -> trainer -> progress -> status) is tested in detail on the real
node in tests/e2e/test_real_node_loop.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from hack.common import free_port, process_start_time
from tests.cluster import REPO
from tests.hack.clusters import listening_addresses


def alive(pid: int) -> bool:
    return process_start_time(pid) is not None  # neither gone nor a zombie


def trainers(namespace: str) -> list[int]:
    """The trainer processes of a namespace on this machine (their environment names it), by pid."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if f"TRAININGJOB_NAMESPACE={namespace}".encode() in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


# ---------------------------------------------------------------------------------------------------
# make demo, end to end, on a throwaway cluster


def make(target: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), target],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
def test_make_demo_runs_end_to_end_and_again_and_stops(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    namespace = f"demo-{uuid.uuid4().hex[:6]}"
    env = dict(
        os.environ,
        TJ_DEV_DIR=str(dev),
        TJ_DEV_NODES="2",
        DEMO_NAMESPACE=namespace,
        DEMO_METRICS_PORT=str(free_port()),
        DEMO_STEP_SECONDS="0.02",
        DEMO_TIMEOUT="120",
    )
    env.pop("KUBECONFIG", None)
    state_path = dev / "run" / "state.json"
    pids: list[int] = []
    try:
        # A warm binary cache: the cluster starts in seconds. The first run may create the runtime
        # virtualenv (a minute or two) unless `make test` made .venv already.
        first = make("demo", env, timeout=600)
        output = first.stdout + first.stderr
        assert first.returncode == 0, output
        assert "preflight: ok" in output
        assert f"{namespace}/mnist-training  Completed" in output
        assert "make demo-down" in output
        assert re.search(r"epoch 10/10 +progress 100%", output), output
        state = json.loads(state_path.read_text())
        extras = state["extras"]
        assert set(extras) == {"operator", "local-kubelet"}
        pids = [p["pid"] for p in [*state["processes"].values(), *extras.values()]]
        assert all(alive(pid) for pid in pids)
        assert listening_addresses(extras["operator"]["pid"]) == {
            ("127.0.0.1", int(env["DEMO_METRICS_PORT"]))
        }
        assert listening_addresses(extras["local-kubelet"]["pid"]) == {
            ("127.0.0.1", state["ports"]["kubelet"])
        }
        # The `kubectl logs` command it prints works: the API server reads the trainer's output from
        # the local kubelet.
        [(pod, shown_namespace)] = re.findall(r"kubectl logs -f (\S+) -n (\S+)", output)
        assert shown_namespace == namespace
        kubectl = [str(dev / "bin" / "kubectl"), f"--kubeconfig={dev / 'kubeconfig'}"]
        logs = subprocess.run(
            [*kubectl, "logs", pod, "-n", namespace], capture_output=True, text=True, timeout=60, check=False
        )
        assert logs.returncode == 0, logs.stderr
        assert "training finished: 10 epochs" in logs.stdout

        # Again: everything is reused, the job is created anew and trains again.
        second = make("demo", env, timeout=300)
        output = second.stdout + second.stderr
        assert second.returncode == 0, output
        assert "already running (API server" in output
        assert "operator already runs" in output
        assert "local-kubelet already runs" in output
        assert "is there from an earlier run: deleting it" in output
        assert f"{namespace}/mnist-training  Completed" in output
        assert json.loads(state_path.read_text())["extras"] == extras
    finally:
        down = make("demo-down", env, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopping operator, local-kubelet" in down.stderr
    assert not state_path.exists()
    assert not any(alive(pid) for pid in pids)
    assert trainers(namespace) == []
