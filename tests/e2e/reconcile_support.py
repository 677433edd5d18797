"""What the reconcile tests end to end share (tests/e2e/test_reconcile*.py): the kinds of a job's
supporting objects, reading a pod's environment and owners, and the fixtures of a kubectl that rides
out API server restarts and of a running three-worker job, which each test module binds to its own
names.
"""

from __future__ import annotations

from typing import Any

import pytest

from crd import contract
from testbed import Kubectl
from tests.e2e.jobs import (
    PatientKubectl,
    job_manifest,
    wait_for_state,
)
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]


# Tests that watch the operator's "reconciled" lines need them whatever TJ_TEST_LOG_LEVEL says.
DEBUG = "--log-level=DEBUG"


@pytest.fixture
def kubectl(cluster: Kubectl) -> Kubectl:
    """The project's kubectl, riding out the restarts of the shared API server other tests make."""
    return PatientKubectl.of(cluster)


SUPPORTING_KINDS = ("configmap", "service", "serviceaccount", "role", "rolebinding")


def env_of(pod: JsonDict) -> dict[str, JsonDict]:
    container = pod["spec"]["containers"][0]
    return {entry["name"]: entry for entry in container.get("env", [])}


def value(env: dict[str, JsonDict], name: str) -> str:
    assert name in env, f"{name} missing from {sorted(env)}"
    assert "value" in env[name], env[name]
    return str(env[name]["value"])


def owned_by(obj: JsonDict, job: JsonDict) -> bool:
    owners = obj["metadata"].get("ownerReferences") or []
    return owners == [
        {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND,
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


@pytest.fixture
def running_job(kubectl: Kubectl, namespace: str, operator: OperatorProcess) -> JsonDict:
    """A three-worker PyTorch job with two GPUs per worker and a non-default master port, Running."""
    manifest = job_manifest(
        "bert",
        numWorkers=3,
        gpusPerWorker=2,
        networking={"masterPort": 29600},
        hyperparameters={"learningRate": 0.0005, "batchSize": 32, "epochs": 3},
    )
    kubectl.apply(manifest, "-n", namespace)
    return wait_for_state(kubectl, namespace, "bert", "Running")
