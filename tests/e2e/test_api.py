"""The API server, given the generated CRD, admits exactly the TrainingJobs the API promises.

No operator runs here: everything is decided at admission. Every invalid manifest of
tests/unit/crd_cases.py is refused by a plain `kubectl apply` (server-side validation, kubectl's
default strict field validation) with an error naming the offending field, nothing is stored, and
every immutable field refuses a change after the job exists. The valid manifests (the examples
among them) and the mutable-field updates are accepted. `kubectl explain` shows the schema's
descriptions and `kubectl get tj` the printer columns.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from crd import contract
from testbed import Kubectl, wait_for
from tests.cluster import REPO
from tests.e2e.jobs import PatientKubectl
from tests.unit.crd_cases import InvalidCase, invalid_cases, job, valid_manifests, valid_updates

CRD_FILE = REPO / "crd" / f"{contract.CRD_NAME}.yaml"
COLUMNS = ["NAME", "STATE", "PROGRESS", "EPOCH", "WORKERS", "RESTARTS", "AGE"]

CREATE_CASES = [case for case in invalid_cases() if case.before is None]
TRANSITION_CASES = [case for case in invalid_cases() if case.before is not None]


@pytest.fixture
def kubectl(cluster: Kubectl) -> Kubectl:
    """The project's kubectl, riding out the restarts of the shared API server other tests make."""
    return PatientKubectl.of(cluster)


@pytest.fixture(scope="module")
def admission_namespace(cluster: Kubectl) -> Iterator[str]:
    """One namespace for the whole module: refused manifests leave nothing behind, and every stored
    job gets a name of its own."""
    kubectl = PatientKubectl.of(cluster)
    name = f"t-admission-{uuid.uuid4().hex[:6]}"
    kubectl.run("create", "namespace", name)
    try:
        yield name
    finally:
        kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40].strip("-")


def named(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    renamed: dict[str, Any] = json.loads(json.dumps(manifest))
    renamed["metadata"]["name"] = name
    return renamed


def apply(kubectl: Kubectl, namespace: str, manifest: dict[str, Any], *flags: str) -> tuple[int, str]:
    """`kubectl apply -f -` as a user runs it; returns (exit code, stdout + stderr)."""
    result = kubectl.attempt("apply", "-n", namespace, "-f", "-", *flags, stdin=json.dumps(manifest))
    return result.returncode, result.stdout + result.stderr


def case_manifest(case: InvalidCase) -> dict[str, Any]:
    """The case's manifest under a name of its own, unless the name is what the case is about."""
    if case.field == "metadata.name":
        return case.manifest
    return named(case.manifest, f"c-{slug(case.id)}")


@pytest.mark.parametrize("case", CREATE_CASES, ids=[case.id for case in CREATE_CASES])
def test_invalid_manifest_is_refused_naming_the_field(
    kubectl: Kubectl, admission_namespace: str, case: InvalidCase
) -> None:
    manifest = case_manifest(case)
    code, output = apply(kubectl, admission_namespace, manifest)
    name = manifest["metadata"]["name"]
    if code == 0:
        kubectl.run("delete", "trainingjob", name, "-n", admission_namespace, "--wait=false", check=False)
    assert code != 0, f"accepted: {output}"
    assert case.field in output, output
    if case.layer == "unknown-field":
        # kubectl's default --validate=strict asks the server to refuse unknown fields.
        assert f'strict decoding error: unknown field "{case.field}"' in output, output
    else:
        assert f'TrainingJob "{name}" is invalid' in output, output
    assert kubectl.get_or_none("trainingjob", name, "-n", admission_namespace) is None


@pytest.mark.parametrize("case", TRANSITION_CASES, ids=[case.id for case in TRANSITION_CASES])
def test_immutable_field_cannot_change(kubectl: Kubectl, admission_namespace: str, case: InvalidCase) -> None:
    assert case.before is not None
    name = f"u-{slug(case.id)}"
    code, output = apply(kubectl, admission_namespace, named(case.before, name))
    assert code == 0, output
    stored = kubectl.get_json("trainingjob", name, "-n", admission_namespace)

    code, output = apply(kubectl, admission_namespace, named(case.manifest, name))

    assert code != 0, f"accepted: {output}"
    assert case.field in output, output
    assert "is immutable" in output, output
    after = kubectl.get_json("trainingjob", name, "-n", admission_namespace)
    assert after["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert after["spec"] == stored["spec"]


@pytest.mark.parametrize(
    ("manifest", "fragments"),
    [
        pytest.param(
            job(name="a" * (contract.MAX_JOB_NAME + 1)),
            [
                'metadata.name: Invalid value: "string": metadata.name must be at most 53 characters',
                "would exceed 63 characters",
            ],
            id="name-too-long",
        ),
        pytest.param(
            job(name="bert.v2"),
            ['metadata.name: Invalid value: "string": metadata.name must be a DNS-1035 label'],
            id="name-not-dns-1035",
        ),
        pytest.param(
            job({"spec.env": [{"name": "MASTER_ADDR", "value": "x"}]}, name="reserved-env"),
            ["spec.env[0]", "env MASTER_ADDR is set by the operator and cannot be set in spec.env"],
            id="reserved-env-name",
        ),
        pytest.param(
            job({"spec.numWorkers": 101}, name="too-many"),
            ["spec.numWorkers", "should be less than or equal to 100"],
            id="out-of-range",
        ),
        pytest.param(
            job({"spec.gpusPerWorker": "one"}, name="wrong-type"),
            ["spec.gpusPerWorker", "must be of type integer"],
            id="wrong-type",
        ),
        pytest.param(
            job({"spec.failurePolicy.restartPolicy": "Always"}, name="bad-enum"),
            [
                'spec.failurePolicy.restartPolicy: Unsupported value: "Always"',
                '"Never", "OnFailure", "ExitCode"',
            ],
            id="unknown-enum-value",
        ),
        pytest.param(
            {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "metadata": {"name": "no-spec"}},
            ["spec: Required value"],
            id="missing-spec",
        ),
    ],
)
def test_refusal_explains_itself(
    kubectl: Kubectl, admission_namespace: str, manifest: dict[str, Any], fragments: list[str]
) -> None:
    code, output = apply(kubectl, admission_namespace, manifest)
    assert code != 0, f"accepted: {output}"
    for fragment in fragments:
        assert fragment in output, output


def test_unknown_fields_are_refused_by_default_and_pruned_when_validation_is_off(
    kubectl: Kubectl, admission_namespace: str
) -> None:
    manifest = job({"spec.numGPUs": 4}, name="unknown-field")

    default_code, default_output = apply(kubectl, admission_namespace, manifest)
    strict_code, strict_output = apply(kubectl, admission_namespace, manifest, "--validate=strict")
    assert default_code != 0
    assert strict_code != 0
    assert 'unknown field "spec.numGPUs"' in default_output
    assert default_output == strict_output

    # Without strict validation the server drops (prunes) the unknown field instead of storing it.
    code, output = apply(kubectl, admission_namespace, manifest, "--validate=false")
    assert code == 0, output
    stored = kubectl.get_json("trainingjob", "unknown-field", "-n", admission_namespace)
    assert "numGPUs" not in stored["spec"]


VALID = valid_manifests()


@pytest.mark.parametrize("key", sorted(VALID))
def test_valid_manifest_is_accepted(kubectl: Kubectl, admission_namespace: str, key: str) -> None:
    manifest = VALID[key]
    if manifest["metadata"]["name"] == "case-job":
        manifest = named(manifest, f"v-{slug(key)}")
    name = manifest["metadata"]["name"]

    code, output = apply(kubectl, admission_namespace, manifest)

    assert code == 0, output
    assert f"trainingjob.{contract.GROUP}/{name} created" in output
    stored = kubectl.get_json("trainingjob", name, "-n", admission_namespace)
    # What was given is stored as given; the server only adds defaults.
    assert _contains(stored["spec"], manifest["spec"]), stored["spec"]
    # Server-side defaults from the schema.
    assert stored["spec"]["framework"] == manifest["spec"].get("framework", "pytorch")
    assert stored["spec"]["cleanPodPolicy"] == manifest["spec"].get("cleanPodPolicy", "Running")
    assert stored["spec"]["suspend"] is manifest["spec"].get("suspend", False)


def _contains(outer: Any, inner: Any) -> bool:
    """Whether `outer` holds everything `inner` does (dicts recursively, lists item by item, other values
    equal): the server may add defaults, also inside list items (a container port's protocol)."""
    if isinstance(inner, dict):
        return isinstance(outer, dict) and all(
            key in outer and _contains(outer[key], v) for key, v in inner.items()
        )
    if isinstance(inner, list):
        return (
            isinstance(outer, list)
            and len(outer) == len(inner)
            and all(_contains(o, i) for o, i in zip(outer, inner, strict=True))
        )
    return bool(outer == inner)


UPDATES = valid_updates()


@pytest.mark.parametrize(
    ("before", "after"), [(before, after) for _, before, after in UPDATES], ids=[id_ for id_, _, _ in UPDATES]
)
def test_mutable_field_update_is_accepted(
    kubectl: Kubectl,
    admission_namespace: str,
    before: dict[str, Any],
    after: dict[str, Any],
    request: pytest.FixtureRequest,
) -> None:
    name = f"m-{slug(request.node.callspec.id)}"
    code, output = apply(kubectl, admission_namespace, named(before, name))
    assert code == 0, output

    code, output = apply(kubectl, admission_namespace, named(after, name))

    assert code == 0, output
    assert f"trainingjob.{contract.GROUP}/{name} configured" in output
    stored = kubectl.get_json("trainingjob", name, "-n", admission_namespace)
    assert stored["metadata"]["generation"] == 2
    assert _contains(stored["spec"], after["spec"])


def _schema_node(path: str) -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    node: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in path.split("."):
        node = _fields_of(node)[part]
    return node


def _fields_of(node: dict[str, Any]) -> dict[str, Any]:
    """The fields `kubectl explain` lists for a node: its properties, or its items' for a list."""
    fields: dict[str, Any] = node.get("properties") or node.get("items", {}).get("properties", {})
    return fields


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(
    "path",
    [
        "spec",
        "spec.failurePolicy",
        "spec.failurePolicy.restartPolicy",
        "spec.numWorkers",
        "spec.gpusPerWorker",
        "spec.checkpoint.storage",
        "spec.scheduling.priority",
        "spec.env",
        "spec.env.valueFrom",
        "spec.scheduling.affinity",
        "spec.podTemplate",
        "spec.podTemplate.metadata",
        "spec.podTemplate.spec",
        "spec.podTemplate.spec.volumes",
        "spec.podTemplate.spec.containers",
        "spec.podTemplate.spec.securityContext",
        "status.state",
        "status.conditions",
    ],
)
def test_explain_shows_the_schema_descriptions(kubectl: Kubectl, path: str) -> None:
    node = _schema_node(path)
    description = _words(str(node["description"]))

    def explained() -> str | None:
        result = kubectl.attempt("explain", f"trainingjob.{path}")
        return result.stdout if result.returncode == 0 else None

    output = wait_for(f"kubectl explain trainingjob.{path}", explained, timeout=60)
    assert description in _words(output)
    assert f"KIND:       {contract.KIND}" in output
    if "enum" in node:
        assert all(value in output for value in node["enum"])
    for child in _fields_of(node):
        assert re.search(rf"^  {re.escape(child)}\s", output, re.MULTILINE), child


def test_get_shows_the_printer_columns(kubectl: Kubectl, admission_namespace: str) -> None:
    code, output = apply(kubectl, admission_namespace, job(name="columns"))
    assert code == 0, output

    for resource in ("tj", "trainingjobs", f"trainingjobs.{contract.GROUP}", "ml"):
        out = kubectl.run("get", resource, "-n", admission_namespace)
        header, *rows = out.strip().splitlines()
        assert header.split() == COLUMNS, (resource, out)
        assert any(row.split()[0].endswith("columns") for row in rows), out


DEEP = "<deep>"


def _deep_json(depth: int) -> str:
    """JSON text of an object `depth` levels deep, {"x": {"x": ... {}}}, written out as text: Python's
    own json module and copy.deepcopy refuse that depth (the recursion limit)."""
    return '{"x": ' * depth + "{}" + "}" * depth


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@dataclass(frozen=True)
class DeepCase:
    id: str
    changes: dict[str, Any]  # with DEEP where the deep object goes
    depth: int
    unknown_field: str  # what strict field validation names
    stored_path: tuple[str, ...]  # the spec field to measure once the rest is pruned


DEEP_CASES = [
    DeepCase(
        "affinity-500-deep",
        {"spec.scheduling.affinity": {"nodeAffinity": DEEP}},
        500,
        "spec.scheduling.affinity.nodeAffinity.x",
        ("scheduling", "affinity"),
    ),
    DeepCase(
        "valueFrom-2000-deep",
        {"spec.env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name", "x": DEEP}}}]},
        2000,
        "spec.env[0].valueFrom.fieldRef.x",
        ("env",),
    ),
    DeepCase(
        "podTemplate-1000-deep",
        {"spec.podTemplate": {"spec": {"containers": [{"name": "trainer", "securityContext": DEEP}]}}},
        1000,
        "spec.podTemplate.spec.containers[0].securityContext.x",
        ("podTemplate",),
    ),
]


@pytest.mark.parametrize("deep", DEEP_CASES, ids=[case.id for case in DEEP_CASES])
def test_deep_nesting_is_refused_or_pruned(
    kubectl: Kubectl, admission_namespace: str, deep: DeepCase
) -> None:
    """Issue 15: no field of the spec stores a value nested deeper than the schema declares."""
    name = f"d-{slug(deep.id)}"
    text = json.dumps(job(deep.changes, name=name)).replace(json.dumps(DEEP), _deep_json(deep.depth))

    def apply_text(*flags: str) -> tuple[int, str]:
        result = kubectl.attempt("apply", "-n", admission_namespace, "-f", "-", *flags, stdin=text)
        return result.returncode, result.stdout + result.stderr

    code, output = apply_text()
    assert code != 0, f"accepted: {output}"
    assert f'strict decoding error: unknown field "{deep.unknown_field}"' in output, output[:2000]

    # Without strict validation the server prunes what the schema does not declare.
    code, output = apply_text("--validate=false")
    assert code == 0, output[:2000]
    stored = kubectl.get_json("trainingjob", name, "-n", admission_namespace)["spec"]
    for key in deep.stored_path:
        stored = stored[key]
    assert _depth(stored) < 10, json.dumps(stored)[:2000]
