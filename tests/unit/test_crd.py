"""Unit tests of crd/: the schema's shape, generated artifacts, defaults, operator-side validation, and
the consistency of the admission test table (tests/unit/crd_cases.py) with the schema."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from crd import contract, escalation_policy, immutability
from crd.__main__ import main as crd_main
from crd.defaults import apply_schema_defaults, subschema, with_defaults
from crd.immutability import IMMUTABLE_FIELDS, POLICY_FILE_NAME, policy_yaml
from crd.openapi import Schema
from crd.render import CRD_FILE_NAME, api_docs, crd_yaml, documented, walk
from crd.schema import custom_resource_definition, open_api_schema_of
from tests.unit.crd_cases import job
from tests.unit.crd_schema_checks import (
    ROOT,
    SPEC,
    all_nodes,
    all_rules,
    schema_at,
)

REPO = Path(__file__).resolve().parents[2]
KUBE_VERSION = "1.34"


# ---------------------------------------------------------------------------------------------------
# The CRD


def test_crd_identity_and_printer_columns() -> None:
    crd = custom_resource_definition()
    assert crd["metadata"]["name"] == "trainingjobs.ml.example.com"
    names = crd["spec"]["names"]
    assert names == {
        "kind": "TrainingJob",
        "listKind": "TrainingJobList",
        "plural": "trainingjobs",
        "singular": "trainingjob",
        "shortNames": ["tj"],
        "categories": ["ml"],
    }
    (version,) = crd["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.numWorkers",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = [
        (c["name"].upper(), c["type"], c["jsonPath"], c.get("priority", 0))
        for c in version["additionalPrinterColumns"]
    ]
    assert columns == [
        ("STATE", "string", ".status.state", 0),
        ("PROGRESS", "string", ".status.progress", 0),
        ("EPOCH", "integer", ".status.currentEpoch", 0),
        ("WORKERS", "integer", ".status.workers.active", 0),
        ("RESTARTS", "integer", ".status.restartCount", 0),
        ("AGE", "date", ".metadata.creationTimestamp", 0),
        # `kubectl get -o wide` adds the Kueue queue of a queued job, the running pods per TensorFlow role
        # and the status message.
        ("QUEUE", "string", ".status.queue.name", 1),
        ("ROLES", "string", ".status.roleSummary", 1),
        ("MESSAGE", "string", ".status.message", 1),
    ]


def test_crd_validates_against_kubernetes_schema() -> None:
    assert (
        kubernetes_validate.validate(custom_resource_definition(), KUBE_VERSION, strict=True) == KUBE_VERSION
    )


def test_every_field_has_a_description() -> None:
    missing = [path for path, node, _ in walk(ROOT, "") if path != "metadata" and not node.get("description")]
    assert missing == []


def test_every_string_list_and_map_is_bounded_for_cel_cost() -> None:
    unbounded = []
    for path, node in all_nodes(ROOT):
        kind = node.get("type")
        if path.startswith("metadata"):
            continue
        if kind == "string" and "enum" not in node and "maxLength" not in node:
            unbounded.append(path)
        if kind == "array" and "maxItems" not in node:
            unbounded.append(path)
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(path)
    assert unbounded == []


def test_lists_declare_list_type_and_map_keys_are_required_or_defaulted() -> None:
    for path, node in all_nodes(ROOT):
        if node.get("type") != "array":
            continue
        assert node.get("x-kubernetes-list-type") in ("atomic", "set", "map"), path
        if node["x-kubernetes-list-type"] == "map":
            items = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in items.get("required", []) or "default" in items["properties"][key], (path, key)


def test_structural_every_object_declares_its_fields() -> None:
    for path, node in all_nodes(ROOT):
        if node.get("type") == "object" and path not in ("metadata",):
            declared = "properties" in node or "additionalProperties" in node
            assert declared or node.get("x-kubernetes-preserve-unknown-fields") is True, path


def test_status_is_fully_structural() -> None:
    status = ROOT["properties"]["status"]
    assert all(not n.get("x-kubernetes-preserve-unknown-fields") for _, n in all_nodes(status))
    assert status["properties"]["state"]["enum"] == [
        "Queued",
        "Pending",
        "Initializing",
        "Running",
        "Restarting",
        "Suspended",
        "Completed",
        "Failed",
    ]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    for field in (
        "restartAt",
        "activeSeconds",
        "runningSince",
        "attempt",
        "lastProgressTime",
        "completionTime",
        "queue",
    ):
        assert field in status["properties"], field


def test_spec_bounds_and_defaults_match_the_api_reference() -> None:
    props = SPEC["properties"]
    assert SPEC["required"] == ["model", "dataset", "numWorkers"]
    assert (props["numWorkers"]["minimum"], props["numWorkers"]["maximum"]) == (1, 100)
    assert (props["gpusPerWorker"]["minimum"], props["gpusPerWorker"]["maximum"]) == (0, 16)
    assert props["gpusPerWorker"]["default"] == 1
    assert props["framework"]["enum"] == [*contract.FRAMEWORKS, *contract.RETIRED_FRAMEWORKS]
    assert props["cleanPodPolicy"]["enum"] == ["All", "Running", "None"]
    hyper = props["hyperparameters"]["properties"]
    assert hyper["learningRate"]["exclusiveMinimum"] is True
    assert hyper["optimizer"]["enum"] == ["adam", "sgd", "adamw", "rmsprop"]
    networking = props["networking"]["properties"]
    assert (networking["masterPort"]["minimum"], networking["masterPort"]["maximum"]) == (1024, 65535)
    assert "default" not in networking["backend"]  # an operator default: depends on gpusPerWorker


def test_descriptions_state_defaults_and_bounds() -> None:
    props = SPEC["properties"]
    assert "Default: 1." in props["gpusPerWorker"]["description"]
    assert "At most 100." in props["numWorkers"]["description"]
    assert "One of: pytorch, tensorflow, jax, mpi, xgboost, paddlepaddle, mxnet." in str(props["framework"])


def test_immutable_fields() -> None:
    """The fields the admission policy keeps as they were; the schema has no transition rule left, so
    that a status write evaluates none (crd/immutability.py)."""
    assert {field.name for field in IMMUTABLE_FIELDS} == {
        f"spec.{f}"
        for f in (
            "model",
            "dataset",
            "framework",
            "gpusPerWorker",
            "image",
            "command",
            "args",
            "env",
            "resources",
            "hyperparameters",
            "checkpoint.storage",
            "networking",
            "podTemplate",
            "elastic",
            "tensorflow",
            "mpi",
            "managedBy",
        )
    }
    assert not [entry for _, entry in all_rules() if "oldSelf" in entry["rule"]]
    spec = ROOT["properties"]["spec"]
    for field in IMMUTABLE_FIELDS:
        *parents, leaf = field.path.split(".")
        node = spec
        for name in parents:
            node = node["properties"][name]
        described = node["properties"][leaf]
        assert "Immutable" in described["description"], field.name
        # An optional field without a default may not be added or removed either; one that is always
        # there (required, or defaulted with its parents) is compared when both versions have it.
        always_there = leaf in node.get("required", ()) or "default" in described
        assert field.presence != always_there, field.name


def test_immutable_spec_policy_matches_updates_of_the_resource_not_of_status() -> None:
    policy, binding = immutability.policy(), immutability.binding()
    (rules,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules["resources"] == [contract.PLURAL]
    assert rules["operations"] == ["UPDATE"]
    assert binding["spec"] == {"policyName": contract.IMMUTABLE_SPEC_POLICY, "validationActions": ["Deny"]}
    (validation,) = policy["spec"]["validations"]
    assert validation["reason"] == "Invalid"
    committed = list(yaml.safe_load_all((REPO / "crd" / POLICY_FILE_NAME).read_text()))
    assert committed == [policy, binding]


def test_an_immutable_field_expression_reads_as_its_transition_rule_did() -> None:
    always = immutability.Immutable("checkpoint.storage")
    assert always.unchanged("self", "oldSelf") == (
        "!((has(self.checkpoint) && has(self.checkpoint.storage)) && "
        "(has(oldSelf.checkpoint) && has(oldSelf.checkpoint.storage))) || "
        "self.checkpoint.storage == oldSelf.checkpoint.storage"
    )
    optional = immutability.Immutable("image", presence=True)
    assert optional.unchanged() == (
        "has(object.spec.image) == has(oldObject.spec.image) && "
        "(!has(object.spec.image) || object.spec.image == oldObject.spec.image)"
    )
    changed = immutability.changed_fields_expression((always, optional))
    assert changed.count(" ? [] : ") == 2
    assert '["spec.image"]' in changed


def test_name_rules_explain_the_generated_names() -> None:
    # On metadata.name itself, so that the API server's error names the field.
    root_rules = ROOT["properties"]["metadata"]["properties"]["name"]["x-kubernetes-validations"]
    assert any(f"size() <= {contract.MAX_JOB_NAME}" in r["rule"] for r in root_rules)
    length_rule = next(r for r in root_rules if "size()" in r["rule"])
    assert "<name>-worker-99" in length_rule["message"]
    assert "63 characters" in length_rule["message"]
    assert any("^[a-z]([-a-z0-9]*[a-z0-9])?$" in r["rule"] for r in root_rules)


def test_reserved_env_rule_lists_every_reserved_name() -> None:
    env_rules = SPEC["properties"]["env"]["items"]["x-kubernetes-validations"]
    reserved_rule = next(r for r in env_rules if "startsWith" in r["rule"])
    for name in contract.RESERVED_ENV_NAMES:
        assert f"'{name}'" in reserved_rule["rule"]
    for prefix in contract.RESERVED_ENV_PREFIXES:
        assert f"startsWith('{prefix}')" in reserved_rule["rule"]
    assert "self.name" in reserved_rule["messageExpression"]


def test_every_rule_has_a_message() -> None:
    for path, entry in all_rules():
        assert "message" in entry or "messageExpression" in entry, (path, entry["rule"])
        assert "\n" not in entry.get("message", "")


def test_every_rule_field_path_exists() -> None:
    for path, entry in all_rules():
        if "fieldPath" in entry:
            assert schema_at(f"{path}{entry['fieldPath']}") is not None, (path, entry["fieldPath"])


def test_contract_limits() -> None:
    assert contract.MAX_JOB_NAME == 53
    longest_pod = "a" * contract.MAX_JOB_NAME + contract.WORKER_INFIX + str(contract.MAX_WORKERS - 1)
    assert len(longest_pod) == contract.DNS_LABEL_MAX


def test_default_images_are_docker_hub_short_names() -> None:
    assert set(contract.DEFAULT_IMAGES) == set(SPEC["properties"]["framework"]["enum"]) - {"mxnet"}
    for image in contract.DEFAULT_IMAGES.values():
        first = image.split("/")[0]
        assert "/" not in image or ("." not in first and ":" not in first), image
        assert ":" in image, image
        assert not image.endswith(":latest"), image


# ---------------------------------------------------------------------------------------------------
# Generated artifacts


def test_committed_crd_yaml_is_generated_from_schema() -> None:
    committed = (REPO / "crd" / CRD_FILE_NAME).read_text(encoding="utf-8")
    assert committed == crd_yaml()
    assert yaml.safe_load(committed) == custom_resource_definition()


def test_committed_api_docs_are_generated_from_schema() -> None:
    assert (REPO / "docs" / "api.md").read_text(encoding="utf-8") == api_docs()


def test_api_docs_cover_every_field_and_rule() -> None:
    docs = api_docs()
    for path, _, _ in walk(SPEC, "spec"):
        assert (f"`{path}`" in docs) == documented(path), path
    assert docs.count("| `") >= len(all_rules())


def test_check_command_passes_on_committed_files() -> None:
    assert crd_main(["check"]) == 0


def test_check_command_fails_on_stale_files_and_write_fixes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crd_file, docs_file = tmp_path / CRD_FILE_NAME, tmp_path / "docs" / "api.md"
    chart_file = tmp_path / "chart" / CRD_FILE_NAME
    policy_file, chart_policy_file = tmp_path / POLICY_FILE_NAME, tmp_path / "chart" / POLICY_FILE_NAME
    monkeypatch.setattr("crd.__main__.CRD_FILE", crd_file)
    monkeypatch.setattr("crd.__main__.CHART_CRD_FILE", chart_file)
    monkeypatch.setattr("crd.__main__.POLICY_FILE", policy_file)
    monkeypatch.setattr("crd.__main__.CHART_POLICY_FILE", chart_policy_file)
    monkeypatch.setattr("crd.__main__.ESCALATION_POLICY_FILE", tmp_path / escalation_policy.POLICY_FILE_NAME)
    monkeypatch.setattr(
        "crd.__main__.CHART_ESCALATION_POLICY_FILE", tmp_path / "chart" / escalation_policy.POLICY_FILE_NAME
    )
    monkeypatch.setattr("crd.__main__.DOCS_FILE", docs_file)
    monkeypatch.setattr("crd.__main__.PACKAGE_DIR", tmp_path / "crd")
    assert crd_main(["check"]) == 1
    assert crd_main(["write"]) == 0
    assert crd_main(["check"]) == 0
    crd_file.write_text(crd_yaml() + "# edited\n", encoding="utf-8")
    assert crd_main(["check"]) == 1
    assert crd_main(["write"]) == 0
    docs_file.write_text(api_docs() + "edited\n", encoding="utf-8")
    assert crd_main(["check"]) == 1
    assert crd_main(["write"]) == 0
    chart_file.write_text(crd_yaml().replace("TrainingJob", "TrainingJobs", 1), encoding="utf-8")
    assert crd_main(["check"]) == 1
    assert crd_main(["write"]) == 0
    assert chart_file.read_text(encoding="utf-8") == crd_file.read_text(encoding="utf-8")
    chart_policy_file.write_text(policy_yaml().replace("Deny", "Warn"), encoding="utf-8")
    assert crd_main(["check"]) == 1
    assert crd_main(["write"]) == 0
    assert chart_policy_file.read_text(encoding="utf-8") == policy_file.read_text(encoding="utf-8")


def test_yaml_command_prints_the_crd() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "crd", "yaml"], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout == crd_yaml()


def test_kustomization_lists_the_crd_and_the_admission_policies() -> None:
    kustomization = yaml.safe_load((REPO / "crd" / "kustomization.yaml").read_text())
    assert kustomization["resources"] == [
        CRD_FILE_NAME,
        "trainer-clusterrole.yaml",
        "trainer-progress-policy.yaml",
        POLICY_FILE_NAME,
        escalation_policy.POLICY_FILE_NAME,
    ]


# ---------------------------------------------------------------------------------------------------
# Defaults


def test_apply_schema_defaults_recurses_into_defaulted_objects_lists_and_maps() -> None:
    schema: Schema = {
        "type": "object",
        "properties": {
            "outer": {
                "type": "object",
                "default": {},
                "properties": {
                    "inner": {"type": "object", "default": {}, "properties": {"n": {"default": 7}}}
                },
            },
            "items": {"type": "array", "items": {"type": "object", "properties": {"k": {"default": "x"}}}},
            "map": {
                "type": "object",
                "additionalProperties": {"type": "object", "properties": {"v": {"default": 1}}},
            },
            "kept": {"type": "integer", "default": 3},
            "dropped_null": {"type": "integer"},
        },
    }
    value = {"items": [{}, {"k": "y"}], "map": {"a": {}}, "kept": 5, "dropped_null": None, "extra": {"z": 1}}
    assert apply_schema_defaults(value, schema) == {
        "outer": {"inner": {"n": 7}},
        "items": [{"k": "x"}, {"k": "y"}],
        "map": {"a": {"v": 1}},
        "kept": 5,
        "extra": {"z": 1},
    }


def test_with_defaults_applies_every_schema_default_and_leaves_input_alone() -> None:
    original = job()
    snapshot = copy.deepcopy(original)
    spec = with_defaults(original)["spec"]
    assert original == snapshot
    # Every default in the schema whose parent object exists after defaulting is present.
    for path, node, _ in walk(SPEC, ""):
        if "default" not in node or "[]" in path:
            continue
        *parents, leaf = path.split(".")
        parent = spec
        for name in parents:
            parent = parent.get(name) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            assert parent.get(leaf) == node["default"] or isinstance(node["default"], dict), path
    assert spec["gpusPerWorker"] == 1
    assert spec["framework"] == "pytorch"
    assert spec["failurePolicy"]["restartBackoff"] == {
        "initialDelaySeconds": 10,
        "maxDelaySeconds": 360,
        "multiplier": 2,
    }
    assert spec["checkpoint"]["storage"] == {"type": "pvc"}


def test_with_defaults_keeps_user_values() -> None:
    spec = with_defaults(
        job(
            {
                "spec.gpusPerWorker": 0,
                "spec.failurePolicy.restartBackoff": {"multiplier": 3},
                "spec.suspend": True,
            }
        )
    )["spec"]
    assert spec["gpusPerWorker"] == 0
    assert spec["failurePolicy"]["restartBackoff"]["multiplier"] == 3
    assert spec["failurePolicy"]["restartBackoff"]["initialDelaySeconds"] == 10
    assert spec["suspend"] is True


def test_with_defaults_follows_the_schema_not_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = copy.deepcopy(open_api_schema_of(custom_resource_definition()))
    schema["properties"]["spec"]["properties"]["cleanPodPolicy"]["default"] = "All"
    monkeypatch.setattr("crd.defaults._root_schema", lambda: schema)
    assert with_defaults(job())["spec"]["cleanPodPolicy"] == "All"


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow", "jax"])
def test_operator_default_image_and_command(framework: str) -> None:
    spec = with_defaults(job({"spec.framework": framework}))["spec"]
    assert spec["image"] == contract.DEFAULT_IMAGES[framework]
    assert spec["command"] == ["python", "/etc/trainingjob/train.py"]


def test_operator_defaults_keep_explicit_image_and_command() -> None:
    spec = with_defaults(job({"spec.image": "my/image:1", "spec.command": ["torchrun"]}))["spec"]
    assert (spec["image"], spec["command"]) == ("my/image:1", ["torchrun"])


@pytest.mark.parametrize(
    ("gpus", "backend", "expected"),
    [(1, None, "nccl"), (0, None, "gloo"), (2, "gloo", "gloo"), (0, "mpi", "mpi")],
)
def test_operator_default_backend(gpus: int, backend: str | None, expected: str) -> None:
    changes: dict[str, Any] = {"spec.gpusPerWorker": gpus}
    if backend:
        changes["spec.networking.backend"] = backend
    assert with_defaults(job(changes))["spec"]["networking"]["backend"] == expected


def test_operator_default_checkpoint_claim() -> None:
    created = with_defaults(job({"spec.checkpoint.enabled": True}))["spec"]["checkpoint"]["storage"]
    assert created["pvc"]["create"] == {
        "size": "10Gi",
        "accessModes": ["ReadWriteMany"],
        "whenDeleted": "Retain",
    }
    assert created["pvc"]["create"] == apply_schema_defaults(
        {}, subschema("spec", "checkpoint", "storage", "pvc", "create")
    )
    by_resume = with_defaults(job({"spec.checkpoint.resumeFrom": "epoch-1"}))["spec"]["checkpoint"]["storage"]
    assert "create" in by_resume["pvc"]
    for storage in ({"pvcName": "x"}, {"pvc": {"claimName": "x"}}, {"type": "s3", "s3Bucket": "b"}):
        spec = with_defaults(job({"spec.checkpoint.enabled": True, "spec.checkpoint.storage": storage}))[
            "spec"
        ]
        assert "create" not in spec["checkpoint"]["storage"].get("pvc", {})
    assert "pvc" not in with_defaults(job())["spec"]["checkpoint"]["storage"]


def test_operator_default_mlflow_experiment() -> None:
    monitoring = with_defaults(job({"spec.monitoring.mlflowTrackingUri": "http://mlflow:5000"}))["spec"][
        "monitoring"
    ]
    assert monitoring["mlflowExperiment"] == "case-job"
    assert "mlflowExperiment" not in with_defaults(job())["spec"]["monitoring"]
