"""The job's configuration as one JSON document (config.json), and the namespace's ConfigMap of the
reference trainer and the progress helper; a worker finds all of them in /etc/trainingjob.

Environment variables carry the essentials, but a trainer (the reference trainer in particular)
wants the whole configuration, nested, in one place. config.json travels in the pod's own annotation
`ml.example.com/config` and the kubelet writes it into the mount (a downward API projection): a
ConfigMap per job was one more object to create, watch and delete for every job, and the
configuration is the one the pod was built from, as its environment is. The JSON is deterministic
(sorted keys, compact) so the same spec always gives the same annotation.

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
"""

from __future__ import annotations

import hashlib
import json
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

CONFIG_FIELDS = (
    "model",
    "dataset",
    "framework",
    "numWorkers",
    "gpusPerWorker",
    "hyperparameters",
    "checkpoint",
    "monitoring",
    "networking",
    "successPolicy",
)


def training_config(job: TrainingJob) -> dict[str, Any]:
    """The spec's training fields as the user wrote them (defaulted), and the job's name."""
    spec = job.spec_json
    config = {field: spec[field] for field in CONFIG_FIELDS if field in spec}
    config["name"] = job.name
    config.setdefault("hyperparameters", {})
    return config


def config_json(job: TrainingJob) -> str:
    """config.json's content: compact, as it is repeated in every pod (and every event about it)."""
    return json.dumps(training_config(job), sort_keys=True, separators=(",", ":"))


def build_trainer_sources(job: TrainingJob) -> dict[str, Any]:
    """The namespace's ConfigMap of the reference trainer and the progress helper."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": shared_meta(job, TRAINER_SOURCES_NAME),
        "data": dict(TRAINER_SOURCES),
    }
