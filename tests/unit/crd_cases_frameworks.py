"""Admission cases of the frameworks added after TensorFlow and JAX: XGBoost (a master besides the
workers, one process per pod), PaddlePaddle, and MXNet refused as retired (the layers are explained in
tests/unit/crd_cases.py)."""

from __future__ import annotations

from typing import Any

from crd import contract
from tests.unit.crd_case_model import InvalidCase, case, job

XGBOOST = {"spec.framework": "xgboost", "spec.gpusPerWorker": 0}
PADDLE = {"spec.framework": "paddlepaddle", "spec.gpusPerWorker": 0}
ELASTIC = {"minWorkers": 1, "maxWorkers": 4}


def frameworks_invalid_cases() -> list[InvalidCase]:
    return [
        case("framework-mxnet-retired", {"spec.framework": "mxnet"}, "spec.framework", "cel"),
        case(
            "xgboost-workers-above-99",
            {**XGBOOST, "spec.numWorkers": contract.MAX_WORKERS},
            "spec.numWorkers",
            "cel",
        ),
        case("xgboost-workers-zero", {**XGBOOST, "spec.numWorkers": 0}, "spec.numWorkers", "schema"),
        case("xgboost-two-gpus", {**XGBOOST, "spec.gpusPerWorker": 2}, "spec.gpusPerWorker", "cel"),
        case(
            "xgboost-tensorflow-roles", {**XGBOOST, "spec.tensorflow": {"chief": 1}}, "spec.tensorflow", "cel"
        ),
        case("xgboost-elastic", {**XGBOOST, "spec.elastic": ELASTIC}, "spec.elastic", "cel"),
        case(
            "paddle-tensorflow-roles",
            {**PADDLE, "spec.tensorflow": {"evaluator": 1}},
            "spec.tensorflow",
            "cel",
        ),
        case("paddle-elastic", {**PADDLE, "spec.elastic": ELASTIC}, "spec.elastic", "cel"),
        case("paddle-workers-above-100", {**PADDLE, "spec.numWorkers": 101}, "spec.numWorkers", "schema"),
    ]


def frameworks_valid_manifests() -> dict[str, dict[str, Any]]:
    return {
        "xgboost-master-and-workers": job(XGBOOST),
        "xgboost-one-gpu": job({**XGBOOST, "spec.gpusPerWorker": 1}),
        "xgboost-99-workers": job({**XGBOOST, "spec.numWorkers": contract.MAX_WORKERS - 1}),
        "paddle-collective": job(PADDLE),
        "paddle-gpus": job({**PADDLE, "spec.gpusPerWorker": 4}),
    }
