"""The local kubelet as end-to-end tests run it: a process per test, its trainers, its files.

Why apart: the tests of real training (test_demo.py), of the local kubelet's pods, volumes and logs
(test_local_kubelet.py) and of the client's docs (test_client_docs.py) all start one for their
namespace and look at the processes it started; every one they start is stopped, and no container
process of it is left, when the test ends. The kubelet writes its container logs to the cluster's
log directory (.dev/logs/pods, the default), which every local kubelet of the cluster shares: any of
them may be the one answering a `kubectl logs`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hack.common import process_start_time
from tests.cluster import DEV, REPO, wait_for
from tests.e2e.jobs import job_manifest

JsonDict = dict[str, Any]
STOP_TIMEOUT = 40.0
FAST_EPOCHS = {"TRAIN_STEPS_PER_EPOCH": "5", "TRAIN_STEP_SECONDS": "0.2", "TRAIN_PROGRESS_INTERVAL": "0"}
POD_LOGS = DEV / "logs" / "pods"


def kubelet_port() -> int:
    """The kubelet port every node names in its status (hack/devcluster)."""
    return int(json.loads((DEV / "run" / "state.json").read_text())["ports"]["kubelet"])


@dataclass
class LocalKubelet:
    namespace: str
    state_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> LocalKubelet:
        command = [
            sys.executable,
            "-m",
            "hack.local_kubelet",
            f"--namespace={self.namespace}",
            f"--kubeconfig={DEV / 'kubeconfig'}",
            f"--state-dir={self.state_dir}",
        ]
        # The admin kubeconfig is in this environment on purpose: the trainers must not inherit it.
        env = dict(os.environ, KUBECONFIG=str(DEV / "kubeconfig"))
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        wait_for("the local kubelet watching", lambda: "watching pods" in self.log(), timeout=60)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def pod_log(self, pod: str) -> str:
        """The pod's journal: every container's output and the kubelet's lines about them."""
        path = POD_LOGS / f"{self.namespace}_{pod}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def pod_dir(self, pod: JsonDict) -> Path:
        """Where the pod's own volumes and home directory are."""
        metadata = pod["metadata"]
        return self.state_dir / self.namespace / "pods" / f"{metadata['name']}-{metadata['uid']}"

    def claim_dir(self, claim: str) -> Path:
        return self.state_dir / self.namespace / "claims" / claim

    def nfs_dir(self, server: str, path: str) -> Path:
        return self.state_dir / "nfs" / server / path.lstrip("/")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)


@pytest.fixture
def local_kubelet(namespace: str, tmp_path: Path) -> Iterator[Callable[[], LocalKubelet]]:
    """start() -> a local kubelet for the test's namespace; every one is stopped, and every process it
    started (shims, trainers, sidecars, stand-ins) is gone, when the test ends."""
    started: list[LocalKubelet] = []
    state_dir = tmp_path / "kubelet"

    def start() -> LocalKubelet:
        kubelet = LocalKubelet(namespace, state_dir, tmp_path / f"kubelet-{len(started)}.log")
        started.append(kubelet.start())
        return kubelet

    try:
        yield start
    finally:
        for kubelet in started:
            kubelet.stop()
        leftovers = {**trainers(namespace), **container_processes(state_dir)}
        for process in leftovers.values():
            os.kill(process.pid, signal.SIGKILL)
        assert not leftovers, f"processes left behind: {leftovers}"


@dataclass(frozen=True)
class Trainer:
    pid: int
    env: dict[str, str]


def _proc_environ(entry: Path) -> dict[str, str] | None:
    try:
        raw = (entry / "environ").read_bytes()
    except OSError:
        return None
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def trainers(namespace: str) -> dict[str, Trainer]:
    """The trainer processes of a namespace by pod name, found by their environment (/proc)."""
    found: dict[str, Trainer] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        env = _proc_environ(entry)
        if env is not None and env.get("TRAININGJOB_NAMESPACE") == namespace and "POD_NAME" in env:
            found[env["POD_NAME"]] = Trainer(int(entry.name), env)
    return found


def container_processes(state_dir: Path) -> dict[str, Trainer]:
    """Every process a local kubelet with this state directory started (its shims name a file there,
    its containers run in a directory there), by pid."""
    found: dict[str, Trainer] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        shim = "hack.local_kubelet.shim" in command and str(state_dir) in command
        if shim or cwd.startswith(str(state_dir)):
            found[entry.name] = Trainer(int(entry.name), _proc_environ(entry) or {})
    return found


def alive(pid: int) -> bool:
    return process_start_time(pid) is not None  # neither gone nor a zombie


def training_job(name: str, epochs: int, **spec: Any) -> JsonDict:
    env = {**FAST_EPOCHS, **spec.pop("env", {})}
    return job_manifest(
        name,
        hyperparameters={"epochs": epochs, "batchSize": 16, "learningRate": 0.05},
        # nfs: a checkpoint volume without a claim to bind (the local cluster has no provisioner); the
        # local kubelet stands a local directory in for the export.
        checkpoint={
            "enabled": True,
            "retention": 2,
            "storage": {"type": "nfs", "nfs": {"server": "nfs.invalid", "path": f"/exports/{name}"}},
        },
        env=[{"name": key, "value": value} for key, value in env.items()],
        **spec,
    )


def wait_for_trainers(namespace: str, count: int) -> dict[str, Trainer]:
    def probe() -> dict[str, Trainer] | None:
        found = trainers(namespace)
        return found if len(found) == count else None

    return wait_for(f"{count} trainer process(es)", probe, 90)
