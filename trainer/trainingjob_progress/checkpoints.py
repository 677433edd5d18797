"""Checkpoint housekeeping for training code in a TrainingJob's pods: where checkpoints go, how they are
written whole, which one to resume from and how many are kept.

A checkpoint is a directory named after how far training got: epoch-<E> after E completed epochs, and
epoch-<E>-step-<S> for one saved in the middle of epoch E+1, at global step S (when the pod is told
to stop: docs/progress.md). They order by (E, S), an end-of-epoch checkpoint before any saved later
in the next epoch.

The operator never reads training storage, so the trainer owns its checkpoints: where they go
(`checkpoint_path`, under CHECKPOINT_DIR), how they are written so a crash never leaves a half-written
one behind (`atomic_checkpoint`), which one to resume from (`resume_path`, `latest_checkpoint_dir`)
and how many are kept (`enforce_retention`, CHECKPOINT_RETENTION). Retention works on filesystem
paths only (pvc and nfs storage); for s3:// and gs:// the bucket's lifecycle rules or the user's own
code must delete old checkpoints. The package (trainingjob_progress/__init__.py)
re-exports all of it: import it from there.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Iterator, Mapping
from typing import Final

from .base import OnceLogger, count, log

CHECKPOINT_PREFIX: Final = "epoch-"
STEP_INFIX: Final = "-step-"
_CHECKPOINT_NAME: Final = re.compile(r"^epoch-(\d+)(?:-step-(\d+))?$")

_once = OnceLogger()


def is_remote(path: str) -> bool:
    """True for object-store URLs (s3://, gs://, ...), which the helpers below do not touch."""
    return "://" in path


def checkpoint_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """CHECKPOINT_DIR, or None when checkpointing is off."""
    env = os.environ if environ is None else environ
    return env.get("CHECKPOINT_DIR", "").strip() or None


def resume_path(environ: Mapping[str, str] | None = None) -> str | None:
    """RESUME_FROM, or None: the checkpoint to start from, decided by the operator (spec.checkpoint.
    resumeFrom on the first start, the latest checkpoint the job reported after a restart)."""
    env = os.environ if environ is None else environ
    return env.get("RESUME_FROM", "").strip() or None


def _directory(directory: str | None) -> str:
    resolved = directory or checkpoint_dir()
    if not resolved:
        raise ValueError("no checkpoint directory: CHECKPOINT_DIR is not set (spec.checkpoint.enabled)")
    return resolved


def checkpoint_path(epoch: int, directory: str | None = None, step: int | None = None) -> str:
    """Where the checkpoint after `epoch` completed epochs lives: <directory>/epoch-<epoch>; with `step`,
    one saved in the middle of the next epoch at global step `step`: <directory>/epoch-<epoch>-step-<step>.

    directory defaults to CHECKPOINT_DIR; object-store URLs are joined with "/".
    """
    if count(epoch) is None:
        raise ValueError(f"epoch must be a non-negative integer, not {epoch!r}")
    if step is not None and count(step) is None:
        raise ValueError(f"step must be a non-negative integer, not {step!r}")
    name = f"{CHECKPOINT_PREFIX}{int(epoch)}" + ("" if step is None else f"{STEP_INFIX}{int(step)}")
    base = _directory(directory)
    if is_remote(base):
        return f"{base.rstrip('/')}/{name}"
    return os.path.join(base, name)


def checkpoint_epoch(path: str) -> int | None:
    """The completed epochs of a checkpoint path named epoch-<E> or epoch-<E>-step-<S>, else None."""
    match = _CHECKPOINT_NAME.match(os.path.basename(path.rstrip("/")))
    return int(match.group(1)) if match else None


def checkpoint_step(path: str) -> int | None:
    """The global step of a checkpoint path named epoch-<E>-step-<S>, else None."""
    match = _CHECKPOINT_NAME.match(os.path.basename(path.rstrip("/")))
    return int(match.group(2)) if match and match.group(2) is not None else None


def _order(path: str) -> tuple[int, int]:
    """Where a checkpoint comes in training: (epochs, step), end-of-epoch ones first in their epoch."""
    step = checkpoint_step(path)
    return (checkpoint_epoch(path) or 0, -1 if step is None else step)


def list_checkpoints(directory: str | None = None) -> list[tuple[int, str]]:
    """(epoch, path) of every checkpoint directory (epoch-<E>, epoch-<E>-step-<S>) in a local directory,
    oldest first.

    Empty for object-store URLs and for a directory that does not exist.
    """
    base = _directory(directory)
    if is_remote(base):
        return []
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(base) as entries:
            for entry in entries:
                epoch = checkpoint_epoch(entry.name)
                if epoch is not None and entry.is_dir(follow_symlinks=False):
                    found.append((epoch, entry.path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(found, key=lambda item: _order(item[1]))


def latest_checkpoint_dir(directory: str | None = None) -> str | None:
    """The newest checkpoint directory (the most epochs, then the most steps) in a local directory."""
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1][1] if checkpoints else None


def resolve_checkpoint(path: str) -> str:
    """A checkpoint to load from RESUME_FROM: a local directory holding epoch-<N> checkpoints resolves
    to the newest of them; anything else (a checkpoint directory, a file, a URL) is returned as is."""
    if is_remote(path) or not os.path.isdir(path) or checkpoint_epoch(path) is not None:
        return path
    return latest_checkpoint_dir(path) or path


def _fsync(path: str, *, directory: bool) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        descriptor = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems (and some NFS setups) refuse fsync on directories
    finally:
        os.close(descriptor)


def _fsync_tree(root: str) -> None:
    for parent, _dirs, files in os.walk(root):
        for name in files:
            _fsync(os.path.join(parent, name), directory=False)
        _fsync(parent, directory=True)


@contextlib.contextmanager
def atomic_checkpoint(epoch: int, directory: str | None = None, step: int | None = None) -> Iterator[str]:
    """Yields an empty temporary directory next to checkpoint_path(epoch, directory, step); when the
    block succeeds its files are flushed to disk and it is renamed to that path (replacing an older one
    of the same name), so a checkpoint directory is always complete. On error it is removed; a process
    killed while writing leaves only the hidden temporary directory, which no listing counts.

        with atomic_checkpoint(epoch) as tmp:
            torch.save(state, os.path.join(tmp, "model.pt"))
    """
    final = checkpoint_path(epoch, directory, step)
    if is_remote(final):
        raise ValueError(f"atomic_checkpoint writes local directories only, not {final}")
    parent, name = os.path.split(final)
    os.makedirs(parent, exist_ok=True)
    temporary = os.path.join(parent, f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(temporary)  # not mkdtemp: its 0700 mode would hide the checkpoint from other users
    try:
        yield temporary
        _fsync_tree(temporary)
        if os.path.lexists(final):
            previous = os.path.join(parent, f".{name}.old-{os.getpid()}-{secrets.token_hex(4)}")
            os.rename(final, previous)
            os.rename(temporary, final)
            shutil.rmtree(previous, ignore_errors=True)
        else:
            os.rename(temporary, final)
        _fsync(parent, directory=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _retention_from_env() -> int | None:
    text = os.environ.get("CHECKPOINT_RETENTION", "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        _once.warning("retention-env", "CHECKPOINT_RETENTION=%r is not a number: keeping all", text)
        return None


def enforce_retention(directory: str | None = None, keep: int | None = None) -> list[str]:
    """Deletes the oldest checkpoint directories (epoch-<E>, epoch-<E>-step-<S>) beyond the newest
    `keep`; returns the deleted paths, oldest first.

    directory defaults to CHECKPOINT_DIR and keep to CHECKPOINT_RETENTION (nothing is deleted when it
    is unset). Only epoch-<N> directories are touched. Object-store URLs are left alone: use the
    bucket's lifecycle rules or your own code there. A directory that cannot be deleted is logged and
    skipped.
    """
    base = directory or checkpoint_dir()
    if not base:
        return []
    if is_remote(base):
        _once.warning(
            f"remote:{base}",
            "checkpoint retention is not enforced for %s: use the storage's lifecycle rules",
            base,
        )
        return []
    limit = _retention_from_env() if keep is None else keep
    if limit is None:
        return []
    if isinstance(limit, bool) or limit < 1:
        raise ValueError(f"keep must be at least 1, not {limit!r}")
    deleted: list[str] = []
    for _epoch, path in list_checkpoints(base)[:-limit]:
        try:
            shutil.rmtree(path)
        except OSError as error:
            _once.warning(f"retention:{path}", "could not delete old checkpoint %s: %s", path, error)
            continue
        deleted.append(path)
        log.info("deleted old checkpoint %s (retention %d)", path, limit)
    return deleted
