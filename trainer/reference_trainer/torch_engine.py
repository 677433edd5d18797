"""The reference trainer's torch engine: torch.distributed data-parallel training of a small MLP on
synthetic, deterministic data, joined from the operator's rendezvous variables, with the job's
hyperparameters: the optimizer and its weight decay, learning-rate warmup, gradient accumulation,
mixed precision and label smoothing.

A module of its own, named torch_engine so that nothing mistakes it for torch itself. torch is imported
when the engine is made, never at import, so the trainer runs (as the simulation) in images without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import logging
import os
import socket
import time
from datetime import timedelta
from typing import Any, Final

from .checkpoints import TORCH_STATE_FILE, locate_checkpoint, write_metadata
from .config import Config, ConfigError

FEATURES: Final = 16
HIDDEN: Final = 32
CLASSES: Final = 2
EVAL_SAMPLES: Final = 512

log = logging.getLogger("train")


def wait_for_master(timeout: float) -> None:
    """Waits until rank 0's store accepts connections at MASTER_ADDR:MASTER_PORT (at most `timeout`
    seconds; init_process_group then reports what went wrong). torch's client waits about half a
    second before it tries a refused connection again, and ranks that start together, as a gang
    restarted in place does, find rank 0 not listening yet as often as not: polling every 20 ms
    saves that pause."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not address or not port.isdigit():
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, int(port)), timeout=1.0):
                return
        except OSError:
            time.sleep(0.02)


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
            if config.rank > 0:
                wait_for_master(config.dist_timeout)
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
        self.loss = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
        # Mixed precision: autocast to bfloat16 on the CPU, to float16 on a GPU, whose small range needs
        # the loss scaled (the scaler does nothing when disabled).
        self.autocast_dtype = torch.float16 if self.device.type == "cuda" else torch.bfloat16
        self.scaler = torch.amp.GradScaler(
            "cuda", enabled=config.mixed_precision and self.device.type == "cuda"
        )
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
            if self.scaler.is_enabled() and "scaler" in state:
                self.scaler.load_state_dict(state["scaler"])
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

    def train_step(self, epoch: int, step: int) -> float:
        """One optimizer step at the schedule's learning rate, over GRADIENT_ACCUMULATION_STEPS
        micro-batches (DDP all-reduces the gradients in the last one's backward only); this rank's mean
        loss."""
        config = self.config
        self.trained.train()
        rate = config.learning_rate_at(epoch * config.steps_per_epoch + step)
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        self.optimizer.zero_grad()
        micro_batches = config.accumulation_steps
        total = 0.0
        for micro in range(micro_batches):
            seed = config.seed * 1_000_003 + epoch * 10_007 + step * 101 + config.rank + micro * 1_009
            x, y = self._batch(config.batch_size, seed)
            last = micro == micro_batches - 1
            synced = contextlib.nullcontext() if last or not self.distributed else self.trained.no_sync()
            with synced:
                with self.torch.autocast(
                    self.device.type, dtype=self.autocast_dtype, enabled=config.mixed_precision
                ):
                    loss = self.loss(self.trained(x), y)
                self.scaler.scale(loss / micro_batches).backward()
            total += float(loss.item())
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if config.step_seconds:
            time.sleep(config.step_seconds)
        return total / micro_batches

    def epoch_loss(self, total: float, steps: int) -> float:
        """The mean loss of an epoch's steps over every rank (each rank calls it, with its own sum)."""
        mean = total / max(steps, 1)
        if self.distributed:
            reduced = self.torch.tensor([mean], device=self.device)
            self.dist.all_reduce(reduced)
            mean = float(reduced.item()) / self.config.world_size
        return mean

    def agree_to_stop(self, requested: bool) -> bool:
        """Whether any rank was told to stop (SIGTERM): every rank calls it after every step and gets the
        same answer, so all of them stop after the same step and rank 0's checkpoint is theirs."""
        if not self.distributed:
            return requested
        flag = self.torch.tensor([1 if requested else 0], device=self.device)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MAX)
        return bool(flag.item())

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
        if self.scaler.is_enabled():
            state["scaler"] = self.scaler.state_dict()
        self.torch.save(state, os.path.join(directory, TORCH_STATE_FILE))
        write_metadata(
            directory, epoch=epoch, step=step, framework=self.framework, state_file=TORCH_STATE_FILE
        )

    def close(self, *, finished: bool = False) -> None:
        """Leaves the process group. After a finished run the ranks first wait for each other (at most
        the process group's timeout): a rank tearing gloo down while its peer still talks to it can
        abort the process at exit ("terminate called without an active exception")."""
        if self.distributed and self.dist.is_initialized():
            if finished:
                self.dist.barrier()
            self.dist.destroy_process_group()
