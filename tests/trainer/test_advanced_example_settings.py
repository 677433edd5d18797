"""The advanced example's hyperparameters reach the reference trainer and change how it trains, with real
torch; no cluster (tests/trainer/trainer_runs.py says how pods run here).

Why: examples/trainingjob-advanced.yaml sets an optimizer (adamw), a weight decay and a label smoothing
(additionalParams), learning-rate warmup, gradient accumulation and mixed precision, and the reference
trainer is what it runs. Each setting is read from the environment the builders give the example's
pods, and each is checked where it acts: the optimizer's class and parameter groups, the learning rate
step by step, the micro-batches per step, the dtype the model computes in, the loss. Then the example's
settings train two workers end to end (train.py as processes, gloo) and their checkpoint holds what
they trained with. tests/e2e/test_advanced_example_real_node.py runs the example through the operator.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from reference_trainer.config import Config, ConfigError
from reference_trainer.engines import SimulationEngine
from reference_trainer.torch_engine import TorchEngine

from builders.pods import build_pod
from crd import contract
from crd.defaults import with_defaults
from crd.spec import parse
from crd.validation import validate
from tests.trainer.trainer_runs import (
    JOB,
    NAMESPACE,
    agent_store,
    api,
    reports,
    resolved_env,
    run_pods,
)
from tests.unit.fakeapi import FakeApi

__all__ = ["agent_store", "api"]  # the fixtures

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trainingjob-advanced.yaml"
# What the example sets, as its file says (checked against the file below).
HYPERPARAMETERS = {
    "learningRate": 0.0001,
    "batchSize": 128,
    "epochs": 100,
    "optimizer": "adamw",
    "warmupSteps": 1000,
    "gradientAccumulationSteps": 4,
    "mixedPrecision": True,
    "additionalParams": {"weight_decay": "0.01", "label_smoothing": "0.1"},
}


def example_job(
    mount: Path, *, epochs: int | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """The advanced example as stored, made to run here: two CPU workers of one process each running
    train.py directly (the example's torchrun gets its world from PET_* the same way), its checkpoints
    in `mount`; every hyperparameter as the example sets it but `epochs`, when given."""
    manifest = next(
        doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc.get("kind") == contract.KIND
    )
    spec = manifest["spec"]
    assert spec["hyperparameters"] == HYPERPARAMETERS
    assert (spec["command"], spec["args"]) == (
        ["torchrun"],
        [f"{contract.CONFIG_MOUNT_PATH}/{contract.TRAINER_FILE}"],
    )
    for field in ("command", "args", "resources", "scheduling", "image"):
        spec.pop(field)
    spec.update({"numWorkers": 2, "gpusPerWorker": 0, "networking": {"socketInterface": "lo"}})
    spec["checkpoint"]["mountPath"] = str(mount)
    if epochs is not None:
        spec["hyperparameters"]["epochs"] = epochs
    spec["env"] = [*spec.get("env", []), *({"name": k, "value": v} for k, v in (env or {}).items())]
    manifest["metadata"] = {"name": JOB, "namespace": NAMESPACE, "uid": "uid-advanced", "generation": 1}
    assert validate(manifest) == []
    return with_defaults(copy.deepcopy(manifest))


def example_config(tmp_path: Path, rank: int = 0) -> Config:
    env = resolved_env(
        build_pod(parse(example_job(tmp_path / "checkpoints")), rank, attempt=0, resume_from=None)
    )
    return Config.from_env({**env, "WORLD_SIZE": "1", "RANK": "0"})


def test_the_trainer_reads_every_hyperparameter_the_example_sets(tmp_path: Path) -> None:
    config = example_config(tmp_path)
    assert (config.learning_rate, config.batch_size, config.epochs) == (0.0001, 128, 100)
    assert (config.optimizer, config.weight_decay, config.label_smoothing) == ("adamw", 0.01, 0.1)
    assert (config.warmup_steps, config.accumulation_steps, config.mixed_precision) == (1000, 4, True)
    assert config.settings() == (
        "optimizer adamw, learning rate 0.0001, weight decay 0.01, warmup 1000 steps, 4 micro-batch(es) "
        "of 128 per step, mixed precision on, label smoothing 0.1"
    )


def test_the_example_trains_with_adamw_warmup_accumulation_mixed_precision_and_smoothing(
    tmp_path: Path,
) -> None:
    torch = pytest.importorskip("torch")
    engine = TorchEngine(example_config(tmp_path))
    engine.resume(None)
    assert isinstance(engine.optimizer, torch.optim.AdamW)
    (group,) = engine.optimizer.param_groups
    assert (group["weight_decay"], group["decoupled_weight_decay"]) == (0.01, True)
    assert engine.loss.label_smoothing == 0.1

    batches: list[int] = []
    make_batch = engine._batch

    def counted(size: int, seed: int) -> tuple[Any, Any]:
        batches.append(size)
        return make_batch(size, seed)

    engine._batch = counted  # type: ignore[method-assign]
    dtypes: list[Any] = []
    engine.model.register_forward_hook(lambda _module, _inputs, output: dtypes.append(output.dtype))
    rates = []
    for step in range(3):
        engine.train_step(0, step)
        rates.append(engine.optimizer.param_groups[0]["lr"])
    # Warmup: a thousandth of the rate more per step; 4 micro-batches of 128 per step, in bfloat16.
    assert rates == pytest.approx([0.0001 * 1 / 1000, 0.0001 * 2 / 1000, 0.0001 * 3 / 1000])
    assert batches == [128] * 12
    assert set(dtypes) == {torch.bfloat16}
    assert engine.config.learning_rate_at(999) == engine.config.learning_rate_at(5000) == 0.0001
    # Evaluation is in full precision.
    dtypes.clear()
    engine.evaluate()
    assert set(dtypes) == {torch.float32}


@pytest.mark.slow
def test_two_workers_train_with_the_examples_settings(
    tmp_path: Path, api: FakeApi, agent_store: Callable[[], dict[str, str]]
) -> None:
    torch = pytest.importorskip("torch")
    mount = tmp_path / "checkpoints"
    knobs = {"TRAIN_STEPS_PER_EPOCH": "10", "TRAIN_PROGRESS_INTERVAL": "0", "TRAIN_DIST_TIMEOUT": "240"}
    job = example_job(mount, epochs=5, env=knobs)

    run = run_pods(job, tmp_path, api, attempt=0, resume_from=None, rendezvous=agent_store())

    assert run.codes == [0, 0], run.logs
    for log in run.logs:
        assert (
            "training with optimizer adamw, learning rate 0.0001, weight decay 0.01, warmup 1000 steps, "
            "4 micro-batch(es) of 128 per step, mixed precision on, label smoothing 0.1 (torch)"
        ) in log
    # Checkpoints every 5 epochs (the example's frequency) and after the last one.
    final = reports(api, 0)[-1]
    assert (final.epoch, final.step, final.checkpoint) == (5, 50, str(mount / "epoch-5"))
    state = torch.load(mount / "epoch-5" / "model.pt", weights_only=True)
    (group,) = state["optimizer"]["param_groups"]
    # 50 steps into a 1000-step warmup; AdamW's decoupled weight decay.
    assert group["lr"] == pytest.approx(0.0001 * 50 / 1000)
    assert (group["weight_decay"], group["decoupled_weight_decay"]) == (0.01, True)
    assert "scaler" not in state  # bfloat16 on the CPU needs no loss scaling


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("MIXED_PRECISION", "sometimes", "MIXED_PRECISION='sometimes' is not true or false"),
        ("HP_LABEL_SMOOTHING", "1", "HP_LABEL_SMOOTHING=1 must be below 1"),
        ("GRADIENT_ACCUMULATION_STEPS", "0", "GRADIENT_ACCUMULATION_STEPS=0 must be at least 1"),
        ("WARMUP_STEPS", "-1", "WARMUP_STEPS=-1 must be at least 0"),
    ],
)
def test_a_setting_the_trainer_cannot_use_is_a_configuration_error(name: str, value: str, error: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Config.from_env({name: value})
    assert str(raised.value) == error


def test_the_simulation_takes_the_same_schedule_micro_batches_and_smoothing(tmp_path: Path) -> None:
    """Where torch is not importable the simulation trains instead: the same warmup, micro-batches and
    label smoothing (a smoothed target keeps its weights smaller than hard labels do)."""
    config = example_config(tmp_path)
    smooth, hard = SimulationEngine(config), SimulationEngine(replace(config, label_smoothing=0.0))
    batches: list[int] = []
    make_batch = smooth._batch

    def counted(size: int, seed: int) -> list[tuple[list[float], int]]:
        batches.append(size)
        return make_batch(size, seed)

    smooth._batch = counted  # type: ignore[method-assign]
    fast = replace(config, warmup_steps=0, learning_rate=1.0, label_smoothing=0.0)
    for engine in (smooth, hard):
        engine.config = replace(engine.config, warmup_steps=0, learning_rate=1.0)
        for step in range(20):
            engine.train_step(0, step)
    assert batches == [128] * 80
    assert sum(abs(w) for w in smooth.weights) < sum(abs(w) for w in hard.weights)
    warming = SimulationEngine(replace(fast, warmup_steps=1000))
    warming.train_step(0, 0)
    full = SimulationEngine(fast)
    full.train_step(0, 0)
    # The first step of a 1000-step warmup moves the weights a thousandth as far.
    assert sum(abs(w) for w in warming.weights) == pytest.approx(sum(abs(w) for w in full.weights) / 1000)
