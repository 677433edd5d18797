"""The reference trainer's engines behind one interface: the torch one (torch_engine.py) and the
pure-Python simulation used where torch is not installed, and the choice between them.

A module of its own: the training loop (loop.py) sees only `Engine`.
"""

from __future__ import annotations

import importlib
import json
import logging
import math
import os
import random
import time
from typing import Protocol

from .checkpoints import SIMULATION_STATE_FILE, locate_checkpoint, write_metadata
from .config import Config, ConfigError, Terminated
from .torch_engine import EVAL_SAMPLES, FEATURES, TorchEngine

log = logging.getLogger("train")


class Engine(Protocol):
    framework: str

    def resume(self, requested: str | None) -> tuple[int, int, str | None]:
        """Loads RESUME_FROM (every rank agrees): (completed epochs, steps, checkpoint path or None)."""
        ...

    def train_step(self, epoch: int, step: int) -> float:
        """Trains step `step` (within the epoch) of epoch `epoch`; this rank's loss."""
        ...

    def epoch_loss(self, total: float, steps: int) -> float:
        """The mean loss of an epoch's `steps` steps over every rank (`total`: this rank's sum)."""
        ...

    def agree_to_stop(self, requested: bool) -> bool:
        """Whether any rank was told to stop: every rank asks after every step, and all get one answer."""
        ...

    def evaluate(self) -> float:
        """Accuracy on a fixed held-out set."""
        ...

    def save(self, directory: str, *, epoch: int, step: int) -> None:
        """Writes the state into `directory` (rank 0 only)."""
        ...

    def close(self, *, finished: bool = False) -> None: ...


def _dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b))  # noqa: B905 - same length; strict= needs Python 3.10


class SimulationEngine:
    """Logistic regression in pure Python: the same loop, checkpoints and reports without torch.

    Every rank trains its own copy on its own data; nothing is exchanged between ranks.
    """

    framework = "simulation"

    def __init__(self, config: Config) -> None:
        self.config = config
        if config.mixed_precision:
            log.info(
                "MIXED_PRECISION is set: the simulation has no lower precision to use, it computes in double"
            )
        truth = random.Random(config.seed)  # noqa: S311 - synthetic data, not security
        self.true_weights = [truth.gauss(0.0, 1.0) for _ in range(FEATURES)]
        self.weights = [0.0] * FEATURES
        self.bias = 0.0
        self.eval_set = self._batch(EVAL_SAMPLES, config.seed + 1)

    def _batch(self, size: int, seed: int) -> list[tuple[list[float], int]]:
        rng = random.Random(seed)  # noqa: S311 - synthetic data, not security
        batch = []
        for _ in range(size):
            x = [rng.gauss(0.0, 1.0) for _ in range(FEATURES)]
            label = int(_dot(self.true_weights, x) > 0)
            batch.append((x, label))
        return batch

    def _probability(self, x: list[float]) -> float:
        z = self.bias + _dot(self.weights, x)
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))

    def resume(self, requested: str | None) -> tuple[int, int, str | None]:
        checkpoint = locate_checkpoint(requested)
        if checkpoint is None:
            return 0, 0, None
        if checkpoint.framework != "simulation":
            raise ConfigError(f"{checkpoint.path} was written by torch, which is not importable here")
        with open(checkpoint.state_file, encoding="utf-8") as handle:
            state = json.load(handle)
        self.weights = [float(w) for w in state["weights"]]
        self.bias = float(state["bias"])
        return int(state["epoch"]), int(state["step"]), checkpoint.path

    def train_step(self, epoch: int, step: int) -> float:
        """One step at the schedule's learning rate over GRADIENT_ACCUMULATION_STEPS micro-batches,
        toward labels smoothed by HP_LABEL_SMOOTHING (no mixed precision: it computes in double)."""
        config = self.config
        gradient = [0.0] * FEATURES
        bias_gradient = 0.0
        loss = 0.0
        samples = 0
        smoothing = config.label_smoothing
        for micro in range(config.accumulation_steps):
            seed = config.seed * 1_000_003 + epoch * 10_007 + step * 101 + config.rank + micro * 1_009
            batch = self._batch(config.batch_size, seed)
            samples += len(batch)
            for x, label in batch:
                p = self._probability(x)
                target = label * (1.0 - smoothing) + smoothing / 2
                loss -= target * math.log(max(p, 1e-12)) + (1.0 - target) * math.log(max(1.0 - p, 1e-12))
                for i, v in enumerate(x):
                    gradient[i] += (p - target) * v
                bias_gradient += p - target
        rate = config.learning_rate_at(epoch * config.steps_per_epoch + step)
        scale = rate / samples
        decay = rate * config.weight_decay
        self.weights = [w - scale * gradient[i] - decay * w for i, w in enumerate(self.weights)]
        self.bias -= scale * bias_gradient
        if config.step_seconds:
            time.sleep(config.step_seconds)
        return loss / samples

    def epoch_loss(self, total: float, steps: int) -> float:
        return total / max(steps, 1)

    def agree_to_stop(self, requested: bool) -> bool:
        return requested  # no exchange between ranks: each stops on its own signal

    def evaluate(self) -> float:
        correct = sum(int(self._probability(x) > 0.5) == label for x, label in self.eval_set)
        return correct / len(self.eval_set)

    def save(self, directory: str, *, epoch: int, step: int) -> None:
        state = {"epoch": epoch, "step": step, "weights": self.weights, "bias": self.bias}
        with open(os.path.join(directory, SIMULATION_STATE_FILE), "w", encoding="utf-8") as handle:
            json.dump(state, handle)
        write_metadata(
            directory, epoch=epoch, step=step, framework=self.framework, state_file=SIMULATION_STATE_FILE
        )

    def close(self, *, finished: bool = False) -> None:
        return None


def why_simulate(config: Config) -> str | None:
    """Why this run uses the pure-Python simulation instead of torch, or None when torch is used."""
    if config.simulate:
        return "TRAIN_SIMULATE is set: running the pure-Python simulation (no torch, no gradient exchange)"
    try:
        importlib.import_module("torch")
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise TorchBroken(error) from error
        return (
            f"torch is not importable ({error}): running the pure-Python simulation instead "
            "(logistic regression, no gradient exchange between ranks)"
        )
    except Terminated:
        raise  # SIGTERM while torch was loading: the run ends as told, it does not fall back
    except Exception as error:
        raise TorchBroken(error) from error
    return None


class TorchBroken(RuntimeError):
    """torch is installed but does not load (a native library that cannot be mapped under a tight
    memory limit, a missing dependency). The run fails, and is retried, rather than falling back to
    the simulation: simulation checkpoints in a torch job's directory would stop every later resume."""

    def __init__(self, error: Exception) -> None:
        super().__init__(f"torch is installed but failed to import: {type(error).__name__}: {error}")


def make_engine(config: Config) -> Engine:
    reason = why_simulate(config)
    if reason is not None:
        log.warning("%s", reason)
        return SimulationEngine(config)
    return TorchEngine(config)
