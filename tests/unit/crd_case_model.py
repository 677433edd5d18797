"""The building blocks of the admission test tables: a minimal valid TrainingJob, dotted-path changes to
it, and the record of a manifest the API server must refuse (tests/unit/crd_cases.py explains the
layers)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

from crd import contract

Layer = Literal["schema", "list", "unknown-field", "cel", "transition"]


def base_job(name: str = "case-job") -> dict[str, Any]:
    """A minimal valid TrainingJob."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": {"model": "cnn", "dataset": "mnist", "numWorkers": 2, "gpusPerWorker": 1},
    }


def _set(manifest: dict[str, Any], path: str, value: Any) -> None:
    node = manifest
    *parents, last = path.split(".")
    for name in parents:
        node = node.setdefault(name, {})
    if value is DELETE:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(value)


DELETE = object()


def job(changes: dict[str, Any] | None = None, *, name: str = "case-job") -> dict[str, Any]:
    """base_job with dotted-path changes applied, e.g. {"spec.checkpoint.enabled": True}."""
    manifest = base_job(name)
    for path, value in (changes or {}).items():
        _set(manifest, path, value)
    return manifest


@dataclass(frozen=True)
class InvalidCase:
    id: str
    manifest: dict[str, Any]
    field: str
    layer: Layer
    before: dict[str, Any] | None = None


def case(id_: str, changes: dict[str, Any], path: str, layer: Layer) -> InvalidCase:
    return InvalidCase(id_, job(changes), path, layer)


def transition(id_: str, before: dict[str, Any], after: dict[str, Any], path: str) -> InvalidCase:
    return InvalidCase(id_, job(after), path, "transition", before=job(before))
