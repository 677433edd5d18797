"""Structural CRD schemas generated from the API server's own OpenAPI: the core/v1 types the spec embeds.

spec.podTemplate, spec.scheduling.affinity and spec.env[].valueFrom carry core/v1 types
(PodTemplateSpec, Affinity, EnvVarSource). Written by hand they would drift from what the Pod API
accepts; left free-form (`x-kubernetes-preserve-unknown-fields`) they let a user store anything,
nested without bound, which the operator then has to decode. Kubernetes publishes the exact schema of
these types at /openapi/v3/api/v1. `generate` turns that document into the structural subset a
CustomResourceDefinition accepts:

- every `$ref` inlined (CRD schemas have no references); a recursive type is refused;
- IntOrString and Quantity become `x-kubernetes-int-or-string`, quantities with their grammar;
- only the keywords CRDs know are kept: strategic-merge extensions are dropped, list and map markers
  (`x-kubernetes-list-type`, `-list-map-keys`, `-map-type`) kept, every list given a list type;
- defaults are dropped (they are zero values that would fill required fields with ""), except the
  default of a list-map key that is not required, which the API server needs (a port's protocol);
- every string, list and map gets a bound (MAX_LENGTH, MAX_ITEMS, MAX_PROPERTIES), so no value is
  unbounded and CEL rules over them have a cost the API server can estimate; integers are at most
  Kubernetes' int32 maximum, like the rest of the spec's;
- fields the API marks deprecated, fields the operator leaves out (PRUNED) and object metadata beyond
  labels, annotations and owner references are pruned;
- descriptions are kept in full down to FULL_DESCRIPTION_DEPTH levels below each root (what
  `kubectl explain` users read) and cut to their first sentence below, to keep the CRD small.

The result is committed as crd/kube_schemas.json (`python -m crd kube-schemas`, crd/kube_fetch.py);
the schema modules read that file, never the network. A cluster test regenerates it from the served
document and compares.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from crd.openapi import INT32_MAX

Schema = dict[str, Any]

DEFINITIONS_PREFIX = "#/components/schemas/"
CORE = "io.k8s.api.core.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"

# The generated schemas, by the name the schema modules use.
ROOTS: Mapping[str, str] = {
    "PodTemplateSpec": CORE + "PodTemplateSpec",
    "Affinity": CORE + "Affinity",
    "EnvVarSource": CORE + "EnvVarSource",
}

# Fields left out of the generated schemas besides the deprecated ones. ephemeralContainers cannot be
# set when a pod is created; overhead is set by the RuntimeClass admission plugin.
PRUNED: Mapping[str, tuple[str, ...]] = {
    CORE + "PodSpec": ("ephemeralContainers", "overhead"),
}
# Object metadata inside a template: only what a template may carry (owner references stay so that
# a CEL rule can refuse them with a message).
KEPT_ONLY: Mapping[str, tuple[str, ...]] = {
    META + "ObjectMeta": ("labels", "annotations", "ownerReferences"),
}
DEPRECATED = re.compile(r"\bDeprecated[:.]")

FULL_DESCRIPTION_DEPTH = 3

# Kubernetes' resource.Quantity grammar without a sign (no quantity in a pod may be negative).
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
QUANTITY_MAX_LENGTH = 64
INT_OR_STRING_MAX_LENGTH = 253

# Bounds by "Definition.field" (definition without its package) or by field name; the first match wins.
DEFAULT_MAX_LENGTH = 4096
DEFAULT_MAX_ITEMS = 64
DEFAULT_MAX_PROPERTIES = 64
MAX_LENGTH: Mapping[str, int] = {
    "Container.name": 63,
    "Volume.name": 63,
    "VolumeMount.name": 63,
    "ContainerPort.name": 15,
    "EnvVar.name": 256,
    "EnvVar.value": 32768,
    "Container.command": 32768,
    "Container.args": 32768,
    "ExecAction.command": 32768,
    "VolumeMount.mountPath": 1024,
    "annotations": 32768,
    "labels": 63,
    "name": 253,
}
MAX_ITEMS: Mapping[str, int] = {
    "PodSpec.containers": 16,
    "PodSpec.initContainers": 16,
    "PodSpec.volumes": 64,
    "PodSpec.imagePullSecrets": 16,
    "Container.env": 200,
    "Container.envFrom": 32,
    "Container.ports": 32,
    "Container.volumeMounts": 64,
    "Container.command": 256,
    "Container.args": 256,
    "ExecAction.command": 256,
    "values": 256,
    "items": 256,
}
MAX_PROPERTIES: Mapping[str, int] = {
    "limits": 32,
    "requests": 32,
}

# What a CRD schema may carry of what the document has (value validations and the list/map markers).
KEPT_KEYWORDS = (
    "description",
    "type",
    "format",
    "enum",
    "required",
    "minimum",
    "maximum",
    "pattern",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
)
KEPT_FORMATS = ("int32", "int64", "double", "byte", "date-time")


class GenerationError(ValueError):
    """The document cannot be turned into a structural schema (a missing or recursive definition)."""


def generate(document: Mapping[str, Any], kubernetes_version: str) -> dict[str, Any]:
    """The committed crd/kube_schemas.json content generated from an /openapi/v3/api/v1 document."""
    definitions = document.get("components", {}).get("schemas")
    if not isinstance(definitions, Mapping):
        raise GenerationError("the document has no components.schemas: is it /openapi/v3/api/v1?")
    generator = _Generator(definitions)
    return {
        "generatedFrom": {"kubernetesVersion": kubernetes_version, "document": "/openapi/v3/api/v1"},
        "schemas": {name: generator.root(definition) for name, definition in ROOTS.items()},
    }


def _short_name(definition: str) -> str:
    return definition.rsplit(".", 1)[-1]


SENTENCE_END = re.compile(r"\.\s(?=[A-Z])")


def first_sentence(text: str) -> str:
    """The first sentence of a description (up to a '.' followed by a capital), whitespace collapsed."""
    flat = " ".join(text.split())
    end = SENTENCE_END.search(flat)
    return flat if end is None else flat[: end.start() + 1]


def _bound(table: Mapping[str, int], owner: str, field: str, default: int) -> int:
    return table.get(f"{owner}.{field}", table.get(field, default))


class _Generator:
    def __init__(self, definitions: Mapping[str, Any]) -> None:
        self._definitions = definitions

    def root(self, definition: str) -> Schema:
        return self._definition(definition, stack=(), depth=0)

    def _lookup(self, definition: str) -> Mapping[str, Any]:
        found = self._definitions.get(definition)
        if not isinstance(found, Mapping):
            raise GenerationError(f"definition {definition} not found in the document")
        return found

    def _definition(self, definition: str, *, stack: tuple[str, ...], depth: int) -> Schema:
        if definition in stack:
            cycle = " -> ".join(_short_name(name) for name in (*stack, definition))
            raise GenerationError(f"recursive type, which a CRD schema cannot express: {cycle}")
        source = self._lookup(definition)
        if definition == INT_OR_STRING:
            return _int_or_string(source)
        if definition == QUANTITY:
            return _quantity(source)
        return self._object(definition, source, stack=(*stack, definition), depth=depth)

    def _object(
        self, definition: str, source: Mapping[str, Any], *, stack: tuple[str, ...], depth: int
    ) -> Schema:
        node = _kept(source, depth)
        properties: dict[str, Any] = source.get("properties") or {}
        owner = _short_name(definition)
        if not properties:
            if node.get("type") == "string":
                node["maxLength"] = DEFAULT_MAX_LENGTH
            return node
        kept_only = KEPT_ONLY.get(definition)
        pruned = set(PRUNED.get(definition, ()))
        converted: Schema = {}
        for field, child in properties.items():
            if kept_only is not None and field not in kept_only:
                continue
            if field in pruned or DEPRECATED.search(str(child.get("description", ""))):
                continue
            converted[field] = self._property(child, owner=owner, field=field, stack=stack, depth=depth + 1)
        node["properties"] = converted
        required = [name for name in source.get("required", ()) if name in converted]
        if required:
            node["required"] = required
        else:
            node.pop("required", None)
        return node

    def _property(
        self, source: Mapping[str, Any], *, owner: str, field: str, stack: tuple[str, ...], depth: int
    ) -> Schema:
        """A property's schema: its own description over the one of the definition it refers to."""
        reference = _reference(source)
        if reference is None:
            node = self._inline(source, owner=owner, field=field, stack=stack, depth=depth)
        else:
            node = self._definition(reference, stack=stack, depth=depth)
        if "description" in source:
            node = {
                "description": _described(str(source["description"]), depth),
                **_without(node, "description"),
            }
        return node

    def _inline(
        self, source: Mapping[str, Any], *, owner: str, field: str, stack: tuple[str, ...], depth: int
    ) -> Schema:
        kind = source.get("type")
        if kind == "array":
            return self._array(source, owner=owner, field=field, stack=stack, depth=depth)
        if kind == "object" and "additionalProperties" in source:
            node = _kept(source, depth)
            node["maxProperties"] = _bound(MAX_PROPERTIES, owner, field, DEFAULT_MAX_PROPERTIES)
            node["additionalProperties"] = self._value(
                source["additionalProperties"], owner=owner, field=field, stack=stack, depth=depth
            )
            return node
        node = _kept(source, depth)
        if kind == "string" and "enum" not in node:
            node["maxLength"] = _bound(MAX_LENGTH, owner, field, DEFAULT_MAX_LENGTH)
        if kind == "integer":
            node.setdefault("maximum", INT32_MAX)
        return node

    def _value(
        self, source: Mapping[str, Any], *, owner: str, field: str, stack: tuple[str, ...], depth: int
    ) -> Schema:
        """The schema of a list item or map value, bounded like the field holding it."""
        reference = _reference(source)
        if reference is not None:
            return _without(self._definition(reference, stack=stack, depth=depth), "description")
        return self._inline(
            _without(source, "description"), owner=owner, field=field, stack=stack, depth=depth
        )

    def _array(
        self, source: Mapping[str, Any], *, owner: str, field: str, stack: tuple[str, ...], depth: int
    ) -> Schema:
        node = _kept(source, depth)
        node["maxItems"] = _bound(MAX_ITEMS, owner, field, DEFAULT_MAX_ITEMS)
        items = self._value(source["items"], owner=owner, field=field, stack=stack, depth=depth)
        node.setdefault("x-kubernetes-list-type", "atomic")
        if node["x-kubernetes-list-type"] == "map":
            _default_map_keys(items, node["x-kubernetes-list-map-keys"], self._item_source(source["items"]))
        node["items"] = items
        return node

    def _item_source(self, source: Mapping[str, Any]) -> Mapping[str, Any]:
        reference = _reference(source)
        return source if reference is None else self._lookup(reference)


def _reference(source: Mapping[str, Any]) -> str | None:
    """The definition a node refers to, directly or as the single member of an allOf."""
    target = source.get("$ref")
    if target is None:
        members = source.get("allOf")
        if isinstance(members, list) and len(members) == 1 and "$ref" in members[0]:
            target = members[0]["$ref"]
    if target is None:
        return None
    text = str(target)
    if not text.startswith(DEFINITIONS_PREFIX):
        raise GenerationError(f"unsupported reference {text}")
    return text.removeprefix(DEFINITIONS_PREFIX)


def _without(node: Mapping[str, Any], key: str) -> Schema:
    return {k: v for k, v in node.items() if k != key}


def _described(text: str, depth: int) -> str:
    return text if depth <= FULL_DESCRIPTION_DEPTH else first_sentence(text)


def _kept(source: Mapping[str, Any], depth: int) -> Schema:
    node: Schema = {}
    for keyword in KEPT_KEYWORDS:
        if keyword not in source:
            continue
        if keyword == "format" and source[keyword] not in KEPT_FORMATS:
            continue
        node[keyword] = copy.deepcopy(source[keyword])
    if "description" in node:
        node["description"] = _described(str(node["description"]), depth)
    return node


def _default_map_keys(items: Schema, keys: list[str], source: Mapping[str, Any]) -> None:
    """A list-map key must be required or defaulted: the document's default of an optional key is kept."""
    required = set(items.get("required", ()))
    for key in keys:
        if key in required:
            continue
        default = source.get("properties", {}).get(key, {}).get("default")
        if default is None:
            raise GenerationError(f"list-map key {key} is neither required nor defaulted")
        items["properties"][key]["default"] = default


def _int_or_string(source: Mapping[str, Any]) -> Schema:
    return {
        "description": first_sentence(str(source.get("description", ""))),
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "maxLength": INT_OR_STRING_MAX_LENGTH,
        "maximum": INT32_MAX,
    }


def _quantity(source: Mapping[str, Any]) -> Schema:
    """A quantity is an integer or a string of Kubernetes' grammar (CRDs have no number-or-string)."""
    return {
        **_int_or_string(source),
        "pattern": QUANTITY_PATTERN,
        "maxLength": QUANTITY_MAX_LENGTH,
        "minimum": 0,
    }
