"""The reference trainer's configuration: the operator's variables (and the trainer's own TRAIN_*
knobs) read once into a `Config`, and the errors that end a run with a given exit status.

A module of its own so that every part of the trainer (engines, checkpoints, the loop, the local-rank
launcher) reads the same typed view. A value that cannot work is a ConfigError (exit 2): retrying
will not help.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import trainingjob_progress as progress

OPTIMIZERS: Final = ("sgd", "adam", "adamw", "rmsprop")
EXIT_FAILED: Final = 1
EXIT_CONFIG: Final = 2
EXIT_TERMINATED: Final = 143


class ConfigError(Exception):
    """The job's configuration cannot work (exit 2): retrying will not help."""


class Terminated(Exception):
    """SIGTERM: the operator is stopping or restarting the gang."""


class FailedOnPurpose(Exception):
    """TRAIN_FAIL_FILE appeared: the rank fails mid-epoch (exit 1), when a test or bench says so."""


# ---------------------------------------------------------------------------------------------------
# Configuration


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


def _required_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    value = _int(env, name, default, minimum)
    return default if value is None else value


def _flag(env: Mapping[str, str], name: str) -> bool:
    text = env.get(name, "").strip().lower()
    if text in {"", "0", "false", "no"}:
        return False
    if text in {"1", "true", "yes"}:
        return True
    raise ConfigError(f"{name}={text!r} is not true or false")


def _float(env: Mapping[str, str], name: str, default: float, *, positive: bool = False) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ConfigError(f"{name}={text} must be a {'positive' if positive else 'non-negative'} number")
    return value


@dataclass(frozen=True)
class Config:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launched: bool  # by torchrun or by this file's own launcher: LOCAL_RANK is set
    epochs: int
    steps_per_epoch: int
    batch_size: int
    learning_rate: float
    optimizer: str
    weight_decay: float
    # hyperparameters.warmupSteps: the learning rate rises linearly to LEARNING_RATE over the first
    # optimizer steps.
    warmup_steps: int
    # hyperparameters.gradientAccumulationSteps: micro-batches of BATCH_SIZE whose gradients make one
    # optimizer step (a step of TRAIN_STEPS_PER_EPOCH).
    accumulation_steps: int
    # hyperparameters.mixedPrecision: forward passes under autocast (bfloat16 on the CPU, float16 with a
    # gradient scaler on a GPU).
    mixed_precision: bool
    # additionalParams.label_smoothing (HP_LABEL_SMOOTHING): the loss's label smoothing, in [0, 1).
    label_smoothing: float
    seed: int
    backend: str
    dist_timeout: float
    checkpoint_dir: str | None
    frequency: int
    retention: int | None
    resume_from: str | None
    # Set by the local-rank launcher when RESUME_FROM is its private copy: the path to report instead.
    resume_origin: str | None
    fail_at_epoch: int | None
    # TRAIN_FAIL_FILE: a path; when it appears (`kubectl exec ... touch`), the rank removes it and fails
    # after the step it is in, so a bench can fail one rank mid-epoch as often and when it wants.
    fail_file: str | None
    step_seconds: float
    save_seconds: float
    progress_interval: float
    simulate: bool
    elastic: bool  # an elastic job: resume from the newest checkpoint under CHECKPOINT_DIR

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def learning_rate_at(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0-based, counted over the whole run): linear
        warmup over the first `warmup_steps`, then LEARNING_RATE. A function of the step alone, so a run
        resumed from a checkpoint continues the schedule where it was."""
        if step >= self.warmup_steps:
            return self.learning_rate
        return self.learning_rate * (step + 1) / self.warmup_steps

    def settings(self) -> str:
        """The training settings, as one log line says them."""
        parts = [
            f"optimizer {self.optimizer}",
            f"learning rate {self.learning_rate:g}",
            f"weight decay {self.weight_decay:g}",
            f"warmup {self.warmup_steps} steps",
            f"{self.accumulation_steps} micro-batch(es) of {self.batch_size} per step",
            f"mixed precision {'on' if self.mixed_precision else 'off'}",
            f"label smoothing {self.label_smoothing:g}",
        ]
        return ", ".join(parts)

    def hyperparameters(self, env: Mapping[str, str]) -> dict[str, Any]:
        """The hyperparameters and the shape of the job, as a tracker records them with its run (the
        model's and dataset's names from `env` when the job has them)."""
        values: dict[str, Any] = {
            "epochs": self.epochs,
            "steps_per_epoch": self.steps_per_epoch,
            "batch_size": self.batch_size,
            "learning_rate": self.learning_rate,
            "optimizer": self.optimizer,
            "weight_decay": self.weight_decay,
            "warmup_steps": self.warmup_steps,
            "gradient_accumulation_steps": self.accumulation_steps,
            "mixed_precision": self.mixed_precision,
            "label_smoothing": self.label_smoothing,
            "seed": self.seed,
            "world_size": self.world_size,
            "model": env.get("MODEL_NAME", ""),
            "dataset": env.get("DATASET_NAME", ""),
        }
        return {key: value for key, value in values.items() if value != ""}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        optimizer = env.get("OPTIMIZER", "").strip().lower() or "sgd"
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"OPTIMIZER={optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        backend = env.get("TORCH_DISTRIBUTED_BACKEND", "").strip() or "gloo"
        world_size = _required_int(env, "WORLD_SIZE", 1, minimum=1)
        rank = _required_int(env, "RANK", 0)
        if rank >= world_size:
            raise ConfigError(f"RANK={rank} is not below WORLD_SIZE={world_size}")
        label_smoothing = _float(env, "HP_LABEL_SMOOTHING", 0.0)
        if label_smoothing >= 1:
            raise ConfigError(f"HP_LABEL_SMOOTHING={label_smoothing:g} must be below 1")
        return cls(
            rank=rank,
            world_size=world_size,
            local_rank=_required_int(env, "LOCAL_RANK", 0),
            local_world_size=_required_int(env, "LOCAL_WORLD_SIZE", 1, minimum=1),
            launched=bool(env.get("LOCAL_RANK", "").strip()),
            epochs=_required_int(env, "EPOCHS", 5, minimum=1),
            steps_per_epoch=_required_int(env, "TRAIN_STEPS_PER_EPOCH", 20, minimum=1),
            batch_size=_required_int(env, "BATCH_SIZE", 32, minimum=1),
            learning_rate=_float(env, "LEARNING_RATE", 0.05, positive=True),
            optimizer=optimizer,
            weight_decay=_float(env, "HP_WEIGHT_DECAY", 0.0),
            warmup_steps=_required_int(env, "WARMUP_STEPS", 0),
            accumulation_steps=_required_int(env, "GRADIENT_ACCUMULATION_STEPS", 1, minimum=1),
            mixed_precision=_flag(env, "MIXED_PRECISION"),
            label_smoothing=label_smoothing,
            seed=_required_int(env, "TRAIN_SEED", 0),
            backend=backend,
            dist_timeout=_float(env, "TRAIN_DIST_TIMEOUT", 1800.0, positive=True),
            checkpoint_dir=progress.checkpoint_dir(env),
            frequency=_required_int(env, "CHECKPOINT_FREQUENCY", 1, minimum=1),
            retention=_int(env, "CHECKPOINT_RETENTION", None, minimum=1),
            resume_from=progress.resume_path(env),
            resume_origin=env.get("TRAIN_RESUME_ORIGIN", "").strip() or None,
            fail_at_epoch=_int(env, "TRAIN_FAIL_AT_EPOCH", None, minimum=1),
            fail_file=env.get("TRAIN_FAIL_FILE", "").strip() or None,
            step_seconds=_float(env, "TRAIN_STEP_SECONDS", 0.0),
            save_seconds=_float(env, "TRAIN_SAVE_SECONDS", 0.0),
            progress_interval=_float(env, "TRAIN_PROGRESS_INTERVAL", progress.DEFAULT_MIN_INTERVAL),
            simulate=env.get("TRAIN_SIMULATE", "").strip().lower() in {"1", "true", "yes"},
            elastic=bool(env.get("TRAININGJOB_MAX_WORKERS", "").strip()),
        )
