"""Small constructors for structural OpenAPI v3 schema nodes as used by CustomResourceDefinitions.

The TrainingJob schema has well over a hundred fields; writing each node as a literal dict invites
typos in extension names and descriptions that forget to mention a default or a bound. These helpers
build every node the same way and append the default, bounds and allowed values to the description
from the very values the node carries, so `kubectl explain` and docs/api.md state them without any
chance of drifting from what the API server enforces.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

Schema: TypeAlias = dict[str, Any]
Rule: TypeAlias = dict[str, str]

# The largest value an integer field takes unless it says otherwise (format int64): Kubernetes' own
# duration and count fields are int32, and every number the operator computes with stays far from
# what its time arithmetic can represent.
INT32_MAX = 2**31 - 1

# Bounds the CEL cost of rules that parse quantities (the API server sizes int-or-string by maxLength).
QUANTITY_MAX_LENGTH = 64

# Kubernetes' resource.Quantity grammar without a sign (negative resources are never valid).
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)


def rule(
    expression: str,
    *,
    message: str | None = None,
    message_expression: str | None = None,
    field_path: str | None = None,
    reason: str | None = None,
) -> Rule:
    """One `x-kubernetes-validations` entry (a CEL rule)."""
    entry: Rule = {"rule": expression}
    if message is not None:
        entry["message"] = message
    if message_expression is not None:
        entry["messageExpression"] = message_expression
    if field_path is not None:
        entry["fieldPath"] = field_path
    if reason is not None:
        entry["reason"] = reason
    return entry


def _fmt(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _annotated(description: str, node: Schema) -> Schema:
    notes: list[str] = []
    if "enum" in node:
        notes.append("One of: " + ", ".join(_fmt(v) for v in node["enum"]) + ".")
    if "minimum" in node:
        relation = "greater than" if node.get("exclusiveMinimum") else "at least"
        notes.append(f"Must be {relation} {_fmt(node['minimum'])}.")
    if "maximum" in node:
        notes.append(f"At most {_fmt(node['maximum'])}.")
    if "default" in node and node["default"] != {}:
        notes.append(f"Default: {_fmt(node['default'])}.")
    text = " ".join([description.strip(), *notes])
    return {"description": text, **node}


def _finish(node: Schema, description: str, rules: Sequence[Rule]) -> Schema:
    annotated = _annotated(description, node)
    if rules:
        annotated["x-kubernetes-validations"] = list(rules)
    return annotated


def string(
    description: str,
    *,
    max_length: int,
    min_length: int | None = None,
    pattern: str | None = None,
    enum: Sequence[str] | None = None,
    default: str | None = None,
    fmt: str | None = None,
    rules: Sequence[Rule] = (),
) -> Schema:
    node: Schema = {"type": "string"}
    if fmt is not None:
        node["format"] = fmt
    if enum is not None:
        node["enum"] = list(enum)
    if min_length is not None:
        node["minLength"] = min_length
    node["maxLength"] = max_length
    if pattern is not None:
        node["pattern"] = pattern
    if default is not None:
        node["default"] = default
    return _finish(node, description, rules)


def integer(
    description: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    default: int | None = None,
    fmt: Literal["int32", "int64"] | None = None,
    rules: Sequence[Rule] = (),
) -> Schema:
    node: Schema = {"type": "integer"}
    if fmt is not None:
        node["format"] = fmt
    if minimum is not None:
        node["minimum"] = minimum
    if maximum is None and fmt != "int64":
        maximum = INT32_MAX
    if maximum is not None:
        node["maximum"] = maximum
    if default is not None:
        node["default"] = default
    return _finish(node, description, rules)


def number(
    description: str,
    *,
    minimum: float | None = None,
    exclusive_minimum: bool = False,
    maximum: float | None = None,
    default: float | None = None,
) -> Schema:
    node: Schema = {"type": "number"}
    if minimum is not None:
        node["minimum"] = minimum
        if exclusive_minimum:
            node["exclusiveMinimum"] = True
    if maximum is not None:
        node["maximum"] = maximum
    if default is not None:
        node["default"] = default
    return _finish(node, description, ())


def boolean(description: str, *, default: bool | None = None) -> Schema:
    node: Schema = {"type": "boolean"}
    if default is not None:
        node["default"] = default
    return _finish(node, description, ())


def obj(
    description: str,
    properties: Mapping[str, Schema],
    *,
    required: Iterable[str] = (),
    default_empty: bool = False,
    preserve_unknown_fields: bool | None = None,
    rules: Sequence[Rule] = (),
) -> Schema:
    """An object with declared properties. `default_empty` makes the API server default it to `{}`,
    which in turn applies the defaults of its properties."""
    node: Schema = {"type": "object"}
    required_list = list(required)
    if required_list:
        node["required"] = required_list
    node["properties"] = dict(properties)
    if default_empty:
        node["default"] = {}
    if preserve_unknown_fields is not None:
        node["x-kubernetes-preserve-unknown-fields"] = preserve_unknown_fields
    return _finish(node, description, rules)


def free_form(description: str) -> Schema:
    """An object the API server stores as given (validated by the operator or by Pod admission)."""
    return _finish({"type": "object", "x-kubernetes-preserve-unknown-fields": True}, description, ())


def string_map(
    description: str,
    *,
    max_properties: int,
    value_max_length: int,
    rules: Sequence[Rule] = (),
) -> Schema:
    node: Schema = {
        "type": "object",
        "maxProperties": max_properties,
        "additionalProperties": {"type": "string", "maxLength": value_max_length},
    }
    return _finish(node, description, rules)


def map_of(description: str, values: Schema, *, max_properties: int, rules: Sequence[Rule] = ()) -> Schema:
    node: Schema = {"type": "object", "maxProperties": max_properties, "additionalProperties": values}
    return _finish(node, description, rules)


def array(
    description: str,
    items: Schema,
    *,
    max_items: int,
    list_type: Literal["atomic", "set", "map"] = "atomic",
    map_keys: Sequence[str] = (),
    default: list[Any] | None = None,
    rules: Sequence[Rule] = (),
) -> Schema:
    node: Schema = {
        "type": "array",
        "maxItems": max_items,
        "items": items,
        "x-kubernetes-list-type": list_type,
    }
    if list_type == "map":
        node["x-kubernetes-list-map-keys"] = list(map_keys)
    if default is not None:
        node["default"] = default
    return _finish(node, description, rules)


def quantity(description: str, *, default: str | None = None) -> Schema:
    """A Kubernetes resource quantity: an integer or a string such as "500m", "32Gi", "4"."""
    node: Schema = {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
        "pattern": QUANTITY_PATTERN,
        "maxLength": QUANTITY_MAX_LENGTH,
        "minimum": 0,
    }
    if default is not None:
        node["default"] = default
    return _finish(node, description, ())


def quantity_map(description: str, *, max_properties: int) -> Schema:
    return map_of(
        description,
        quantity('A resource quantity, e.g. 8, "500m", "32Gi".'),
        max_properties=max_properties,
    )
