"""The reference trainer's checkpoints: finding the one RESUME_FROM designates, the metadata file
written beside the state, and when and where the training loop saves.

A module of its own: both engines read and write checkpoints through these functions, and the
directory layout (epoch-<N>, written whole) is the progress helper's (trainingjob_progress).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Final, Protocol

import trainingjob_progress as progress

from .config import Config, ConfigError

METADATA_FILE: Final = "trainingjob-checkpoint.json"
TORCH_STATE_FILE: Final = "model.pt"
SIMULATION_STATE_FILE: Final = "simulation.json"

log = logging.getLogger("train")


class Saves(Protocol):
    def save(self, directory: str, *, epoch: int, step: int) -> None: ...


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


def writes_checkpoints(config: Config) -> bool:
    """Rank 0 writes the checkpoints, when CHECKPOINT_DIR is set."""
    return config.rank == 0 and bool(config.checkpoint_dir)


def should_checkpoint(config: Config, completed: int) -> bool:
    """Every CHECKPOINT_FREQUENCY epochs and after the last one, by rank 0, when CHECKPOINT_DIR is set."""
    if not writes_checkpoints(config):
        return False
    return completed % config.frequency == 0 or completed == config.epochs


def save_checkpoint(
    config: Config, engine: Saves, *, epoch: int, step: int, mid_epoch: bool = False
) -> str | None:
    """Writes the state whole (atomic_checkpoint) as epoch-<epoch>, or with `mid_epoch` (a stop in the
    middle of an epoch) as epoch-<epoch>-step-<step>; keeps CHECKPOINT_RETENTION of them. Its path, or
    None where this trainer cannot write (object storage)."""
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
    named_step = step if mid_epoch else None
    with progress.atomic_checkpoint(epoch, directory, named_step) as temporary:
        engine.save(temporary, epoch=epoch, step=step)
        if config.save_seconds:
            time.sleep(config.save_seconds)  # TRAIN_SAVE_SECONDS: a slow save, written but not yet whole
    path = progress.checkpoint_path(epoch, directory, named_step)
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
