"""Running an example's training program as a job's pods would, with a real framework and no cluster.

What tests/frameworks/test_jax.py needs. (TensorFlow is trained in containers only, on the real node,
tests/e2e/test_frameworks_real_node.py: its gRPC servers bind every interface of the machine, a
wildcard address no setting changes, so it never runs as a local process here.) The program is the one
an example ships in its ConfigMap (examples/trainingjob-tensorflow.yaml, examples/trainingjob-jax.yaml),
read from the example itself, and each pod's environment is what the builders give the pod of that
slot (builders/env.py), fieldRefs resolved as the kubelet would. What a cluster would provide is
stood in for on 127.0.0.1:

- the pods' stable DNS names (TF_CONFIG's cluster, JAX_COORDINATOR_ADDRESS) are rewritten to
  127.0.0.1 and a free port each, only here: there is no cluster DNS;
- checkpoint.mountPath is a temporary directory (every "pod" shares it, as a ReadWriteMany claim);
- /etc/trainingjob (the progress helper) is a directory with the trainer ConfigMap's files, on the
  PYTHONPATH as the example's spec.env puts it;
- TRAININGJOB_PROGRESS_API_URL points the helper at a plain-HTTP fake API on 127.0.0.1, so what rank 0
  reports is read back with the operator's own parser.
"""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainingjob_progress import API_URL_ENV

from builders.env import distributed_env
from builders.names import pod_name
from controller.planner.progress import Report, parse_report
from crd import contract
from crd.defaults import with_defaults
from crd.spec import TrainingJob, parse
from tests.cluster import REPO
from tests.trainer.trainer_runs import install_config_map
from tests.unit import fakeapi
from tests.unit.fakeapi import FakeApi, Reply

NAMESPACE = "ml-frameworks"
EXAMPLES = REPO / "examples"


def example(name: str) -> list[dict[str, Any]]:
    """The objects of examples/<name>."""
    return [doc for doc in yaml.safe_load_all((EXAMPLES / name).read_text()) if doc]


def program(name: str, key: str) -> str:
    """The training program `key` of the ConfigMap in examples/<name>."""
    maps = [doc for doc in example(name) if doc["kind"] == "ConfigMap"]
    (config_map,) = maps
    text: str = config_map["data"][key]
    return text


def example_job(name: str, mount: Path, **spec: Any) -> TrainingJob:
    """The TrainingJob of examples/<name>, stored (namespace, uid) and defaulted, its checkpoint volume
    mounted at `mount`, with `spec` fields replaced."""
    (manifest,) = (doc for doc in example(name) if doc["kind"] == contract.KIND)
    stored = copy.deepcopy(manifest)
    stored["metadata"].update({"namespace": NAMESPACE, "uid": f"uid-{name}", "generation": 1})
    stored["spec"].update(spec)
    stored["spec"].setdefault("checkpoint", {})["mountPath"] = str(mount)
    return parse(with_defaults(stored))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pod_env(job: TrainingJob, slot: int, attempt: int = 0) -> dict[str, str]:
    """The trainer container's environment in the pod of `slot`, as the kubelet hands it over."""
    fields = {"metadata.name": pod_name(job, slot), "metadata.namespace": NAMESPACE}
    env: dict[str, str] = {}
    for entry in distributed_env(job, slot, attempt=attempt):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def pod_path(job: TrainingJob, slot: int) -> str:
    return f"/api/v1/namespaces/{NAMESPACE}/pods/{pod_name(job, slot)}"


def reports(api: FakeApi, job: TrainingJob, slot: int = 0) -> list[Report]:
    """What the pod of `slot` reported, parsed as the operator parses it."""
    parsed = []
    for request in api.requests("PATCH", pod_path(job, slot)):
        report, error = parse_report(request.json()["metadata"]["annotations"][contract.PROGRESS_ANNOTATION])
        assert error is None
        assert report is not None
        parsed.append(report)
    return parsed


@pytest.fixture
def api() -> Iterator[FakeApi]:
    """The fake API the progress helper patches (any pod of the namespace)."""
    with fakeapi.running() as server:
        yield server


def allow_reports(api: FakeApi, job: TrainingJob) -> None:
    for slot in range(job.spec.replicas.size):
        api.default("PATCH", pod_path(job, slot), Reply(200, {"kind": "Pod"}))


@dataclass
class Processes:
    """The pods' programs as local processes, one per slot, each with its log."""

    directory: Path
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    envs: dict[int, dict[str, str]] = field(default_factory=dict)

    def start(self, slot: int, command: list[str], env: Mapping[str, str]) -> None:
        self.envs[slot] = dict(env)
        with open(self.log_path(slot), "wb") as log:
            self.processes[slot] = subprocess.Popen(
                command,
                env=dict(env),
                cwd=self.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_path(self, slot: int) -> Path:
        return self.directory / f"slot-{slot}.log"

    def log(self, slot: int) -> str:
        return self.log_path(slot).read_text()

    def logs(self) -> str:
        return "\n".join(f"--- slot {slot}:\n{self.log(slot)}" for slot in sorted(self.processes))

    def wait(self, slots: list[int], timeout: float) -> dict[int, int]:
        """The exit codes of `slots`, waiting at most `timeout` seconds in all."""
        deadline = time.monotonic() + timeout
        codes = {}
        for slot in slots:
            try:
                codes[slot] = self.processes[slot].wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"slot {slot} still running after {timeout}s:\n{self.logs()}") from None
        return codes

    def running(self, slot: int) -> bool:
        return self.processes[slot].poll() is None

    def stop(self) -> None:
        """Ends every process still running, as the operator's deletion of the job's pods would."""
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Callable[[], Processes]]:
    """processes() -> a Processes in its own directory; every process is killed at the end."""
    made: list[Processes] = []

    def make() -> Processes:
        directory = tmp_path / f"run-{len(made)}"
        directory.mkdir()
        made.append(Processes(directory))
        return made[-1]

    yield make
    for each in made:
        each.stop()


def helper_env(job: TrainingJob, directory: Path, api: FakeApi) -> dict[str, str]:
    """What every pod also has: the trainer ConfigMap's files (the progress helper) on PYTHONPATH, as
    the example's spec.env sets it, a fake API for the reports, and a PATH and HOME."""
    manifest = dict(job.manifest)
    mounted = install_config_map(manifest, directory / "etc-trainingjob").parent
    return {
        "PYTHONPATH": str(mounted),
        API_URL_ENV: api.url,
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(directory),
    }


def python() -> list[str]:
    return [sys.executable]
