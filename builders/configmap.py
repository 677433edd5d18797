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
# Every file of trainer/, each a flat key of the ConfigMap (keys cannot hold "/"): the entry point, the
# modules it imports from its own directory, and the progress helper with the modules it imports.
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


def _read_trainer_files() -> dict[str, str]:
    return {name: (TRAINER_DIR / name).read_text(encoding="utf-8") for name in TRAINER_FILES}


TRAINER_SOURCES: Final = _read_trainer_files()


def _content_hash(files: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return digest.hexdigest()[:10]


TRAINER_SOURCES_NAME: Final = contract.TRAINER_SOURCES_PREFIX + _content_hash(TRAINER_SOURCES)


def build_trainer_sources(job: TrainingJob) -> dict[str, Any]:
    """The namespace's ConfigMap of the reference trainer and the progress helper."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": shared_meta(job, TRAINER_SOURCES_NAME),
        "data": dict(TRAINER_SOURCES),
    }
