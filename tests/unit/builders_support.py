"""What tests/unit/test_builders.py and tests/unit/test_builders_pods.py share: TrainingJobs as the API
server stores them (defaulted) and the example manifests.
"""

from __future__ import annotations

import copy
from typing import Any

from crd.defaults import with_defaults
from tests.unit import crd_cases
from tests.unit.crd_cases import job

STORAGE = "spec.checkpoint.storage"


def materialize(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest as the controller sees it: stored (namespace, uid, generation) and defaulted."""
    stored = copy.deepcopy(manifest)
    stored["metadata"].update({"namespace": "ml-training", "uid": "0f6b6c2e-uid", "generation": 3})
    return with_defaults(stored)


def defaulted(changes: dict[str, Any] | None = None, *, name: str = "case-job") -> dict[str, Any]:
    return materialize(job(changes, name=name))


EXAMPLES = crd_cases.example_manifests()
