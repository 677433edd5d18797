"""Admission cases of spec.elastic: the bounds of numWorkers, the frameworks and gang scheduling it
refuses, its ports and its immutability (the layers are explained in tests/unit/crd_cases.py)."""

from __future__ import annotations

from typing import Any

from tests.unit.crd_case_model import DELETE, InvalidCase, Layer, case, job, transition

ELASTIC = {"spec.numWorkers": 3, "spec.gpusPerWorker": 0, "spec.elastic": {"minWorkers": 2, "maxWorkers": 4}}


def elastic_job(changes: dict[str, Any] | None = None) -> dict[str, Any]:
    return job({**ELASTIC, **(changes or {})})


def elastic_case(id_: str, changes: dict[str, Any], path: str, layer: Layer) -> InvalidCase:
    return case(id_, {**ELASTIC, **changes}, path, layer)


def elastic_invalid_cases() -> list[InvalidCase]:
    bounds = {"minWorkers": 2, "maxWorkers": 4}
    return [
        elastic_case(
            "elastic-minWorkers-zero", {"spec.elastic.minWorkers": 0}, "spec.elastic.minWorkers", "schema"
        ),
        elastic_case(
            "elastic-maxWorkers-above-100",
            {"spec.elastic.maxWorkers": 101},
            "spec.elastic.maxWorkers",
            "schema",
        ),
        elastic_case(
            "elastic-maxWorkers-missing",
            {"spec.elastic.maxWorkers": DELETE},
            "spec.elastic.maxWorkers",
            "schema",
        ),
        elastic_case(
            "elastic-maxRestarts-negative",
            {"spec.elastic.maxRestarts": -1},
            "spec.elastic.maxRestarts",
            "schema",
        ),
        elastic_case(
            "elastic-lastCall-zero",
            {"spec.elastic.rendezvous": {"lastCallTimeoutSeconds": 0}},
            "spec.elastic.rendezvous.lastCallTimeoutSeconds",
            "schema",
        ),
        elastic_case(
            "elastic-min-above-max",
            {"spec.elastic": {"minWorkers": 4, "maxWorkers": 3}},
            "spec.elastic.minWorkers",
            "cel",
        ),
        elastic_case("elastic-numWorkers-above-max", {"spec.numWorkers": 5}, "spec.numWorkers", "cel"),
        elastic_case("elastic-numWorkers-below-min", {"spec.numWorkers": 1}, "spec.numWorkers", "cel"),
        elastic_case("elastic-tensorflow", {"spec.framework": "tensorflow"}, "spec.elastic", "cel"),
        elastic_case("elastic-jax", {"spec.framework": "jax"}, "spec.elastic", "cel"),
        elastic_case(
            "elastic-gang-scheduling",
            {"spec.scheduling.gangScheduling": True},
            "spec.scheduling.gangScheduling",
            "cel",
        ),
        elastic_case(
            "elastic-port-is-master-port",
            {"spec.elastic": {**bounds, "rendezvous": {"port": 29500}}},
            "spec.elastic.rendezvous.port",
            "cel",
        ),
        elastic_case(
            "elastic-port-is-metrics-port",
            {
                "spec.elastic": {**bounds, "rendezvous": {"port": 9100}},
                "spec.monitoring": {"enabled": True, "metricsPort": 9100},
            },
            "spec.elastic.rendezvous.port",
            "cel",
        ),
        case(
            "env-reserved-rdzv-endpoint",
            {"spec.env": [{"name": "PET_RDZV_ENDPOINT", "value": "x:1"}]},
            "spec.env[0]",
            "cel",
        ),
        transition("elastic-added", {}, {"spec.elastic": {"minWorkers": 1, "maxWorkers": 4}}, "spec.elastic"),
        transition("elastic-removed", ELASTIC, {**ELASTIC, "spec.elastic": DELETE}, "spec.elastic"),
        transition(
            "elastic-bounds-changed",
            ELASTIC,
            {**ELASTIC, "spec.elastic": {**bounds, "maxWorkers": 8}},
            "spec.elastic",
        ),
    ]


def elastic_valid_manifests() -> dict[str, dict[str, Any]]:
    return {
        "elastic": elastic_job(),
        "elastic-settings": elastic_job(
            {
                "spec.elastic": {
                    "minWorkers": 1,
                    "maxWorkers": 8,
                    "maxRestarts": 10,
                    "rendezvous": {"port": 29600, "joinTimeoutSeconds": 900, "lastCallTimeoutSeconds": 5},
                },
                "spec.numWorkers": 8,
            }
        ),
    }


def elastic_valid_updates() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [
        ("elastic-scaled-up", elastic_job(), elastic_job({"spec.numWorkers": 4})),
        ("elastic-scaled-down", elastic_job(), elastic_job({"spec.numWorkers": 2})),
    ]
