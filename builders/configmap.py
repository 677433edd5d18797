"""The job's ConfigMap: the training configuration as one JSON document, mounted into every worker.

Environment variables carry the essentials, but a trainer (the reference trainer in particular)
wants the whole configuration, nested, in one place. The JSON is deterministic (sorted keys) so an
unchanged job never produces a different ConfigMap and the controller can skip the update.
"""

from __future__ import annotations

import json
from typing import Any

from builders.meta import object_meta
from builders.names import config_map_name, job_name
from crd import contract

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


def training_config(job: dict[str, Any]) -> dict[str, Any]:
    spec = job["spec"]
    config = {field: spec[field] for field in CONFIG_FIELDS if field in spec}
    config["name"] = job_name(job)
    config.setdefault("hyperparameters", {})
    return config


def config_json(job: dict[str, Any]) -> str:
    return json.dumps(training_config(job), sort_keys=True, indent=2) + "\n"


def build_config_map(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(job, config_map_name(job)),
        "data": {contract.CONFIG_FILE: config_json(job)},
    }
