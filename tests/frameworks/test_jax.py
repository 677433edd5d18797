"""The JAX_* variables the builders give each pod make real JAX processes form one group
(docs/env.md, JAX), with the program examples/trainingjob-jax.yaml ships, one local process per pod
(how: tests/frameworks/framework_runs.py):

- three processes call jax.distributed.initialize() as docs/env.md tells users to, with the number of
  processes and the process id from JAX_NUM_PROCESSES and JAX_PROCESS_ID (JAX reads
  JAX_COORDINATOR_ADDRESS by itself); a psum over every process gives 1 + 2 + 3, and the data-parallel
  training ends with the same weights in every process;
- without those arguments jax.distributed.initialize() does not find the processes: the reason the
  docs say to pass them.

JAX_COORDINATOR_ADDRESS is rewritten to 127.0.0.1 and a free port, and the coordinator and the gloo
collectives are bound to 127.0.0.1 (tests/frameworks/jax_loopback.py), only here.

Needs the `jax` extra (jax with its CPU jaxlib; `make test` installs it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

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

pytest.importorskip("jax", reason="needs the jax extra: pip install -e .[jax]")
pytestmark = pytest.mark.slow

EXAMPLE = "trainingjob-jax.yaml"
LOOPBACK = Path(__file__).with_name("jax_loopback.py")
DEADLINE = 180.0


def loopback_env(env: dict[str, str]) -> dict[str, str]:
    """The coordinator at 127.0.0.1 and a free port, instead of <job>-master:<masterPort>."""
    port = free_port()
    return {
        **env,
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{port}",
        "JAX_PLATFORMS": "cpu",
    }


def test_three_jax_processes_form_one_group_and_train_data_parallel(
    tmp_path: Path, api: FakeApi, processes: Callable[[], Processes]
) -> None:
    job = example_job(EXAMPLE, tmp_path / "checkpoints", hyperparameters={"epochs": 2})
    allow_reports(api, job)
    script = tmp_path / "train_jax.py"
    script.write_text(program(EXAMPLE, "train_jax.py"))
    run = processes()
    common = helper_env(job, run.directory, api)
    built = [pod_env(job, slot) for slot in range(3)]
    assert [env["JAX_PROCESS_ID"] for env in built] == ["0", "1", "2"]
    assert {env["JAX_NUM_PROCESSES"] for env in built} == {"3"}
    assert {env["JAX_COORDINATOR_ADDRESS"] for env in built} == {"jax-psum-master:29500"}
    coordinator = loopback_env({})
    for slot, env in enumerate(built):
        run.start(slot, [*python(), str(LOOPBACK), str(script)], {**env, **common, **coordinator})

    assert run.wait([0, 1, 2], DEADLINE) == {0: 0, 1: 0, 2: 0}, run.logs()
    weights = set()
    for slot in range(3):
        log = run.log(slot)
        assert f"process {slot} of 3: psum over every process = 6 (expected 6)" in log, log
        assert f"process {slot}: epoch 2/2" in log
        found = re.search(r"done: weights (\[.*\])", log)
        assert found is not None, log
        weights.add(found.group(1))
    assert len(weights) == 1, f"the processes' weights differ: {weights}"
    last = reports(api, job)[-1]
    assert (last.epoch, last.total_epochs, last.step) == (2, 2, 40)
    assert last.metrics["max_weight_error"] < 0.05
    assert reports(api, job, 1) == []


def test_initialize_without_arguments_does_not_find_the_processes(
    tmp_path: Path, processes: Callable[[], Processes]
) -> None:
    job = example_job(EXAMPLE, tmp_path / "checkpoints")
    script = tmp_path / "bare.py"
    script.write_text("import jax\njax.distributed.initialize()\n")
    run = processes()
    env = loopback_env(pod_env(job, 0))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    run.start(0, [*python(), str(script)], env)
    assert run.wait([0], DEADLINE) == {0: 1}
    assert "ValueError: Number of processes must be defined." in run.log(0)
