"""Admission cases of spec.tensorflow: the role counts' bounds, the framework the roles need, parameter
servers without a chief, and their immutability (the layers are explained in tests/unit/crd_cases.py)."""

from __future__ import annotations

from typing import Any

from tests.unit.crd_case_model import DELETE, InvalidCase, Layer, case, job, transition

# A ParameterServerStrategy job: a chief, two workers, one parameter server, an evaluator.
ROLES = {
    "spec.framework": "tensorflow",
    "spec.gpusPerWorker": 0,
    "spec.tensorflow": {"chief": 1, "ps": 1, "evaluator": 1},
}


def tensorflow_job(changes: dict[str, Any] | None = None) -> dict[str, Any]:
    return job({**ROLES, **(changes or {})})


def roles_case(id_: str, roles: dict[str, Any], path: str, layer: Layer) -> InvalidCase:
    return case(id_, {**ROLES, "spec.tensorflow": roles}, path, layer)


def tensorflow_invalid_cases() -> list[InvalidCase]:
    return [
        roles_case("tensorflow-two-chiefs", {"chief": 2}, "spec.tensorflow.chief", "schema"),
        roles_case("tensorflow-chief-negative", {"chief": -1}, "spec.tensorflow.chief", "schema"),
        roles_case("tensorflow-two-evaluators", {"evaluator": 2}, "spec.tensorflow.evaluator", "schema"),
        roles_case("tensorflow-ps-negative", {"chief": 1, "ps": -1}, "spec.tensorflow.ps", "schema"),
        roles_case("tensorflow-ps-above-100", {"chief": 1, "ps": 101}, "spec.tensorflow.ps", "schema"),
        roles_case("tensorflow-unknown-role", {"master": 1}, "spec.tensorflow.master", "unknown-field"),
        roles_case("tensorflow-ps-without-chief", {"ps": 2}, "spec.tensorflow.ps", "cel"),
        roles_case("tensorflow-ps-chief-zero", {"chief": 0, "ps": 1}, "spec.tensorflow.ps", "cel"),
        case("tensorflow-roles-pytorch", {**ROLES, "spec.framework": "pytorch"}, "spec.tensorflow", "cel"),
        case("tensorflow-roles-jax", {**ROLES, "spec.framework": "jax"}, "spec.tensorflow", "cel"),
        # No framework: the default, pytorch.
        case(
            "tensorflow-roles-default-framework",
            {**ROLES, "spec.framework": DELETE},
            "spec.tensorflow",
            "cel",
        ),
        transition(
            "tensorflow-roles-added",
            {"spec.framework": "tensorflow"},
            {"spec.framework": "tensorflow", "spec.tensorflow": {"chief": 1}},
            "spec.tensorflow",
        ),
        transition(
            "tensorflow-roles-removed", ROLES, {**ROLES, "spec.tensorflow": DELETE}, "spec.tensorflow"
        ),
        transition(
            "tensorflow-ps-changed",
            ROLES,
            {**ROLES, "spec.tensorflow": {"chief": 1, "ps": 2, "evaluator": 1}},
            "spec.tensorflow",
        ),
    ]


def tensorflow_valid_manifests() -> dict[str, dict[str, Any]]:
    return {
        "tensorflow-parameter-servers": tensorflow_job(),
        "tensorflow-chief-only": tensorflow_job({"spec.tensorflow": {"chief": 1}}),
        "tensorflow-evaluator-without-chief": tensorflow_job({"spec.tensorflow": {"evaluator": 1}}),
        "tensorflow-no-roles": tensorflow_job({"spec.tensorflow": {}}),
        "tensorflow-many-ps": tensorflow_job(
            {"spec.tensorflow": {"chief": 1, "ps": 100}, "spec.numWorkers": 100}
        ),
    }


def tensorflow_valid_updates() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [("tensorflow-workers-scaled", tensorflow_job(), tensorflow_job({"spec.numWorkers": 4}))]
