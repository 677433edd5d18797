"""XGBoost and PaddlePaddle with the real frameworks, in containers on the real node: the examples as
users apply them (their ConfigMap programs), in the trainer images testbed/images builds from the test
environment's xgboost-cpu and paddlepaddle (trainingjob-trainer:xgboost-<version>,
trainingjob-trainer:paddle-<version>).

- XGBoost: a master and two workers train one booster with xgboost's collective API, the master's
  tracker found through MASTER_ADDR and every pod's rank through RANK; every rank ends with the same
  model (each checks every rank's digest of its trees and predictions, and fails if one differs, so
  the master's success says so), the master reports progress, and its success completes the job.
- PaddlePaddle: two pods start through `python -m paddle.distributed.launch`, which reads the
  operator's PADDLE_* variables; an all_reduce across the pods gives the right sum, and a small model
  trains to Completed with rank 0's progress in status.

One job per framework proves all of it: the real node's tests run one after another (docs in
testbed/README.md, "How make test uses it").
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from crd import contract
from testbed import Kubectl, trainer_image
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import condition, get_job, wait
from tests.e2e.realnode import job_on_node

JsonDict = dict[str, Any]

pytestmark = [pytest.mark.slow, pytest.mark.images("trainer-xgboost", "trainer-paddle")]

EPOCHS = 2
DEADLINE = 420.0


def apply_example(kubectl: Kubectl, namespace: str, name: str, image: str, memory: str) -> JsonDict:
    """The example's ConfigMap and its TrainingJob, placed on the real node with the trainer image and
    EPOCHS epochs; the job as applied."""
    docs = [doc for doc in yaml.safe_load_all((REPO / "examples" / name).read_text()) if doc]
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            kubectl.apply(doc, "-n", namespace)
    (job,) = (copy.deepcopy(doc) for doc in docs if doc["kind"] == contract.KIND)
    job["spec"]["image"] = image
    job["spec"]["hyperparameters"]["epochs"] = EPOCHS
    job["spec"]["failurePolicy"] = {"backoffLimit": 0}  # a failure fails the test at once
    placed = job_on_node(job, memory=memory, cpu="100m")
    kubectl.apply(placed, "-n", namespace)
    return placed


def finished(kubectl: Kubectl, namespace: str, name: str) -> JsonDict:
    """The job's status once it is Completed or Failed; asserts it Completed."""

    def ended() -> JsonDict | None:
        status: JsonDict = get_job(kubectl, namespace, name).get("status") or {}
        return status if status.get("state") in ("Completed", "Failed") else None

    status = wait(f"TrainingJob {name} finished", ended, timeout=DEADLINE)
    assert status["state"] == "Completed", status.get("message")
    return status


def logs(kubectl: Kubectl, namespace: str, pod: str) -> str:
    return kubectl.run("logs", pod, "-n", namespace, "-c", contract.CONTAINER_NAME)


def test_xgboost_master_and_workers_train_one_booster_to_completed(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    job = apply_example(real_node, namespace, "trainingjob-xgboost.yaml", trainer_image("xgboost"), "512Mi")
    name = str(job["metadata"]["name"])
    done = finished(real_node, namespace, name)
    succeeded = condition(done, "Succeeded")
    assert succeeded is not None
    assert succeeded["reason"] == "MasterSucceeded"
    assert (done["currentEpoch"], done["restartCount"]) == (EPOCHS, 0)
    assert "loss" in done["metrics"]
    log = logs(real_node, namespace, f"{name}-master-0")
    assert "master rank 0 of 3 joined the tracker" in log, log
    found = re.search(r"every rank's model the same: True \((\w+), (\w+), (\w+)\)", log)
    assert found is not None, log
    assert len(set(found.groups())) == 1


def test_paddle_launch_across_pods_all_reduces_and_trains_to_completed(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    job = apply_example(real_node, namespace, "trainingjob-paddle.yaml", trainer_image("paddlepaddle"), "2Gi")
    name = str(job["metadata"]["name"])
    done = finished(real_node, namespace, name)
    assert (done["currentEpoch"], done["restartCount"]) == (EPOCHS, 0)
    assert done["metrics"]["max_weight_error"] < 0.05
    weights = set()
    for rank in range(2):
        log = logs(real_node, namespace, f"{name}-worker-{rank}")
        assert f"process {rank} of 2: all_reduce sum = 3 (expected 3)" in log, log
        found = re.search(r"done: weights (\[.*\])", log)
        assert found is not None, log
        weights.add(found.group(1))
    assert len(weights) == 1, f"the processes' models differ: {weights}"
