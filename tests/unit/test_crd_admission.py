"""What the API server and the operator accept and refuse: the admission test table
(tests/unit/crd_cases.py) checked against the schema offline, the valid manifests and updates, and the
operator-side validation (crd/validation.py).

Split out of tests/unit/test_crd.py (the schema's shape, generated artifacts, defaults).
"""

from __future__ import annotations

from typing import Any

import pytest

from crd import contract
from crd.defaults import subschema
from crd.immutability import IMMUTABLE_FIELDS
from crd.validation import FieldError, validate
from tests.unit import crd_cases
from tests.unit.crd_cases import InvalidCase, job
from tests.unit.crd_schema_checks import (
    ROOT,
    duplicate_item_paths,
    schema_at,
    schema_error_paths,
    unknown_field_paths,
)

# ---------------------------------------------------------------------------------------------------
# The admission test table


CASES = crd_cases.invalid_cases()


def test_case_ids_are_unique_and_every_layer_is_covered() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
    assert {case.layer for case in CASES} == {"schema", "list", "unknown-field", "cel", "transition"}


@pytest.mark.parametrize("case", [c for c in CASES if c.layer == "schema"], ids=lambda c: c.id)
def test_schema_case_fails_openapi_validation_at_its_field(case: InvalidCase) -> None:
    assert case.field in schema_error_paths(case.manifest)


@pytest.mark.parametrize("case", [c for c in CASES if c.layer == "list"], ids=lambda c: c.id)
def test_list_case_has_a_duplicate_at_its_field(case: InvalidCase) -> None:
    assert schema_error_paths(case.manifest) == []
    assert list(duplicate_item_paths(case.manifest, ROOT)) == [case.field]


@pytest.mark.parametrize("case", [c for c in CASES if c.layer == "unknown-field"], ids=lambda c: c.id)
def test_unknown_field_case_names_an_undeclared_field(case: InvalidCase) -> None:
    assert list(unknown_field_paths(case.manifest, ROOT)) == [case.field]
    parent = case.field.rsplit(".", 1)[0]
    assert schema_at(parent) is not None
    assert schema_at(case.field) is None


@pytest.mark.parametrize("case", [c for c in CASES if c.layer in ("cel", "transition")], ids=lambda c: c.id)
def test_cel_case_passes_openapi_so_only_its_rule_rejects_it(case: InvalidCase) -> None:
    for manifest in (case.manifest, case.before):
        if manifest is not None:
            assert schema_error_paths(manifest) == []
            assert list(unknown_field_paths(manifest, ROOT)) == []
            assert list(duplicate_item_paths(manifest, ROOT)) == []


@pytest.mark.parametrize("case", [c for c in CASES if c.layer != "unknown-field"], ids=lambda c: c.id)
def test_case_field_exists_in_schema(case: InvalidCase) -> None:
    assert case.field == "metadata.name" or schema_at(case.field) is not None


def test_transition_cases_differ_only_in_a_mutable_way_from_before() -> None:
    for case in CASES:
        if case.layer == "transition":
            assert case.before is not None, case.id
            assert case.before != case.manifest, case.id


def test_every_immutable_field_has_a_transition_case() -> None:
    """tests/e2e/test_api.py applies each against the admission policy of crd/immutability.py."""
    changed = {case.field for case in CASES if case.layer == "transition"}
    assert changed == {field.name for field in IMMUTABLE_FIELDS}


@pytest.mark.parametrize(("name", "manifest"), sorted(crd_cases.valid_manifests().items()))
def test_valid_manifest_passes_openapi_and_operator_checks(name: str, manifest: dict[str, Any]) -> None:
    assert schema_error_paths(manifest) == []
    assert list(unknown_field_paths(manifest, ROOT)) == []
    assert list(duplicate_item_paths(manifest, ROOT)) == []
    assert validate(manifest) == []


def test_examples_are_the_readme_examples_the_restricted_and_the_byo_one() -> None:
    examples = crd_cases.example_manifests()
    assert {m["metadata"]["name"] for m in examples.values()} == {
        "mnist-training",
        "bert-distributed",
        "gpt-resume",
        "advanced-training",
        "restricted-training",
        "bert-elastic",
        "byo-training",
        "tf-parameter-servers",
        "jax-psum",
        "mpi-allreduce",
        "spot-training",
        "xgboost-iris",
        "paddle-linear",
        "mnist-mlflow",
    }
    for manifest in examples.values():
        assert manifest["apiVersion"] == contract.API_VERSION
        assert manifest["kind"] == contract.KIND


@pytest.mark.parametrize(("name", "before", "after"), crd_cases.valid_updates(), ids=lambda v: str(v)[:40])
def test_valid_updates_pass_openapi(name: str, before: dict[str, Any], after: dict[str, Any]) -> None:
    assert schema_error_paths(before) == schema_error_paths(after) == []


# ---------------------------------------------------------------------------------------------------
# Operator-side validation


def _errors(changes: dict[str, Any]) -> list[FieldError]:
    return validate(job(changes))


def test_validate_accepts_the_base_job_and_does_not_mutate_it() -> None:
    original = job()
    assert validate(original) == []
    assert original == job()


@pytest.mark.parametrize(
    ("storage", "resume_from"),
    [
        ({"type": "s3", "s3Bucket": "b"}, "s3://other/run/epoch-3"),
        ({"type": "gcs", "gcs": {"bucket": "b"}}, "gs://b/x"),
        ({"type": "pvc"}, "epoch-3"),
        ({"type": "pvc", "pvcName": "c"}, "/checkpoints/epoch-3"),
        ({"type": "nfs", "nfsServer": "n", "nfsPath": "/e"}, "runs/../epoch-3"),
    ],
)
def test_resume_from_matching_its_storage(storage: dict[str, Any], resume_from: str) -> None:
    assert _errors({"spec.checkpoint.storage": storage, "spec.checkpoint.resumeFrom": resume_from}) == []


@pytest.mark.parametrize(
    ("storage", "resume_from"),
    [
        ({"type": "s3", "s3Bucket": "b"}, "gs://b/x"),
        ({"type": "s3", "s3Bucket": "b"}, "/checkpoints/x"),
        ({"type": "s3", "s3Bucket": "b"}, "s3://"),
        ({"type": "gcs", "gcsBucket": "b"}, "s3://b/x"),
        ({"type": "pvc"}, "s3://b/x"),
        ({"type": "pvc", "pvcName": "c"}, "/data/epoch-3"),
        ({"type": "nfs", "nfsServer": "n", "nfsPath": "/e"}, "../../etc/passwd"),
    ],
)
def test_resume_from_not_matching_its_storage(storage: dict[str, Any], resume_from: str) -> None:
    errors = _errors({"spec.checkpoint.storage": storage, "spec.checkpoint.resumeFrom": resume_from})
    assert [e.path for e in errors] == ["spec.checkpoint.resumeFrom"]


def test_resource_field_ref_names_a_container_of_the_pod() -> None:
    def env_errors(value_from: dict[str, Any], template: dict[str, Any] | None = None) -> list[str]:
        changes: dict[str, Any] = {"spec.env": [{"name": "X", "valueFrom": value_from}]}
        if template is not None:
            changes["spec.podTemplate"] = template
        return [str(e) for e in _errors(changes)]

    assert env_errors({"secretKeyRef": {"name": "s", "key": "k"}}) == []
    assert env_errors({"resourceFieldRef": {"containerName": "trainer", "resource": "limits.cpu"}}) == []
    errors = env_errors({"resourceFieldRef": {"containerName": "sidecar", "resource": "limits.cpu"}})
    assert errors == [
        "spec.env[0].valueFrom.resourceFieldRef.containerName: the worker pod has no container 'sidecar'; "
        "it has trainer"
    ]
    sidecar = {"spec": {"containers": [{"name": "sidecar", "image": "envoy"}]}}
    assert (
        env_errors({"resourceFieldRef": {"containerName": "sidecar", "resource": "limits.cpu"}}, sidecar)
        == []
    )


def test_additional_params_colliding_after_upper_casing() -> None:
    assert _errors({"spec.hyperparameters.additionalParams": {"lr": "1", "wd": "2"}}) == []
    errors = _errors({"spec.hyperparameters.additionalParams": {"lr": "1", "LR": "2"}})
    assert len(errors) == 1
    assert "HP_LR" in errors[0].message


def test_other_accelerators_with_gpus_per_worker() -> None:
    errors = _errors({"spec.gpusPerWorker": 1, "spec.resources.limits": {"amd.com/gpu": 1}})
    assert [e.path for e in errors] == ["spec.resources"]
    errors = _errors({"spec.gpusPerWorker": 1, "spec.resources.limits": {"nvidia.com/mig-1g.5gb": 1}})
    assert [e.path for e in errors] == ["spec.resources"]
    assert _errors({"spec.gpusPerWorker": 2, "spec.resources.limits": {"nvidia.com/gpu": 2, "cpu": 4}}) == []


def test_nccl_needs_nvidia_devices() -> None:
    errors = _errors({"spec.gpusPerWorker": 0, "spec.networking.backend": "nccl"})
    assert [e.path for e in errors] == ["spec.networking.backend"]
    assert _errors({"spec.gpusPerWorker": 0}) == []  # defaults to gloo
    mig = {
        "spec.gpusPerWorker": 0,
        "spec.networking.backend": "nccl",
        "spec.resources.limits": {"nvidia.com/mig-1g.5gb": 1},
    }
    assert _errors(mig) == []


def test_a_stored_mpi_job_is_refused_by_the_operator_too() -> None:
    # Admission refuses mpi (crd_cases backend-mpi); one stored before that fails with InvalidSpec.
    errors = _errors({"spec.networking.backend": "mpi"})
    assert [e.path for e in errors] == ["spec.networking.backend"]
    assert "launcher" in errors[0].message
    assert "mpi is refused" in subschema("spec", "networking", "backend")["description"]
