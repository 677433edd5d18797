"""Fill in a TrainingJob's defaults exactly as the API server would, plus the operator's own defaults.

The controller reads TrainingJobs from its cache, where the API server has already applied the schema's
defaults, but tests, the docs and objects written by older CRD versions may lack them. Builders
therefore always start from `with_defaults(job)` and can rely on every defaulted field being present.

Schema defaults are read from crd/schema.py (never restated here) and applied like the API server's
structural defaulting: a missing (or null, non-nullable) property with a `default` gets a copy of it,
then defaulting recurses into every present object, array item and map value, including objects that
were just defaulted to `{}`.

Operator defaults are those the schema cannot state because they depend on other fields:
- spec.image: the framework's default image (crd.contract.DEFAULT_IMAGES);
- spec.command: the reference trainer (crd.contract.DEFAULT_COMMAND), under torchrun for an elastic job
  (crd.contract.ELASTIC_DEFAULT_COMMAND);
- spec.networking.backend: nccl with GPUs, gloo without;
- spec.checkpoint.storage.pvc.create: `{}` (then its schema defaults: size, accessModes) when checkpoint
  storage is in use with type pvc and no existing claim is named, so the operator creates the claim;
- spec.monitoring.mlflowExperiment: the job's name when an MLflow tracking URI is set.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from crd import contract
from crd.openapi import Schema
from crd.schema import custom_resource_definition, open_api_schema_of


@cache
def _root_schema() -> Schema:
    return open_api_schema_of(custom_resource_definition())


def subschema(*path: str) -> Schema:
    """The schema node of a property path under the root, e.g. subschema("spec", "checkpoint")."""
    node = _root_schema()
    for name in path:
        node = node["properties"][name]
    return node


def apply_schema_defaults(value: Any, schema: Schema) -> Any:
    """A copy of `value` with the defaults of `schema` applied (API server structural defaulting)."""
    if isinstance(value, dict):
        return _default_object(value, schema)
    if isinstance(value, list):
        items = schema.get("items")
        if items is None:
            return copy.deepcopy(value)
        return [apply_schema_defaults(item, items) for item in value]
    return copy.deepcopy(value)


def _default_object(value: dict[str, Any], schema: Schema) -> dict[str, Any]:
    properties: dict[str, Schema] = schema.get("properties", {})
    additional = schema.get("additionalProperties")
    value_schema = additional if isinstance(additional, dict) else None
    result: dict[str, Any] = {}
    for name, item in value.items():
        item_schema = properties.get(name, value_schema)
        if item is None and item_schema is not None and not item_schema.get("nullable", False):
            continue  # the API server drops nulls of non-nullable fields, then defaults them
        result[name] = (
            copy.deepcopy(item) if item_schema is None else apply_schema_defaults(item, item_schema)
        )
    for name, prop in properties.items():
        if name not in result and "default" in prop:
            result[name] = apply_schema_defaults(prop["default"], prop)
    return result


def with_defaults(job: dict[str, Any]) -> dict[str, Any]:
    """A new TrainingJob dict with schema and operator defaults applied; `job` is left untouched."""
    defaulted: dict[str, Any] = apply_schema_defaults(job, _root_schema())
    spec = defaulted.setdefault("spec", {})
    name = str(defaulted.get("metadata", {}).get("name", ""))
    _default_container(spec)
    _default_backend(spec)
    _default_checkpoint_claim(spec)
    _default_mlflow_experiment(spec, name)
    return defaulted


def _default_container(spec: dict[str, Any]) -> None:
    framework = spec.get("framework", "pytorch")
    spec.setdefault("image", contract.DEFAULT_IMAGES[framework])
    elastic = spec.get("elastic") is not None
    command = contract.ELASTIC_DEFAULT_COMMAND if elastic else contract.DEFAULT_COMMAND
    spec.setdefault("command", list(command))


def _default_backend(spec: dict[str, Any]) -> None:
    networking = spec.setdefault("networking", {})
    networking.setdefault("backend", "nccl" if spec.get("gpusPerWorker", 1) > 0 else "gloo")


def storage_in_use(spec: dict[str, Any]) -> bool:
    """Checkpoint storage is wired into the pods when checkpointing is on or a resume point is given."""
    checkpoint = spec.get("checkpoint", {})
    return bool(checkpoint.get("enabled")) or bool(checkpoint.get("resumeFrom"))


def _default_checkpoint_claim(spec: dict[str, Any]) -> None:
    if not storage_in_use(spec):
        return
    storage = spec.setdefault("checkpoint", {}).setdefault("storage", {})
    if storage.get("type", "pvc") != "pvc" or "pvcName" in storage:
        return
    pvc = storage.setdefault("pvc", {})
    if "claimName" in pvc or "create" in pvc:
        return
    pvc["create"] = apply_schema_defaults({}, subschema("spec", "checkpoint", "storage", "pvc", "create"))


def _default_mlflow_experiment(spec: dict[str, Any], name: str) -> None:
    monitoring = spec.get("monitoring", {})
    if monitoring.get("mlflowTrackingUri") and name:
        spec["monitoring"] = {**monitoring, "mlflowExperiment": monitoring.get("mlflowExperiment", name)}
