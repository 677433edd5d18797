"""The reference trainer, run for real with the environment the operator gives its pods; no cluster.

Why: the operator's promises about training (ranks that find each other, checkpoints every
CHECKPOINT_FREQUENCY epochs, RESUME_FROM after a restart, progress in the pod annotation) are only
true if the trainer it ships in every namespace's trainer ConfigMap keeps its side of the contract. These
tests build a TrainingJob, take the pods' environment and files exactly as the builders produce them,
and run train.py as local processes, one per pod:

- fieldRef values (POD_NAME, TRAININGJOB_NAMESPACE) are resolved here, as the kubelet would;
- MASTER_ADDR is overridden to 127.0.0.1 and MASTER_PORT to a free port: there is no cluster DNS for
  `<job>-master`. The rendezvous store is hosted by this test on a socket bound to 127.0.0.1, the way
  torchrun's agent hosts it (TORCHELASTIC_USE_AGENT_STORE=True), because rank 0's own store would
  listen on every interface and tests listen on 127.0.0.1 only. Rendezvous is still env://;
- checkpoint.mountPath is a temporary directory, so CHECKPOINT_DIR and RESUME_FROM come from the
  builders unchanged;
- TRAININGJOB_PROGRESS_API_URL points the progress helper at a plain-HTTP fake API on 127.0.0.1 instead
  of the in-cluster API; what rank 0 reports there is parsed with the operator's own parser, and the
  checkpoint it reports is what the restarted run gets as RESUME_FROM, as the controller would do.

The torch test needs the `train` extra (`make test` installs it). The others run without torch: the
trainer's pure-Python simulation takes the same paths through checkpoints, resume and reporting.
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

from builders.configmap import build_trainer_sources, config_json
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


def install_config_map(job: dict[str, Any], directory: Path) -> Path:
    """Writes config.json (the pod's annotation) and the files of the namespace's trainer sources as
    the pod's projected volume shows them; returns the trainer's path."""
    directory.mkdir(parents=True, exist_ok=True)
    typed = parse(job)
    files = {**build_trainer_sources(typed)["data"], contract.CONFIG_FILE: config_json(typed)}
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory / contract.TRAINER_FILE


@dataclass
class Run:
    codes: list[int]
    logs: list[str]
    envs: list[dict[str, str]]


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
    """Runs every pod's trainer as a local process (its own session, killed if still running at the end)
    and waits for all of them."""
    workers = int(job["spec"]["numWorkers"])
    run_dir = tmp_path / f"attempt-{attempt}"
    trainer = install_config_map(job, run_dir / "etc-trainingjob")
    processes: list[subprocess.Popen[bytes]] = []
    log_paths: list[Path] = []
    envs: list[dict[str, str]] = []
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
            envs.append(env)
            log_path = run_dir / f"worker-{index}.log"
            log_paths.append(log_path)
            with open(log_path, "wb") as log_file:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, str(trainer)],
                        env=env,
                        cwd=run_dir,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + RUN_DEADLINE
        codes = []
        for index, process in enumerate(processes):
            try:
                codes.append(process.wait(timeout=max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                logs = "\n".join(p.read_text() for p in log_paths)
                raise AssertionError(f"worker {index} still running after {RUN_DEADLINE}s:\n{logs}") from None
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return Run(codes, [p.read_text() for p in log_paths], envs)


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


@pytest.mark.slow
def test_two_workers_train_fail_and_resume_from_the_reported_checkpoint(
    tmp_path: Path, api: FakeApi, agent_store: Callable[[], dict[str, str]]
) -> None:
    torch = pytest.importorskip("torch")
    mount = tmp_path / "checkpoints"
    job = training_job(
        mount,
        {},
        {
            "TRAIN_STEPS_PER_EPOCH": "3",
            "TRAIN_FAIL_AT_EPOCH": "2",
            "TRAIN_PROGRESS_INTERVAL": "0",
            "TRAIN_DIST_TIMEOUT": "240",
        },
    )

    first = run_pods(job, tmp_path, api, attempt=0, resume_from=None, rendezvous=agent_store())
    assert first.envs[0]["WORLD_SIZE"] == first.envs[1]["WORLD_SIZE"] == "2"
    assert [e["RANK"] for e in first.envs] == ["0", "1"]
    assert [e["TORCH_DISTRIBUTED_BACKEND"] for e in first.envs] == ["gloo", "gloo"]
    assert first.envs[0]["CHECKPOINT_DIR"] == str(mount)
    assert "RESUME_FROM" not in first.envs[0]
    assert first.codes == [1, 1], first.logs
    for rank, log in enumerate(first.logs):
        assert "joining the rendezvous at 127.0.0.1" in log
        assert epochs_logged(log, rank) == ["epoch 1/4", "epoch 2/4"], log
        assert "failing on purpose after epoch 2" in log
    assert listing(mount) == ["epoch-1", "epoch-2"]  # rank 0 writes, every epoch
    assert reports(api, 1) == []  # only rank 0 reports
    reported = reports(api, 0)[-1]
    assert (reported.epoch, reported.total_epochs, reported.step, reported.total_steps) == (2, 4, 6, 12)
    assert reported.checkpoint == str(mount / "epoch-2")
    assert set(reported.metrics) == {"loss", "accuracy"}

    # The gang restarts; the controller passes the latest reported checkpoint as RESUME_FROM.
    second = run_pods(
        job, tmp_path, api, attempt=1, resume_from=reported.checkpoint, rendezvous=agent_store()
    )
    assert [e["RESUME_FROM"] for e in second.envs] == [str(mount / "epoch-2")] * 2
    assert [e["TRAININGJOB_ATTEMPT"] for e in second.envs] == ["1", "1"]
    assert second.codes == [0, 0], second.logs
    for rank, log in enumerate(second.logs):
        assert f"resuming from epoch 2 (checkpoint {mount / 'epoch-2'})" in log
        assert epochs_logged(log, rank) == ["epoch 3/4", "epoch 4/4"], log  # the remaining epochs only
        assert "training finished: 4 epochs, 12 steps" in log
    assert listing(mount) == ["epoch-3", "epoch-4"]  # retention 2
    final = reports(api, 0)[-1]
    assert (final.epoch, final.total_epochs, final.step, final.total_steps) == (4, 4, 12, 12)
    assert final.checkpoint == str(mount / "epoch-4")
    assert 0.5 < final.metrics["accuracy"] <= 1.0
    state = torch.load(mount / "epoch-4" / "model.pt", weights_only=True)
    assert (state["epoch"], state["step"]) == (4, 12)
    assert reports(api, 1) == []


# ---------------------------------------------------------------------------------------------------
# Without torch: the simulation, the launcher for several processes per pod, configuration errors


def without_torch(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH shadowing torch with a package that fails to import, as in an image without torch."""
    shadow = tmp_path / "no-torch" / "torch"
    shadow.mkdir(parents=True, exist_ok=True)
    (shadow / "__init__.py").write_text('raise ImportError("torch is not installed in this image")\n')
    return {"PYTHONPATH": str(shadow.parent)}


def test_without_torch_one_pod_runs_a_process_per_local_rank_and_resumes(
    tmp_path: Path, api: FakeApi
) -> None:
    mount = tmp_path / "checkpoints"
    # One pod with two "GPUs": LOCAL_WORLD_SIZE=2, so train.py starts ranks 0 and 1 itself.
    job = training_job(
        mount,
        {"numWorkers": 1, "gpusPerWorker": 2, "hyperparameters": {"epochs": 3}},
        {"TRAIN_STEPS_PER_EPOCH": "2", "TRAIN_FAIL_AT_EPOCH": "2", "TRAIN_PROGRESS_INTERVAL": "0"},
    )
    job["spec"]["checkpoint"]["retention"] = 1
    first = run_pods(job, tmp_path, api, attempt=0, resume_from=None, extra_env=without_torch(tmp_path))
    assert (first.envs[0]["LOCAL_WORLD_SIZE"], first.envs[0]["WORLD_SIZE"]) == ("2", "2")
    [log] = first.logs
    assert first.codes == [1], log
    assert "starting one process per local rank (ranks 0-1 of 2)" in log
    assert "torch is not importable" in log
    assert "running the pure-Python simulation" in log
    # Both ranks fail after epoch 2; the launcher gives the second one time to end by itself.
    assert epochs_logged(log, 0) == epochs_logged(log, 1) == ["epoch 1/3", "epoch 2/3"]
    assert listing(mount) == ["epoch-2"]
    assert reports(api, 0)[-1].checkpoint == str(mount / "epoch-2")

    # A resumeFrom naming the checkpoint directory itself resumes from the newest checkpoint in it.
    second = run_pods(
        job, tmp_path, api, attempt=1, resume_from=str(mount), extra_env=without_torch(tmp_path)
    )
    [log] = second.logs
    assert second.codes == [0], log
    assert f"resuming from epoch 2 (checkpoint {mount / 'epoch-2'})" in log
    assert epochs_logged(log, 0) == epochs_logged(log, 1) == ["epoch 3/3"]
    assert listing(mount) == ["epoch-3"]
    final = reports(api, 0)[-1]
    assert (final.epoch, final.step, final.checkpoint) == (3, 6, str(mount / "epoch-3"))


def test_a_bad_setting_exits_2_with_a_clear_message(tmp_path: Path, api: FakeApi) -> None:
    job = training_job(tmp_path / "checkpoints", {"numWorkers": 1}, {"TRAIN_STEPS_PER_EPOCH": "many"})
    run = run_pods(job, tmp_path, api, attempt=0, resume_from=None)
    assert run.codes == [2]
    assert "configuration error: TRAIN_STEPS_PER_EPOCH='many' is not an integer" in run.logs[0]


def test_a_missing_resume_point_exits_2(tmp_path: Path, api: FakeApi) -> None:
    job = training_job(tmp_path / "checkpoints", {"numWorkers": 1}, {"TRAIN_SIMULATE": "1"})
    missing = str(tmp_path / "checkpoints" / "epoch-7")
    run = run_pods(job, tmp_path, api, attempt=1, resume_from=missing)
    assert run.codes == [2]
    assert f"configuration error: RESUME_FROM={missing} does not exist" in run.logs[0]
