"""The namespace's ConfigMap of the reference trainer and the progress helper; a worker finds them in
/etc/trainingjob.

The default command runs /etc/trainingjob/train.py, a small entry script that runs the reference
trainer's package (reference_trainer/), which imports the progress helper's (trainingjob_progress/);
all of them travel in a ConfigMap so any image with a Python interpreter can run a job, and custom
training code can import the helper from the same place. A ConfigMap's keys cannot hold "/", so each
file's key is its path with "." for "/" (trainingjob_progress.base.py), and the pod's volume lists every
key with its path (items), which puts the files back in their folders: the mount holds the same tree
as trainer/. They are the same for every job, so one ConfigMap per namespace holds them
(builders/shared.py), named after a hash of their paths and content: an operator with other sources
makes another, and a running pod's files never change. Their single source is the repository's
top-level trainer/ folder (a workload, not part of the operator's code). `pip install .` installs it
next to builders/ (setup.cfg), where it also sits in the repository, and it is read from there once at
import: a missing file stops the operator at start-up instead of failing every job. The folder itself
has no __init__.py: it is the mount's tree, whose top-level packages a pod imports with the mount on
its path. (importlib.resources cannot serve it: an editable install adds a path entry to a namespace
package that importlib.resources refuses.)

The job's configuration reaches a worker through its environment only (builders/env.py,
docs/env.md): a config.json that repeated it in every pod's annotations was a sixth of the pod as
stored, paid for on every write and watch event of it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Final

from builders.meta import shared_meta
from crd import contract
from crd.spec import TrainingJob

TRAINER_DIR: Final = Path(__file__).resolve().parent.parent / "trainer"
# The progress helper's package, what users import (`import trainingjob_progress as tp`).
PROGRESS_HELPER_FILE: Final = "trainingjob_progress/__init__.py"
# Every file of trainer/, by its path under the folder, which is its path under the mount: the entry
# script the default command runs, the reference trainer's package it runs, and the progress helper's.
# tests/unit/test_trainer_files.py checks that this names every file of the folder.
TRAINER_FILES: Final = (
    contract.TRAINER_FILE,
    "reference_trainer/__init__.py",
    "reference_trainer/checkpoints.py",
    "reference_trainer/config.py",
    "reference_trainer/engines.py",
    "reference_trainer/launch.py",
    "reference_trainer/loop.py",
    "reference_trainer/main.py",
    "reference_trainer/torch_engine.py",
    "reference_trainer/tracking.py",
    "reference_trainer/wandb_run.py",
    PROGRESS_HELPER_FILE,
    "trainingjob_progress/base.py",
    "trainingjob_progress/checkpoints.py",
    "trainingjob_progress/peers.py",
    "trainingjob_progress/report.py",
    "trainingjob_progress/sender.py",
    "trainingjob_progress/stop.py",
    "trainingjob_progress/supervise.py",
    "trainingjob_progress/supervision.py",
    "trainingjob_progress/transport.py",
    "trainingjob_progress/watch.py",
)
# The API server refuses ConfigMaps over 1 MiB; the trainer files take a few dozen KiB of it.
MAX_CONFIG_MAP_BYTES: Final = 1024 * 1024


def config_map_key(path: str) -> str:
    """A file's key in the ConfigMap: its path with "." for "/" (a key cannot hold "/"; no folder of
    trainer/ has a "." in its name, so two paths never share a key)."""
    return path.replace("/", ".")


def _read_trainer_files() -> dict[str, str]:
    return {path: (TRAINER_DIR / path).read_text(encoding="utf-8") for path in TRAINER_FILES}


# The files' text by path, and the ConfigMap's data: the same text by key.
TRAINER_TEXTS: Final = _read_trainer_files()
TRAINER_SOURCES: Final = {config_map_key(path): text for path, text in TRAINER_TEXTS.items()}


def _content_hash(texts: dict[str, str]) -> str:
    """Of every path, its key and its text: a pod's volume depends on all three."""
    digest = hashlib.sha256()
    for path in sorted(texts):
        for part in (config_map_key(path), path, texts[path]):
            digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:10]


TRAINER_SOURCES_NAME: Final = contract.TRAINER_SOURCES_PREFIX + _content_hash(TRAINER_TEXTS)


def trainer_sources_projection() -> dict[str, Any]:
    """The pod's configMap volume source: every key back at its file's path, so the mount reproduces the
    tree of trainer/ (a key left out of `items` would not be mounted at all)."""
    return {
        "name": TRAINER_SOURCES_NAME,
        "items": [{"key": config_map_key(path), "path": path} for path in TRAINER_FILES],
    }


def build_trainer_sources(job: TrainingJob) -> dict[str, Any]:
    """The namespace's ConfigMap of the reference trainer and the progress helper."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": shared_meta(job, TRAINER_SOURCES_NAME),
        "data": dict(TRAINER_SOURCES),
    }
