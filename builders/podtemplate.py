"""Merge spec.podTemplate onto a worker pod, with the semantics of a strategic merge patch.

Users know pod templates from Deployments, Jobs and Kubeflow's PyTorchJob, and they know how
`kubectl patch` and kustomize combine two pods: maps are merged key by key, lists of named things
are merged item by item (the patch's items update the ones with the same key, new ones are appended in
the patch's order), other lists and all scalars are replaced by the patch. `merge_pod_template` applies
the template to the pod the operator built in exactly that way, the template playing the patch.

What the operator owns is never taken from the template, even if admission did not refuse it (the
CEL rules of crd/schema_podtemplate.py do): pod fields such as restartPolicy, hostname, the service
account and scheduling; its labels and annotations; its volumes, and the trainer's name, image,
command, arguments, reserved environment variables, ports, mounts and GPU count. The template's values
for those are dropped before merging, so the result is a pod the controller can still reason about.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from builders.env import is_reserved
from crd import contract
from crd.schema_podtemplate import OWNED_POD_FIELDS, OWNED_TRAINER_FIELDS

JsonDict = dict[str, Any]

# Merge keys of the lists a strategic merge patch merges item by item (Kubernetes' patchMergeKey of
# each field); every other list is replaced. Container fields apply to containers and initContainers.
POD_LIST_KEYS: Mapping[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "topologySpreadConstraints": "topologyKey",
}
CONTAINER_LIST_KEYS: Mapping[str, str] = {
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
}
TEMPLATE_METADATA = ("labels", "annotations")


def merge_maps(base: Mapping[str, Any], patch: Mapping[str, Any]) -> JsonDict:
    """`base` with `patch` merged in: nested maps merged, everything else taken from `patch`."""
    merged = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_maps(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


ItemMerge = Callable[[Mapping[str, Any], Mapping[str, Any]], JsonDict]


def merge_keyed(
    base: list[JsonDict], patch: list[JsonDict], key: str, merge_item: ItemMerge = merge_maps
) -> list[JsonDict]:
    """Items of `patch` merged into the `base` items with the same `key`, the others appended in order."""
    merged = [copy.deepcopy(item) for item in base]
    position = {item.get(key): index for index, item in enumerate(merged)}
    for item in patch:
        index = position.get(item.get(key))
        if index is None:
            position[item.get(key)] = len(merged)
            merged.append(copy.deepcopy(item))
        else:
            merged[index] = merge_item(merged[index], item)
    return merged


def _merge_object(
    base: Mapping[str, Any],
    patch: Mapping[str, Any],
    list_keys: Mapping[str, str],
    item_merges: Mapping[str, ItemMerge] | None = None,
) -> JsonDict:
    """`merge_maps`, except that the lists of `list_keys` are merged item by item by their key."""
    merged = merge_maps(base, {key: value for key, value in patch.items() if key not in list_keys})
    for field, key in list_keys.items():
        if patch.get(field):
            item_merge = (item_merges or {}).get(field, merge_maps)
            merged[field] = merge_keyed(list(base.get(field) or []), list(patch[field]), key, item_merge)
    return merged


def merge_container(base: Mapping[str, Any], patch: Mapping[str, Any]) -> JsonDict:
    """A container with another merged onto it (env, ports, volumeMounts, volumeDevices by their keys)."""
    return _merge_object(base, patch, CONTAINER_LIST_KEYS)


def merge_pod_spec(base: Mapping[str, Any], patch: Mapping[str, Any]) -> JsonDict:
    containers = {"containers": merge_container, "initContainers": merge_container}
    return _merge_object(base, patch, POD_LIST_KEYS, containers)


# ------------------------------------------------------------------------------- what the operator owns


def _operator_key(key: str, exact: tuple[str, ...]) -> bool:
    return key in exact or key.startswith(contract.OPERATOR_KEY_PREFIX)


def _metadata_not_owned(metadata: Mapping[str, Any]) -> JsonDict:
    owned = {"labels": contract.OPERATOR_LABELS, "annotations": contract.OPERATOR_ANNOTATIONS}
    return {
        field: {k: v for k, v in (metadata.get(field) or {}).items() if not _operator_key(k, owned[field])}
        for field in TEMPLATE_METADATA
        if field in metadata
    }


def _keys(items: list[JsonDict] | None, key: str) -> set[Any]:
    return {item.get(key) for item in items or []}


def _trainer_not_owned(patch: Mapping[str, Any], trainer: Mapping[str, Any]) -> JsonDict:
    """The template's trainer entry without what the operator sets: its image, command and arguments,
    reserved variables, the operator's ports (by name or number), mounts and GPU count."""
    result = {k: copy.deepcopy(v) for k, v in patch.items() if k not in OWNED_TRAINER_FIELDS}
    if "env" in result:
        result["env"] = [entry for entry in result["env"] if not is_reserved(str(entry.get("name")))]
    if "ports" in result:
        numbers = _keys(trainer.get("ports"), "containerPort")
        names = _keys(trainer.get("ports"), "name") | set(contract.OPERATOR_PORT_NAMES)
        result["ports"] = [
            port
            for port in result["ports"]
            if port.get("containerPort") not in numbers and port.get("name") not in names
        ]
    if "volumeMounts" in result:
        paths = _keys(trainer.get("volumeMounts"), "mountPath")
        result["volumeMounts"] = [m for m in result["volumeMounts"] if m.get("mountPath") not in paths]
    for kind in ("limits", "requests"):
        amounts = result.get("resources", {}).get(kind)
        if isinstance(amounts, dict):
            amounts.pop(contract.GPU_RESOURCE, None)
    return result


def _spec_not_owned(spec: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> JsonDict:
    result = {k: copy.deepcopy(v) for k, v in spec.items() if k not in OWNED_POD_FIELDS}
    operator_volumes = _keys(pod_spec.get("volumes"), "name") | set(contract.OPERATOR_VOLUMES)
    if "volumes" in result:
        result["volumes"] = [v for v in result["volumes"] if v.get("name") not in operator_volumes]
    if "initContainers" in result:
        result["initContainers"] = [
            c for c in result["initContainers"] if c.get("name") != contract.CONTAINER_NAME
        ]
    if "containers" in result:
        trainer: Mapping[str, Any] = next(
            (c for c in pod_spec.get("containers") or [] if c.get("name") == contract.CONTAINER_NAME), {}
        )
        result["containers"] = [
            _trainer_not_owned(c, trainer) if c.get("name") == contract.CONTAINER_NAME else c
            for c in result["containers"]
        ]
    return result


def merge_pod_template(pod: Mapping[str, Any], template: Mapping[str, Any] | None) -> JsonDict:
    """`pod` (as the operator built it) with spec.podTemplate merged onto it; `pod` is left untouched."""
    if not template:
        return dict(pod)
    merged = copy.deepcopy(dict(pod))
    metadata = _metadata_not_owned(template.get("metadata") or {})
    if metadata:
        merged["metadata"] = merge_maps(merged["metadata"], metadata)
    spec = _spec_not_owned(template.get("spec") or {}, merged["spec"])
    if spec:
        merged["spec"] = merge_pod_spec(merged["spec"], spec)
    return merged
