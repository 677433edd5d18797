"""The reference trainer: what a TrainingJob runs when spec.command is not set.

Why it exists: it shows, in one self-contained file, everything the operator expects of training code
(docs/env.md, docs/progress.md) and lets a job be tried without writing any: it joins the job's
torch.distributed rendezvous from the injected environment, trains a small classifier on synthetic
data with gradients all-reduced across every process (DistributedDataParallel), reports progress from
rank 0, writes a checkpoint every CHECKPOINT_FREQUENCY epochs and after the last one (keeping
CHECKPOINT_RETENTION of them) and, after a restart, continues from RESUME_FROM instead of starting over.
In an elastic job (TRAININGJOB_MAX_WORKERS is set; torchrun starts the processes) it continues from the
newest checkpoint under CHECKPOINT_DIR instead: torchrun starts the processes of a pod again after every
change of the world, and the pod's RESUME_FROM is only as recent as the pod.

The operator ships this file in the job's ConfigMap together with the progress helper
(trainingjob_progress.py, imported from this file's own directory), mounted at /etc/trainingjob.

- torch importable: real training. Backend from TORCH_DISTRIBUTED_BACKEND / DIST_BACKEND (default gloo;
  nccl falls back to gloo without a GPU), init_method env:// (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
  RANK). With LOCAL_WORLD_SIZE > 1 and no launcher (torchrun sets LOCAL_RANK) it starts one process per
  local rank itself, with RANK = RANK + local rank.
- torch not importable (e.g. the jax default image): a pure-Python simulation of the same loop
  (logistic regression, no gradient exchange between ranks) so the job still trains, checkpoints,
  resumes and reports progress. It says so in its log.

Knobs besides the operator's variables (set them in spec.env): TRAIN_STEPS_PER_EPOCH (20),
TRAIN_STEP_SECONDS (0: extra time per step, to watch progress in a demo), TRAIN_SEED (0),
TRAIN_FAIL_AT_EPOCH (exit 1 right after completing that epoch, unless this run resumed past it: tests
restarts), TRAIN_SIMULATE=1 (the simulation even with torch), TRAIN_PROGRESS_INTERVAL (seconds between
progress reports, default 5), TRAIN_DIST_TIMEOUT (seconds to wait for peers, default 1800).

Standard library besides torch, Python 3.9 or later. Exit status: 0 done, 1 training failed, 2 bad
configuration, 143 terminated (SIGTERM).
"""

from __future__ import annotations

import ctypes
import importlib
import io
import json
import logging
import math
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any, Final, Protocol

# The progress helper lives next to this file (both come from the job's ConfigMap).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import trainingjob_progress as progress  # noqa: E402

FEATURES: Final = 16
HIDDEN: Final = 32
CLASSES: Final = 2
EVAL_SAMPLES: Final = 512
OPTIMIZERS: Final = ("sgd", "adam", "adamw", "rmsprop")
METADATA_FILE: Final = "trainingjob-checkpoint.json"
TORCH_STATE_FILE: Final = "model.pt"
SIMULATION_STATE_FILE: Final = "simulation.json"
TERMINATION_LOG: Final = "/dev/termination-log"
KILL_GRACE_SECONDS: Final = 30.0
EXIT_FAILED: Final = 1
EXIT_CONFIG: Final = 2
EXIT_TERMINATED: Final = 143

log = logging.getLogger("train")


class ConfigError(Exception):
    """The job's configuration cannot work (exit 2): retrying will not help."""


class Terminated(Exception):
    """SIGTERM: the operator is stopping or restarting the gang."""


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
    step_seconds: float
    progress_interval: float
    simulate: bool
    elastic: bool  # an elastic job: resume from the newest checkpoint under CHECKPOINT_DIR

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        optimizer = env.get("OPTIMIZER", "").strip().lower() or "sgd"
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"OPTIMIZER={optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
        backend = (
            env.get("TORCH_DISTRIBUTED_BACKEND", "").strip() or env.get("DIST_BACKEND", "").strip() or "gloo"
        )
        world_size = _required_int(env, "WORLD_SIZE", 1, minimum=1)
        rank = _required_int(env, "RANK", 0)
        if rank >= world_size:
            raise ConfigError(f"RANK={rank} is not below WORLD_SIZE={world_size}")
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
            seed=_required_int(env, "TRAIN_SEED", 0),
            backend=backend,
            dist_timeout=_float(env, "TRAIN_DIST_TIMEOUT", 1800.0, positive=True),
            checkpoint_dir=progress.checkpoint_dir(env),
            frequency=_required_int(env, "CHECKPOINT_FREQUENCY", 1, minimum=1),
            retention=_int(env, "CHECKPOINT_RETENTION", None, minimum=1),
            resume_from=progress.resume_path(env),
            resume_origin=env.get("TRAIN_RESUME_ORIGIN", "").strip() or None,
            fail_at_epoch=_int(env, "TRAIN_FAIL_AT_EPOCH", None, minimum=1),
            step_seconds=_float(env, "TRAIN_STEP_SECONDS", 0.0),
            progress_interval=_float(env, "TRAIN_PROGRESS_INTERVAL", progress.DEFAULT_MIN_INTERVAL),
            simulate=env.get("TRAIN_SIMULATE", "").strip().lower() in {"1", "true", "yes"},
            elastic=bool(env.get("TRAININGJOB_MAX_WORKERS", "").strip()),
        )


# ---------------------------------------------------------------------------------------------------
# Checkpoints shared by both engines


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint to resume from: the file holding the state and what it says about itself."""

    path: str  # as reported (the epoch-<N> directory, or the file RESUME_FROM named)
    state_file: str
    framework: str


def locate_checkpoint(requested: str | None) -> Checkpoint | None:
    """The checkpoint RESUME_FROM designates, or None to start from scratch.

    A local directory of checkpoints resolves to its newest; one without any means "nothing yet"
    (start from scratch). A local path that does not exist is a configuration error. Object-store
    URLs cannot be read by this trainer: it says so and starts from scratch.
    """
    if requested is None:
        return None
    if progress.is_remote(requested):
        log.warning(
            "RESUME_FROM=%s is in object storage, which the reference trainer cannot read: "
            "starting from epoch 0 (use your own training code to resume from it)",
            requested,
        )
        return None
    if not os.path.exists(requested):
        raise ConfigError(f"RESUME_FROM={requested} does not exist")
    path = progress.resolve_checkpoint(requested)
    if os.path.isfile(path):
        framework = "simulation" if path.endswith(".json") else "torch"
        return Checkpoint(path, path, framework)
    for name, framework in ((TORCH_STATE_FILE, "torch"), (SIMULATION_STATE_FILE, "simulation")):
        if os.path.isfile(os.path.join(path, name)):
            return Checkpoint(path, os.path.join(path, name), framework)
    if path == requested and progress.checkpoint_epoch(path) is None:
        log.info("RESUME_FROM=%s holds no checkpoint yet: starting from epoch 0", requested)
        return None
    raise ConfigError(
        f"RESUME_FROM={requested}: {path} holds neither {TORCH_STATE_FILE} nor {SIMULATION_STATE_FILE}"
    )


def write_metadata(directory: str, *, epoch: int, step: int, framework: str, state_file: str) -> None:
    metadata = {"epoch": epoch, "step": step, "framework": framework, "file": state_file}
    with open(os.path.join(directory, METADATA_FILE), "w", encoding="utf-8") as handle:
        json.dump(metadata, handle, sort_keys=True)
        handle.write("\n")


# ---------------------------------------------------------------------------------------------------
# Engines: the torch one and the pure-Python simulation, behind one interface


class Engine(Protocol):
    framework: str

    def resume(self, requested: str | None) -> tuple[int, int, str | None]:
        """Loads RESUME_FROM (every rank agrees): (completed epochs, steps, checkpoint path or None)."""
        ...

    def train_epoch(self, epoch: int) -> float:
        """Trains one epoch; the mean loss over its steps and every rank."""
        ...

    def evaluate(self) -> float:
        """Accuracy on a fixed held-out set."""
        ...

    def save(self, directory: str, *, epoch: int, step: int) -> None:
        """Writes the state into `directory` (rank 0 only)."""
        ...

    def close(self) -> None: ...


class TorchEngine:
    """torch.distributed data-parallel training of a small MLP on synthetic, deterministic data."""

    framework = "torch"

    def __init__(self, config: Config) -> None:
        self.config = config
        self.torch: Any = importlib.import_module("torch")
        self.dist: Any = importlib.import_module("torch.distributed")
        nn: Any = importlib.import_module("torch.nn")
        parallel: Any = importlib.import_module("torch.nn.parallel")
        torch = self.torch
        backend = config.backend
        self.device = torch.device("cpu")
        if backend == "nccl":
            if torch.cuda.is_available():
                self.device = torch.device("cuda", config.local_rank % torch.cuda.device_count())
                torch.cuda.set_device(self.device)
            else:
                log.warning("backend nccl needs a GPU and none is visible: using gloo on the CPU")
                backend = "gloo"
        if not self.dist.is_available() or not self.dist.is_backend_available(backend):
            raise ConfigError(f"torch.distributed backend {backend!r} is not available in this torch build")
        self.distributed = config.world_size > 1
        if self.distributed:
            log.info(
                "joining the rendezvous at %s:%s as rank %d of %d (backend %s)",
                os.environ.get("MASTER_ADDR"),
                os.environ.get("MASTER_PORT"),
                config.rank,
                config.world_size,
                backend,
            )
            self.dist.init_process_group(
                backend=backend,
                init_method="env://",
                world_size=config.world_size,
                rank=config.rank,
                timeout=timedelta(seconds=config.dist_timeout),
            )
        torch.manual_seed(config.seed)
        generator = torch.Generator().manual_seed(config.seed)
        self.true_weights = torch.randn(FEATURES, generator=generator)
        self.model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)).to(
            self.device
        )
        self.optimizer = self._optimizer()
        self.loss = nn.CrossEntropyLoss()
        self.eval_x, self.eval_y = self._batch(EVAL_SAMPLES, config.seed + 1)
        self.ddp_class = parallel.DistributedDataParallel
        self.trained: Any = self.model

    def _optimizer(self) -> Any:
        optim = self.torch.optim
        params = self.model.parameters()
        lr, decay = self.config.learning_rate, self.config.weight_decay
        if self.config.optimizer == "adam":
            return optim.Adam(params, lr=lr, weight_decay=decay)
        if self.config.optimizer == "adamw":
            return optim.AdamW(params, lr=lr, weight_decay=decay)
        if self.config.optimizer == "rmsprop":
            return optim.RMSprop(params, lr=lr, weight_decay=decay)
        return optim.SGD(params, lr=lr, momentum=0.9, weight_decay=decay)

    def _batch(self, size: int, seed: int) -> tuple[Any, Any]:
        generator = self.torch.Generator().manual_seed(seed)
        x = self.torch.randn(size, FEATURES, generator=generator)
        y = (x @ self.true_weights > 0).long()
        return x.to(self.device), y.to(self.device)

    def resume(self, requested: str | None) -> tuple[int, int, str | None]:
        # Only rank 0 reads training storage (as only rank 0 writes it); the others get the state from it.
        payload: dict[str, Any] | None = None
        if self.config.rank == 0:
            payload = self._read(requested)
        if self.distributed:
            payload = self._broadcast(payload)
        epoch, step, path = 0, 0, None
        if payload is not None and "error" in payload:
            raise ConfigError(f"rank 0 could not resume: {payload['error']}")
        if payload is not None:
            state = payload["state"]
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            epoch, step, path = int(state["epoch"]), int(state["step"]), str(payload["path"])
        if self.distributed:
            self.trained = self.ddp_class(self.model)
        return epoch, step, path

    def _read(self, requested: str | None) -> dict[str, Any] | None:
        try:
            checkpoint = locate_checkpoint(requested)
            if checkpoint is None:
                return None
            if checkpoint.framework != "torch":
                raise ConfigError(f"{checkpoint.path} was written by the simulation, not by torch")
            state = self.torch.load(checkpoint.state_file, map_location="cpu", weights_only=True)
            return {"state": state, "path": checkpoint.path}
        except Exception as error:
            if not self.distributed:
                raise
            return {"error": str(error)}

    def _broadcast(self, payload: dict[str, Any] | None) -> dict[str, Any] | None:
        """Rank 0's payload on every rank: serialized with torch.save (loaded back with weights_only) and
        sent as bytes, which needs neither pickle nor numpy (broadcast_object_list needs both)."""
        torch = self.torch
        if self.config.rank == 0:
            buffer = io.BytesIO()
            torch.save({"payload": payload}, buffer)
            data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
            size = torch.tensor([data.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        size = size.to(self.device)
        self.dist.broadcast(size, src=0)
        if self.config.rank != 0:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        data = data.to(self.device)
        self.dist.broadcast(data, src=0)
        data = data.cpu().contiguous()
        raw = ctypes.string_at(data.data_ptr(), data.numel())
        received: dict[str, Any] | None = torch.load(io.BytesIO(raw), weights_only=True)["payload"]
        return received

    def train_epoch(self, epoch: int) -> float:
        config = self.config
        self.trained.train()
        total = 0.0
        for step in range(config.steps_per_epoch):
            seed = config.seed * 1_000_003 + epoch * 10_007 + step * 101 + config.rank
            x, y = self._batch(config.batch_size, seed)
            self.optimizer.zero_grad()
            loss = self.loss(self.trained(x), y)
            loss.backward()  # DDP all-reduces the gradients here
            self.optimizer.step()
            total += float(loss.item())
            if config.step_seconds:
                time.sleep(config.step_seconds)
        mean = total / config.steps_per_epoch
        if self.distributed:
            reduced = self.torch.tensor([mean], device=self.device)
            self.dist.all_reduce(reduced)
            mean = float(reduced.item()) / config.world_size
        return mean

    def evaluate(self) -> float:
        self.model.eval()
        with self.torch.no_grad():
            predicted = self.model(self.eval_x).argmax(dim=1)
            return float((predicted == self.eval_y).float().mean().item())

    def save(self, directory: str, *, epoch: int, step: int) -> None:
        state = {
            "epoch": epoch,
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
        }
        self.torch.save(state, os.path.join(directory, TORCH_STATE_FILE))
        write_metadata(
            directory, epoch=epoch, step=step, framework=self.framework, state_file=TORCH_STATE_FILE
        )

    def close(self) -> None:
        if self.distributed and self.dist.is_initialized():
            self.dist.destroy_process_group()


def _dot(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b))  # noqa: B905 - same length; strict= needs Python 3.10


class SimulationEngine:
    """Logistic regression in pure Python: the same loop, checkpoints and reports without torch.

    Every rank trains its own copy on its own data; nothing is exchanged between ranks.
    """

    framework = "simulation"

    def __init__(self, config: Config) -> None:
        self.config = config
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

    def train_epoch(self, epoch: int) -> float:
        config = self.config
        total = 0.0
        for step in range(config.steps_per_epoch):
            seed = config.seed * 1_000_003 + epoch * 10_007 + step * 101 + config.rank
            batch = self._batch(config.batch_size, seed)
            gradient = [0.0] * FEATURES
            bias_gradient = 0.0
            loss = 0.0
            for x, label in batch:
                p = self._probability(x)
                loss -= math.log(max(p if label else 1.0 - p, 1e-12))
                for i, v in enumerate(x):
                    gradient[i] += (p - label) * v
                bias_gradient += p - label
            scale = config.learning_rate / len(batch)
            decay = config.learning_rate * config.weight_decay
            self.weights = [w - scale * gradient[i] - decay * w for i, w in enumerate(self.weights)]
            self.bias -= scale * bias_gradient
            total += loss / len(batch)
            if config.step_seconds:
                time.sleep(config.step_seconds)
        return total / config.steps_per_epoch

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

    def close(self) -> None:
        return None


def why_simulate(config: Config) -> str | None:
    """Why this run uses the pure-Python simulation instead of torch, or None when torch is used."""
    if config.simulate:
        return "TRAIN_SIMULATE is set: running the pure-Python simulation (no torch, no gradient exchange)"
    try:
        importlib.import_module("torch")
    except Exception as error:  # ImportError, or a torch build whose native libraries do not load
        return (
            f"torch is not importable ({error}): running the pure-Python simulation instead "
            "(logistic regression, no gradient exchange between ranks)"
        )
    return None


def make_engine(config: Config) -> Engine:
    reason = why_simulate(config)
    if reason is not None:
        log.warning("%s", reason)
        return SimulationEngine(config)
    return TorchEngine(config)


# ---------------------------------------------------------------------------------------------------
# The training loop


def should_checkpoint(config: Config, completed: int) -> bool:
    """Every CHECKPOINT_FREQUENCY epochs and after the last one, by rank 0, when CHECKPOINT_DIR is set."""
    if config.rank != 0 or not config.checkpoint_dir:
        return False
    return completed % config.frequency == 0 or completed == config.epochs


def save_checkpoint(config: Config, engine: Engine, *, epoch: int, step: int) -> str | None:
    directory = config.checkpoint_dir
    if directory is None:
        return None
    if progress.is_remote(directory):
        log.warning(
            "CHECKPOINT_DIR=%s is object storage, which the reference trainer cannot write: "
            "no checkpoint saved (use your own training code for s3/gcs)",
            directory,
        )
        return None
    with progress.atomic_checkpoint(epoch, directory) as temporary:
        engine.save(temporary, epoch=epoch, step=step)
    path = progress.checkpoint_path(epoch, directory)
    log.info("saved checkpoint %s", path)
    progress.enforce_retention(directory, keep=config.retention)
    return path


def resume_point(config: Config) -> str | None:
    """What this run resumes from: RESUME_FROM, or in an elastic job the newest checkpoint under
    CHECKPOINT_DIR when there is one (only rank 0 reads it; the torch engine hands it to the others)."""
    directory = config.checkpoint_dir
    if config.elastic and directory and not progress.is_remote(directory):
        latest = progress.latest_checkpoint_dir(directory)
        if latest is not None:
            return latest
    return config.resume_from


def train(config: Config, engine: Engine, reporter: progress.Reporter) -> int:
    epoch, step, resumed = engine.resume(resume_point(config))
    if resumed is not None and config.resume_origin:
        resumed = config.resume_origin
    if resumed is not None:
        log.info(
            "resuming from epoch %d (checkpoint %s): %d of %d epochs left",
            epoch,
            resumed,
            max(config.epochs - epoch, 0),
            config.epochs,
        )
    reporter.report(
        epoch=min(epoch, config.epochs),
        total_epochs=config.epochs,
        step=step,
        total_steps=config.total_steps,
        checkpoint=resumed,
    )
    for index in range(epoch, config.epochs):
        loss = engine.train_epoch(index)
        accuracy = engine.evaluate()
        completed = index + 1
        step += config.steps_per_epoch
        saved = None
        if should_checkpoint(config, completed):
            saved = save_checkpoint(config, engine, epoch=completed, step=step)
        log.info(
            "epoch %d/%d: loss %.4f accuracy %.4f (step %d/%d)",
            completed,
            config.epochs,
            loss,
            accuracy,
            step,
            config.total_steps,
        )
        reporter.report(
            epoch=completed,
            total_epochs=config.epochs,
            step=step,
            total_steps=config.total_steps,
            metrics={"loss": loss, "accuracy": accuracy},
            checkpoint=saved,
        )
        if config.fail_at_epoch == completed:
            log.error("TRAIN_FAIL_AT_EPOCH=%d: failing on purpose after epoch %d", completed, completed)
            return EXIT_FAILED
    log.info("training finished: %d epochs, %d steps", config.epochs, step)
    return 0


# ---------------------------------------------------------------------------------------------------
# Processes: one per local rank when nobody else starts them


# After one local rank fails, how long the others may take to end by themselves (they often fail the same
# way at the same moment, and their own messages say more than a SIGTERM) before they are stopped.
PEER_GRACE_SECONDS: Final = 10


def launch_local_ranks(config: Config) -> int:
    """Starts LOCAL_WORLD_SIZE copies of this file with RANK = RANK + local rank and LOCAL_RANK set, and
    waits for them. When one fails the others are stopped after PEER_GRACE_SECONDS (they would wait for it
    forever); SIGTERM and SIGINT are passed on."""
    count = config.local_world_size
    log.info(
        "LOCAL_WORLD_SIZE=%d: starting one process per local rank (ranks %d-%d of %d)",
        count,
        config.rank,
        config.rank + count - 1,
        config.world_size,
    )
    shared: dict[str, str] = {}
    private: str | None = None
    if config.resume_from and not progress.is_remote(config.resume_from):
        # Every local rank must start from the same checkpoint: resolve a directory of checkpoints once,
        # before rank 0 can add a newer one (or delete this one) to it.
        resolved = progress.resolve_checkpoint(config.resume_from)
        shared["RESUME_FROM"] = resolved
        if why_simulate(config) is not None:
            # The simulation has no collective: every rank reads the checkpoint itself, and rank 0 may
            # save the next one and prune this one (CHECKPOINT_RETENTION) before the others have read
            # it. They read a private copy instead (torch ranks get the state from rank 0).
            private = tempfile.mkdtemp(prefix="trainingjob-resume-")
            copy = os.path.join(private, os.path.basename(resolved.rstrip("/")))
            shutil.copytree(resolved, copy)
            shared.update(RESUME_FROM=copy, TRAIN_RESUME_ORIGIN=resolved)
    children: list[subprocess.Popen[bytes]] = []
    for local in range(count):
        env = dict(os.environ, **shared)
        env.update(RANK=str(config.rank + local), LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(count))
        children.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env=env))

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    finished: queue.Queue[tuple[int, int]] = queue.Queue()
    for local, child in enumerate(children):
        threading.Thread(
            target=lambda local=local, child=child: finished.put((local, child.wait())), daemon=True
        ).start()
    status = 0
    remaining = len(children)
    stop_at: float | None = None
    while remaining:
        try:
            local, code = finished.get(
                timeout=None if stop_at is None else max(0.0, stop_at - time.monotonic())
            )
        except queue.Empty:
            log.error("stopping the other local ranks")
            stop_children(children)
            stop_at = None
            continue
        remaining -= 1
        if code != 0 and status == 0:
            status = code if code > 0 else 128 - code
            log.error(
                "local rank %d exited with status %d: the other local ranks get %d s to end on their own",
                local,
                code,
                PEER_GRACE_SECONDS,
            )
            stop_at = time.monotonic() + PEER_GRACE_SECONDS
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)
    return status


def stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()

    def kill() -> None:
        for child in children:
            if child.poll() is None:
                child.kill()

    timer = threading.Timer(KILL_GRACE_SECONDS, kill)
    timer.daemon = True
    timer.start()


# ---------------------------------------------------------------------------------------------------
# Entry point


def configure_logging() -> None:
    rank = os.environ.get("RANK", "0").strip() or "0"
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank={rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def termination_message(message: str) -> None:
    """Also writes the reason into the pod's termination message (status.containerStatuses) when the
    kubelet provides the file; the operator shows it in the job's conditions."""
    if os.path.isfile(TERMINATION_LOG):
        try:
            with open(TERMINATION_LOG, "w", encoding="utf-8") as handle:
                handle.write(message[:4000])
        except OSError:
            pass


def fail(message: str, status: int) -> int:
    log.error("%s", message)
    termination_message(message)
    return status


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(signal.Signals(signum).name)


def run_process(config: Config) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    reporter = progress.Reporter.from_env(min_interval=config.progress_interval)
    engine: Engine | None = None
    try:
        engine = make_engine(config)
        status = train(config, engine, reporter)
        if status != 0:
            termination_message(f"training failed on purpose after epoch {config.fail_at_epoch}")
        return status
    except ConfigError as error:
        return fail(f"configuration error: {error}", EXIT_CONFIG)
    except Terminated as signal_name:
        return fail(f"terminated by {signal_name}: stopping", EXIT_TERMINATED)
    except Exception as error:
        log.exception("training failed")
        return fail(f"training failed: {type(error).__name__}: {error}", EXIT_FAILED)
    finally:
        reporter.close()
        if engine is not None:
            try:
                engine.close()
            except Exception as error:
                log.warning("could not shut down cleanly: %s", error)


def main() -> int:
    configure_logging()
    try:
        config = Config.from_env(os.environ)
    except ConfigError as error:
        return fail(f"configuration error: {error}", EXIT_CONFIG)
    if config.local_world_size > 1 and not config.launched:
        return launch_local_ranks(config)
    return run_process(config)


if __name__ == "__main__":
    sys.exit(main())
