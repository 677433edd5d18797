"""TF_CONFIG as the builders give each role's pod makes real TensorFlow train (docs/env.md, TensorFlow),
with the program examples/trainingjob-tensorflow.yaml ships, one local process per pod (how:
tests/frameworks/framework_runs.py):

- MultiWorkerMirroredStrategy across three workers, their gradients all-reduced (every worker ends
  with the same model, though each trains on data of its own);
- ParameterServerStrategy with the example's roles: a chief, two workers and a parameter server
  (and its evaluator, evaluating the checkpoints the chief writes). The chief trains to the end and
  exits 0; the workers and the parameter server serve until they are stopped, as the job's end stops
  them.

Only the addresses of TF_CONFIG are rewritten (to 127.0.0.1 and free ports); all traffic stays on
127.0.0.1. TensorFlow's gRPC servers bind every interface of the machine at their port (a wildcard
address hard-coded in TensorFlow's grpc_server_lib; no setting restricts it), the one departure from
"everything listens on 127.0.0.1" in these tests.

Needs the `tensorflow` extra (tensorflow-cpu; `make test` installs it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from crd.spec import TrainingJob
from tests.frameworks.framework_runs import (
    Processes,
    allow_reports,
    api,
    example_job,
    free_port,
    helper_env,
    pod_env,
    processes,
    program,
    python,
    reports,
)
from tests.unit.fakeapi import FakeApi

__all__ = ["api", "processes"]  # the fixtures

pytest.importorskip("tensorflow", reason="needs the tensorflow extra: pip install -e .[tensorflow]")
pytestmark = pytest.mark.slow

EXAMPLE = "trainingjob-tensorflow.yaml"
EPOCHS = 2
# Importing TensorFlow in four or five processes at once on two cores takes most of this.
DEADLINE = 240.0


def on_loopback(config: dict[str, Any]) -> dict[str, Any]:
    """TF_CONFIG with every address of its cluster moved to 127.0.0.1 and a free port of its own."""
    cluster = {
        role: [f"127.0.0.1:{free_port()}" for _ in addresses] for role, addresses in config["cluster"].items()
    }
    return {**config, "cluster": cluster}


def start_job(job: TrainingJob, run: Processes, api: FakeApi, script: Path) -> dict[int, dict[str, Any]]:
    """Starts every pod of the job; returns each slot's TF_CONFIG as the builders made it."""
    allow_reports(api, job)
    common = helper_env(job, run.directory, api)
    built = {slot: json.loads(pod_env(job, slot)["TF_CONFIG"]) for slot in range(job.spec.replicas.size)}
    cluster = on_loopback(built[0])["cluster"]
    for slot, config in built.items():
        env = {**pod_env(job, slot), **common, "TF_CONFIG": json.dumps({**config, "cluster": cluster})}
        run.start(slot, [*python(), str(script)], env)
    return built


def write_program(tmp_path: Path) -> Path:
    script = tmp_path / "train_tf.py"
    script.write_text(program(EXAMPLE, "train_tf.py"))
    return script


def test_multi_worker_mirrored_strategy_trains_across_three_workers(
    tmp_path: Path, api: FakeApi, processes: Callable[[], Processes]
) -> None:
    mount = tmp_path / "checkpoints"
    job = example_job(
        EXAMPLE,
        mount,
        numWorkers=3,
        tensorflow={},
        hyperparameters={"epochs": EPOCHS, "batchSize": 32},
    )
    run = processes()
    built = start_job(job, run, api, write_program(tmp_path))
    assert [config["task"] for config in built.values()] == [{"type": "worker", "index": i} for i in range(3)]
    assert set(built[0]["cluster"]) == {"worker"}

    assert run.wait([0, 1, 2], DEADLINE) == {0: 0, 1: 0, 2: 0}, run.logs()
    finals = set()
    for slot in range(3):
        log = run.log(slot)
        assert f"worker {slot}: epoch {EPOCHS}/{EPOCHS}" in log, log
        assert "(3 replicas)" in log
        found = re.search(r"done: held-out loss (\d+\.\d+)", log)
        assert found is not None, log
        finals.add(found.group(1))
    assert len(finals) == 1, f"the workers' models differ: {finals}"
    # Worker 0 is rank 0 without a chief: it reports and checkpoints.
    last = reports(api, job)[-1]
    assert (last.epoch, last.total_epochs, last.step) == (EPOCHS, EPOCHS, EPOCHS * 10)
    assert last.checkpoint == str(mount / f"epoch-{EPOCHS}")
    assert (mount / f"epoch-{EPOCHS}" / "weights.npz").is_file()
    assert reports(api, job, 1) == []


def test_parameter_server_strategy_trains_with_a_chief_two_workers_and_a_parameter_server(
    tmp_path: Path, api: FakeApi, processes: Callable[[], Processes]
) -> None:
    mount = tmp_path / "checkpoints"
    job = example_job(EXAMPLE, mount, hyperparameters={"epochs": EPOCHS, "batchSize": 32})
    chief, workers, ps, evaluator = 0, [1, 2], 3, 4
    run = processes()
    built = start_job(job, run, api, write_program(tmp_path))
    assert built[chief]["task"] == {"type": "chief", "index": 0}
    assert built[ps]["task"] == {"type": "ps", "index": 0}
    assert built[evaluator]["task"] == {"type": "evaluator", "index": 0}
    assert set(built[chief]["cluster"]) == {"chief", "worker", "ps"}

    # The chief trains to the end; so does the evaluator, through the chief's checkpoints.
    assert run.wait([chief, evaluator], DEADLINE) == {chief: 0, evaluator: 0}, run.logs()
    log = run.log(chief)
    assert f"chief 0: epoch {EPOCHS}/{EPOCHS}" in log, log
    assert "done: held-out loss" in log
    assert f"evaluator: epoch {EPOCHS}: held-out loss" in run.log(evaluator)
    # The workers and the parameter server never exit by themselves: the job's end stops them.
    assert all(run.running(slot) for slot in [*workers, ps]), run.logs()
    assert all("serving" in run.log(slot) for slot in [*workers, ps])
    last = reports(api, job)[-1]
    assert (last.epoch, last.checkpoint) == (EPOCHS, str(mount / f"epoch-{EPOCHS}"))
    assert last.metrics["loss"] < reports(api, job)[0].metrics["loss"]
    assert all(reports(api, job, slot) == [] for slot in range(1, 5))
