"""The namespace's ConfigMap of the reference trainer and the progress helper; a worker finds them in
/etc/trainingjob.

The default command runs /etc/trainingjob/train.py, which imports its parts (trainer_*.py) and the
progress helper (trainingjob_progress*.py) from its own directory; all of them travel in a
ConfigMap so any image with a Python interpreter can run a job, and custom training code can import
the helper from the same place. They are the same for every job, so one ConfigMap per namespace holds
them (builders/shared.py), named after a hash of their content: an
operator with other sources makes another, and a running pod's files never change. Their single
source is the repository's top-level trainer/ folder (a workload, not part of the operator's code).
`pip install .` installs it next to builders/ (setup.cfg), where it also sits in the repository, and
it is read from there once at import: a missing file stops the operator at start-up instead of
failing every job. The folder has no __init__.py: the files are payload for the pods, and they import
each other as top-level modules, as they do from the mount. (importlib.resources cannot serve it: an
editable install adds a path entry to a namespace package that importlib.resources refuses.)

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

PROGRESS_HELPER_FILE: Final = "trainingjob_progress.py"
TRAINER_DIR: Final = Path(__file__).resolve().parent.parent / "trainer"
# Every file of trainer/, by its path under the folder, which is its path under the mount: the entry
# point, the modules it imports, and the progress helper with the modules it imports.
# tests/unit/test_trainer_files.py checks that this names every file of the folder.
TRAINER_FILES: Final = (
    contract.TRAINER_FILE,
    "trainer_checkpoints.py",
    "trainer_config.py",
    "trainer_engines.py",
    "trainer_launch.py",
    "trainer_loop.py",
    "trainer_torch.py",
    PROGRESS_HELPER_FILE,
    "trainingjob_progress_base.py",
    "trainingjob_progress_checkpoints.py",
    "trainingjob_progress_report.py",
    "trainingjob_progress_sender.py",
    "trainingjob_progress_stop.py",
    "trainingjob_progress_transport.py",
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
