"""Running the reference trainer for real, with the environment the operator gives its pods; no cluster.

What tests/trainer/test_real_training.py and tests/trainer/test_preemption.py share: a TrainingJob
whose pods' environment and files are taken exactly as the builders produce them, and train.py run
as local processes, one per pod:

- fieldRef values (POD_NAME, TRAININGJOB_NAMESPACE) are resolved here, as the kubelet would;
- MASTER_ADDR is overridden to 127.0.0.1 and MASTER_PORT to a free port: there is no cluster DNS for
  `<job>-master`. The rendezvous store is hosted by the test on a socket bound to 127.0.0.1, the way
  torchrun's agent hosts it (TORCHELASTIC_USE_AGENT_STORE=True), because rank 0's own store would
  listen on every interface and tests listen on 127.0.0.1 only. Rendezvous is still env://;
- checkpoint.mountPath is a temporary directory, so CHECKPOINT_DIR and RESUME_FROM come from the
  builders unchanged;
- TRAININGJOB_PROGRESS_API_URL points the progress helper at a plain-HTTP fake API on 127.0.0.1 instead
  of the in-cluster API; what rank 0 reports there is parsed with the operator's own parser, and the
  checkpoint it reports is what the restarted run gets as RESUME_FROM, as the controller would do.
"""

from __future__ import annotations

import copy
import datetime
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from trainingjob_progress import API_URL_ENV

from builders.configmap import build_trainer_sources
from builders.pods import build_pod
from controller.planner.progress import Report, parse_report
from crd import contract
from crd.defaults import with_defaults
from crd.spec import parse
from crd.validation import validate
from tests.unit import fakeapi
from tests.unit.fakeapi import FakeApi, Reply

NAMESPACE = "ml-training"
JOB = "real-train"
RUN_DEADLINE = 300.0  # seconds for one run of every process; importing torch alone can take 20


def pod_path(index: int) -> str:
    return f"/api/v1/namespaces/{NAMESPACE}/pods/{JOB}-worker-{index}"


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with fakeapi.running() as server:
        for index in range(4):
            server.default("PATCH", pod_path(index), Reply(200, {"kind": "Pod"}))
        yield server


def training_job(mount: Path, spec: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """A stored, defaulted TrainingJob whose checkpoint volume is mounted at `mount`."""
    manifest: dict[str, Any] = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": JOB, "namespace": NAMESPACE, "uid": "uid-real-train", "generation": 1},
        "spec": {
            "model": "mlp",
            "dataset": "synthetic",
            "framework": "pytorch",
            "numWorkers": 2,
            "gpusPerWorker": 0,
            "hyperparameters": {"epochs": 4, "batchSize": 16, "learningRate": 0.05, "optimizer": "sgd"},
            "checkpoint": {"enabled": True, "frequency": 1, "retention": 2, "mountPath": str(mount)},
            "networking": {"socketInterface": "lo"},
            "env": [{"name": name, "value": value} for name, value in env.items()],
            **spec,
        },
    }
    assert validate(manifest) == []
    return with_defaults(copy.deepcopy(manifest))


def resolved_env(pod: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet hands it over: fieldRefs resolved, no $(VAR) left."""
    fields = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"]}
    env: dict[str, str] = {}
    for entry in pod["spec"]["containers"][0]["env"]:
        if "value" in entry:
            assert "$(" not in entry["value"]
            env[entry["name"]] = entry["value"]
        else:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def project_config_map(config_map: dict[str, Any], volume: dict[str, Any], directory: Path) -> None:
    """Writes a ConfigMap into `directory` as the kubelet mounts it through `volume`: each of the
    volume's items (every key, when it lists none) at its path; a listed key the ConfigMap lacks fails
    the pod, and here the test."""
    source = volume["configMap"]
    assert source["name"] == config_map["metadata"]["name"]
    data: dict[str, str] = config_map["data"]
    items = source.get("items") or [{"key": key, "path": key} for key in data]
    for item in items:
        assert item["key"] in data, f"the pod's volume names the key {item['key']!r}, the ConfigMap lacks it"
        path = directory / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(data[item["key"]])


def install_config_map(job: dict[str, Any], directory: Path) -> Path:
    """Writes the namespace's trainer sources into `directory` as a worker pod's configMap volume mounts
    them; returns the trainer's path."""
    tj = parse(job)
    pod = build_pod(tj, 0, attempt=0, resume_from=None)
    (volume,) = (v for v in pod["spec"]["volumes"] if v["name"] == contract.CONFIG_VOLUME)
    directory.mkdir(parents=True, exist_ok=True)
    project_config_map(build_trainer_sources(tj), volume, directory)
    return directory / contract.TRAINER_FILE


@dataclass
class Run:
    codes: list[int]
    logs: list[str]
    envs: list[dict[str, str]]


@dataclass
class Pods:
    """Trainers started as local processes, one per pod, each in its own session."""

    processes: list[subprocess.Popen[bytes]]
    log_paths: list[Path]
    envs: list[dict[str, str]]

    def logs(self) -> list[str]:
        return [path.read_text() for path in self.log_paths]

    def wait(self, deadline: float = RUN_DEADLINE) -> Run:
        """Waits for every process (at most `deadline` seconds in all) and returns how they ended."""
        until = time.monotonic() + deadline
        codes = []
        try:
            for index, process in enumerate(self.processes):
                try:
                    codes.append(process.wait(timeout=max(until - time.monotonic(), 0.1)))
                except subprocess.TimeoutExpired:
                    logs = "\n".join(self.logs())
                    raise AssertionError(f"worker {index} still running after {deadline}s:\n{logs}") from None
        finally:
            self.kill()
        return Run(codes, self.logs(), self.envs)

    def kill(self) -> None:
        """SIGKILL to every process still running (and its session)."""
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def start_pods(
    job: dict[str, Any],
    tmp_path: Path,
    api: FakeApi,
    *,
    attempt: int,
    resume_from: str | None,
    rendezvous: dict[str, str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> Pods:
    """Starts every pod's trainer as a local process, with the pod's environment as the builders make it."""
    workers = int(job["spec"]["numWorkers"])
    run_dir = tmp_path / f"attempt-{attempt}"
    trainer = install_config_map(job, run_dir / "etc-trainingjob")
    pods = Pods([], [], [])
    try:
        for index in range(workers):
            pod = build_pod(parse(job), index, attempt=attempt, resume_from=resume_from)
            container = pod["spec"]["containers"][0]
            assert container["command"] == list(contract.DEFAULT_COMMAND)
            assert {"name": "config", "mountPath": contract.CONFIG_MOUNT_PATH, "readOnly": True} in container[
                "volumeMounts"
            ]
            env = resolved_env(pod)
            env.update(rendezvous or {})
            env.update(extra_env or {})
            env[API_URL_ENV] = api.url
            env.update({"PATH": os.environ.get("PATH", ""), "HOME": str(run_dir)})
            pods.envs.append(env)
            log_path = run_dir / f"worker-{index}.log"
            pods.log_paths.append(log_path)
            with open(log_path, "wb") as log_file:
                pods.processes.append(
                    subprocess.Popen(
                        [sys.executable, str(trainer)],
                        env=env,
                        cwd=run_dir,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
    except BaseException:
        pods.kill()
        raise
    return pods


def run_pods(
    job: dict[str, Any],
    tmp_path: Path,
    api: FakeApi,
    *,
    attempt: int,
    resume_from: str | None,
    rendezvous: dict[str, str] | None = None,
    extra_env: dict[str, str] | None = None,
) -> Run:
    """Runs every pod's trainer as a local process and waits for all of them."""
    pods = start_pods(
        job,
        tmp_path,
        api,
        attempt=attempt,
        resume_from=resume_from,
        rendezvous=rendezvous,
        extra_env=extra_env,
    )
    return pods.wait()


def reports(api: FakeApi, index: int) -> list[Report]:
    parsed = []
    for request in api.requests("PATCH", pod_path(index)):
        text = request.json()["metadata"]["annotations"][contract.PROGRESS_ANNOTATION]
        report, error = parse_report(text)
        assert error is None, text
        assert report is not None
        parsed.append(report)
    return parsed


def epochs_logged(log: str, rank: int) -> list[str]:
    return [
        line.split(": ", 1)[1].split(":")[0]
        for line in log.splitlines()
        if f"rank={rank} " in line and ": epoch " in line
    ]


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


# ---------------------------------------------------------------------------------------------------
# torch.distributed (gloo on the CPU)


@pytest.fixture
def agent_store() -> Iterator[Callable[[], dict[str, str]]]:
    """Starts rendezvous stores on 127.0.0.1 and returns the variables pointing the trainers at one."""
    torch_distributed = pytest.importorskip(
        "torch.distributed", reason="needs the train extra: pip install -e .[train]"
    )
    stores: list[Any] = []

    def start() -> dict[str, str]:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        store = torch_distributed.TCPStore(
            "127.0.0.1",
            port,
            None,
            True,
            datetime.timedelta(seconds=RUN_DEADLINE),
            wait_for_workers=False,
            master_listen_fd=listener.detach(),  # the store owns (and closes) the socket now
        )
        stores.append(store)
        return {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }

    yield start
    stores.clear()  # stops the stores' servers


def without_torch(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH shadowing torch with a package that is not found, as in an image without torch."""
    return shadowing_torch(tmp_path, 'ModuleNotFoundError("No module named \'torch\'", name="torch")')


def with_broken_torch(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH shadowing torch with one whose native library cannot be loaded, as under a memory
    limit too tight to map it."""
    return shadowing_torch(tmp_path, 'OSError("libtorch_cpu.so: failed to map segment from shared object")')


def shadowing_torch(tmp_path: Path, raised: str) -> dict[str, str]:
    shadow = tmp_path / "shadowed" / "torch"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text(f"raise {raised}\n")
    return {"PYTHONPATH": str(shadow.parent)}
