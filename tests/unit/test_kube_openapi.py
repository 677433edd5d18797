"""Unit tests of crd/kube_openapi.py (the structural schema generator) on small OpenAPI documents, and
of the committed crd/kube_schemas.json it produced: structural, bounded, nothing free-form.

That the committed file is what the generator makes of the served document is checked against the
real API server in tests/e2e/test_kube_schemas.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from crd import kube_openapi, kube_schemas
from crd.kube_openapi import CORE, INT_OR_STRING, QUANTITY, GenerationError, first_sentence, generate
from crd.openapi import INT32_MAX
from crd.schema import custom_resource_definition, open_api_schema
from tests.cluster import REPO

Schema = dict[str, Any]


def ref(name: str, **siblings: Any) -> Schema:
    return {"allOf": [{"$ref": f"#/components/schemas/{name}"}], **siblings}


def document(definitions: dict[str, Schema]) -> dict[str, Any]:
    """A minimal /openapi/v3/api/v1 document whose roots (PodTemplateSpec, Affinity, EnvVarSource) are
    trivial unless `definitions` replaces them."""
    roots = {definition: {"type": "object", "properties": {}} for definition in kube_openapi.ROOTS.values()}
    return {"components": {"schemas": {**roots, **definitions}}}


def generated(definitions: dict[str, Schema], root: str = "PodTemplateSpec") -> Schema:
    result: Schema = generate(document(definitions), "v1.34.4")["schemas"][root]
    return result


POD_TEMPLATE = CORE + "PodTemplateSpec"


def test_references_are_inlined_with_the_referring_description() -> None:
    schema = generated(
        {
            POD_TEMPLATE: {
                "type": "object",
                "properties": {"spec": ref(CORE + "PodSpec", description="The pod.", default={})},
            },
            CORE + "PodSpec": {
                "description": "PodSpec is a description of a pod.",
                "type": "object",
                "required": ["containers"],
                "properties": {"hostIPC": {"type": "boolean", "description": "Use the host's IPC."}},
            },
        }
    )
    spec = schema["properties"]["spec"]
    assert spec == {
        "description": "The pod.",
        "type": "object",
        "properties": {"hostIPC": {"description": "Use the host's IPC.", "type": "boolean"}},
    }


def test_int_or_string_and_quantity() -> None:
    schema = generated(
        {
            POD_TEMPLATE: {
                "type": "object",
                "properties": {
                    "port": ref(INT_OR_STRING, description="A port."),
                    "size": {"$ref": f"#/components/schemas/{QUANTITY}"},
                },
            },
            INT_OR_STRING: {"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]},
            QUANTITY: {"description": "Quantity is a number. More text.", "oneOf": [{"type": "string"}]},
        }
    )
    port, size = schema["properties"]["port"], schema["properties"]["size"]
    assert port["x-kubernetes-int-or-string"] is True
    assert port["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert port["description"] == "A port."
    assert "type" not in port
    assert "format" not in port
    assert size["pattern"] == kube_openapi.QUANTITY_PATTERN
    assert (size["minimum"], size["maxLength"]) == (0, kube_openapi.QUANTITY_MAX_LENGTH)
    assert size["description"] == "Quantity is a number."


def test_lists_get_a_type_and_bounds_and_map_keys_keep_their_default() -> None:
    schema = generated(
        {
            POD_TEMPLATE: {
                "type": "object",
                "properties": {
                    "args": {"type": "array", "items": {"type": "string", "default": ""}},
                    "ports": {
                        "type": "array",
                        "items": ref(CORE + "ContainerPort", default={}),
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
                        "x-kubernetes-patch-merge-key": "containerPort",
                        "x-kubernetes-patch-strategy": "merge",
                    },
                },
            },
            CORE + "ContainerPort": {
                "type": "object",
                "required": ["containerPort"],
                "properties": {
                    "containerPort": {"type": "integer", "format": "int32", "default": 0},
                    "protocol": {"type": "string", "default": "TCP"},
                },
            },
        }
    )
    args, ports = schema["properties"]["args"], schema["properties"]["ports"]
    assert args == {
        "type": "array",
        "x-kubernetes-list-type": "atomic",
        "maxItems": kube_openapi.DEFAULT_MAX_ITEMS,
        "items": {"type": "string", "maxLength": kube_openapi.DEFAULT_MAX_LENGTH},
    }
    assert "x-kubernetes-patch-merge-key" not in ports
    item = ports["items"]
    assert item["properties"]["protocol"] == {
        "type": "string",
        "maxLength": kube_openapi.DEFAULT_MAX_LENGTH,
        "default": "TCP",
    }
    assert "default" not in item["properties"]["containerPort"]  # required: its zero default is dropped
    assert "default" not in item


def test_bounds_by_definition_and_field() -> None:
    schema = generated(
        {
            POD_TEMPLATE: {"type": "object", "properties": {"c": ref(CORE + "Container")}},
            CORE + "Container": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "env": {"type": "array", "items": {"type": "object"}},
                    "limits": {"type": "object", "additionalProperties": {"type": "string"}},
                    "policy": {"type": "string", "enum": ["A", "B"]},
                },
            },
        }
    )
    fields = schema["properties"]["c"]["properties"]
    assert fields["name"]["maxLength"] == kube_openapi.MAX_LENGTH["Container.name"]
    assert fields["env"]["maxItems"] == kube_openapi.MAX_ITEMS["Container.env"]
    assert fields["limits"]["maxProperties"] == kube_openapi.MAX_PROPERTIES["limits"]
    assert fields["limits"]["additionalProperties"]["maxLength"] == kube_openapi.DEFAULT_MAX_LENGTH
    assert "maxLength" not in fields["policy"]


def test_deprecated_pruned_and_kept_only_fields_are_left_out() -> None:
    meta = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    schema = generated(
        {
            POD_TEMPLATE: {
                "type": "object",
                "properties": {"metadata": ref(meta), "spec": ref(CORE + "PodSpec")},
            },
            meta: {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
            CORE + "PodSpec": {
                "type": "object",
                "properties": {
                    "serviceAccount": {
                        "type": "string",
                        "description": "An alias. Deprecated: use the other.",
                    },
                    "ephemeralContainers": {"type": "array", "items": {"type": "string"}},
                    "hostPID": {"type": "boolean"},
                },
            },
        }
    )
    assert list(schema["properties"]["metadata"]["properties"]) == ["labels"]
    assert list(schema["properties"]["spec"]["properties"]) == ["hostPID"]


def test_descriptions_are_cut_below_the_full_depth() -> None:
    text = "First sentence. Second sentence."
    chain = {
        f"{CORE}L{i}": {"type": "object", "properties": {"next": ref(f"{CORE}L{i + 1}", description=text)}}
        for i in range(6)
    }
    chain[f"{CORE}L6"] = {"type": "object", "properties": {}}
    schema = generated(
        {
            **chain,
            POD_TEMPLATE: {"type": "object", "properties": {"next": ref(f"{CORE}L0", description=text)}},
        }
    )
    depth, node = 1, schema["properties"]["next"]
    while "next" in node.get("properties", {}):
        expected = text if depth <= kube_openapi.FULL_DESCRIPTION_DEPTH else "First sentence."
        assert node["description"] == expected, depth
        depth, node = depth + 1, node["properties"]["next"]
    assert depth > kube_openapi.FULL_DESCRIPTION_DEPTH + 1


def test_first_sentence() -> None:
    assert first_sentence("One. Two.") == "One."
    assert first_sentence("e.g.\nthis   one") == "e.g. this one"
    assert first_sentence("No end") == "No end"


@pytest.mark.parametrize(
    ("definitions", "message"),
    [
        (
            {
                POD_TEMPLATE: {"type": "object", "properties": {"a": ref(CORE + "A")}},
                CORE + "A": {"type": "object", "properties": {"b": ref(CORE + "A")}},
            },
            "recursive type, which a CRD schema cannot express: PodTemplateSpec -> A -> A",
        ),
        (
            {POD_TEMPLATE: {"type": "object", "properties": {"a": ref(CORE + "Missing")}}},
            "definition io.k8s.api.core.v1.Missing not found",
        ),
        (
            {POD_TEMPLATE: {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}},
            "unsupported reference other.json#/x",
        ),
        (
            {
                POD_TEMPLATE: {
                    "type": "object",
                    "properties": {
                        "l": {
                            "type": "array",
                            "items": {"type": "object", "properties": {"k": {"type": "string"}}},
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["k"],
                        }
                    },
                }
            },
            "list-map key k is neither required nor defaulted",
        ),
    ],
)
def test_documents_a_crd_cannot_express_are_refused(definitions: dict[str, Schema], message: str) -> None:
    with pytest.raises(GenerationError, match=message.replace(".", r"\.")):
        generated(definitions)


def test_a_document_without_definitions_is_refused() -> None:
    with pytest.raises(GenerationError, match=r"no components\.schemas"):
        generate({"paths": {}}, "v1")


# ----------------------------------------------------------------------------- the committed file


def nodes(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        yield path, node
        for key, child in node.items():
            if key not in ("enum", "default", "required", "x-kubernetes-list-map-keys"):
                yield from nodes(child, f"{path}/{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from nodes(child, f"{path}/{index}")


ALLOWED_KEYWORDS = {
    *kube_openapi.KEPT_KEYWORDS,
    "properties",
    "items",
    "additionalProperties",
    "maxLength",
    "maxItems",
    "maxProperties",
    "default",
    "anyOf",
    "x-kubernetes-int-or-string",
    "maximum",
    "minimum",
}


def schema_nodes(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from schema_nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from schema_nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from schema_nodes(schema["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("name", list(kube_openapi.ROOTS))
def test_committed_schemas_are_structural_and_bounded(name: str) -> None:
    for path, node in schema_nodes(kube_schemas.schema(name)):
        assert set(node) <= ALLOWED_KEYWORDS, (path, set(node) - ALLOWED_KEYWORDS)
        if node.get("x-kubernetes-int-or-string"):
            assert "maxLength" in node, path
            continue
        kind = node.get("type")
        assert kind in ("object", "array", "string", "integer", "number", "boolean"), path
        if kind == "string" and "enum" not in node:
            assert "maxLength" in node, path
        if kind == "integer":
            assert node["maximum"] == INT32_MAX, path
        if kind == "array":
            assert "maxItems" in node, path
            assert node["x-kubernetes-list-type"] in ("atomic", "set", "map"), path
        if "additionalProperties" in node:
            assert "maxProperties" in node, path


def test_committed_file_records_its_source() -> None:
    assert kube_schemas.generated_from() == {"kubernetesVersion": "v1.34.4", "document": "/openapi/v3/api/v1"}
    text = kube_schemas.SCHEMAS_FILE.read_text(encoding="utf-8")
    assert text == kube_schemas.render(json.loads(text))


def test_no_spec_field_is_free_form_and_nesting_is_bounded() -> None:
    spec = open_api_schema()["properties"]["spec"]
    depths = []
    for path, node in schema_nodes(spec, "spec"):
        assert not node.get("x-kubernetes-preserve-unknown-fields"), path
        if node.get("type") == "object":
            assert "properties" in node or "additionalProperties" in node, path
        depths.append(path.count(".") + path.count("[]") + path.count("{}"))
    assert max(depths) == MAX_SPEC_DEPTH


# The deepest field of the spec, in levels of objects, lists and maps below `spec` (docs/schema.md).
MAX_SPEC_DEPTH = 13


def test_the_crd_stays_well_below_the_api_servers_limits() -> None:
    size = len(json.dumps(custom_resource_definition(), separators=(",", ":")))
    # etcd refuses requests above 1.5 MiB; docs/schema.md states the size.
    assert size < 512 * 1024, size


def test_kube_schemas_command_reports_an_unreachable_cluster_in_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "crd", "kube-schemas", "--kubectl", "/nonexistent/kubectl"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "/nonexistent/kubectl not found" in result.stderr
