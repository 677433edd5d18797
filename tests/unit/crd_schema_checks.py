"""An offline approximation of the API server's OpenAPI checks (no CEL), for the CRD's unit tests
(tests/unit/test_crd.py, tests/unit/test_crd_admission.py): where a manifest fails the schema, its
undeclared fields and duplicate list items, and the schema's nodes and rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]

from crd.defaults import apply_schema_defaults
from crd.openapi import Schema
from crd.render import rules
from crd.schema import open_api_schema

ROOT = open_api_schema()


SPEC = ROOT["properties"]["spec"]


def _path_text(parts: Any) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def schema_error_paths(manifest: dict[str, Any]) -> list[str]:
    """Paths of OpenAPI errors in a manifest, after schema defaulting (as the API server validates)."""
    defaulted = apply_schema_defaults(manifest, ROOT)
    paths = []
    for error in jsonschema.Draft4Validator(ROOT).iter_errors(defaulted):
        parts = list(error.absolute_path)
        if error.validator == "required":
            parts += [name for name in error.validator_value if name not in error.instance][:1]
        paths.append(_path_text(parts))
    return paths


def unknown_field_paths(value: Any, schema: Schema, path: str = "") -> Iterator[str]:
    if isinstance(value, dict) and schema.get("type") == "object":
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for name, item in value.items():
            child = f"{path}.{name}" if path else name
            if properties is not None and name in properties:
                yield from unknown_field_paths(item, properties[name], child)
            elif isinstance(additional, dict):
                yield from unknown_field_paths(item, additional, child)
            elif properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                yield child
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from unknown_field_paths(item, schema["items"], f"{path}[{i}]")


def duplicate_item_paths(value: Any, schema: Schema, path: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name, item in value.items():
            if name in properties:
                yield from duplicate_item_paths(item, properties[name], f"{path}.{name}" if path else name)
    elif isinstance(value, list):
        list_type = schema.get("x-kubernetes-list-type")
        keys = schema.get("x-kubernetes-list-map-keys", [])
        seen: list[Any] = []
        for i, item in enumerate(value):
            identity = [item.get(k) for k in keys] if list_type == "map" else item
            if list_type in ("set", "map") and identity in seen:
                yield f"{path}[{i}]"
            seen.append(identity)


def schema_at(path: str) -> Schema | None:
    """The schema node of an error path such as spec.env[0].name, or None if the schema has no such field."""
    node: Schema | None = ROOT
    for part in re.sub(r"\[\d*\]", ".[]", path).split("."):
        if node is None:
            return None
        if part == "[]":
            node = node.get("items")
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    return node


def all_nodes(node: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from all_nodes(child, f"{path}.{name}" if path else name)
    if isinstance(node.get("items"), dict):
        yield from all_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from all_nodes(node["additionalProperties"], f"{path}{{}}")


def all_rules() -> list[tuple[str, dict[str, str]]]:
    return list(rules(ROOT, ""))
