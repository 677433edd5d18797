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
- Checkpoints on SIGTERM, in both: the job is suspended in the middle of its second epoch; every rank
  stops after the same round (step), rank 0 saves the booster (the model and the optimizer) in the
  grace period and reports it, so the job is Suspended with that checkpoint in status; resumed, every
  rank of the next attempt loads it, says it resumes at that round (step), and trains to Completed.

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
from tests.e2e.jobs import condition, get_job, pods_of, status_of, wait
from tests.e2e.realnode import job_on_node

JsonDict = dict[str, Any]

pytestmark = [pytest.mark.slow, pytest.mark.images("trainer-xgboost", "trainer-paddle")]

EPOCHS = 2
DEADLINE = 420.0
PADDLE_STEPS_PER_EPOCH = 20  # the paddle example's TRAIN_STEPS_PER_EPOCH default
# Checkpoints on a claim the job makes, deleted with it; every pod mounts it at /checkpoints.
CHECKPOINT = {"enabled": True, "storage": {"type": "pvc", "pvc": {"create": {"whenDeleted": "Delete"}}}}


def apply_example(
    kubectl: Kubectl, namespace: str, name: str, image: str, *, memory: str, step_seconds: float
) -> JsonDict:
    """The example's ConfigMap and its TrainingJob, placed on the real node with the trainer image,
    EPOCHS epochs, checkpoint storage and each step (round) held to `step_seconds` (the programs'
    TRAIN_STEP_SECONDS: long enough to suspend the job in its second epoch); the job as applied."""
    docs = [doc for doc in yaml.safe_load_all((REPO / "examples" / name).read_text()) if doc]
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            kubectl.apply(doc, "-n", namespace)
    (job,) = (copy.deepcopy(doc) for doc in docs if doc["kind"] == contract.KIND)
    job["spec"]["image"] = image
    job["spec"]["hyperparameters"]["epochs"] = EPOCHS
    job["spec"]["failurePolicy"] = {"backoffLimit": 0}  # a failure fails the test at once
    job["spec"]["checkpoint"] = CHECKPOINT
    job["spec"]["env"] = [*job["spec"]["env"], {"name": "TRAIN_STEP_SECONDS", "value": str(step_seconds)}]
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


def suspend_mid_epoch_two_and_resume(kubectl: Kubectl, namespace: str, name: str, steps: int) -> int:
    """Suspends the job once rank 0 reported its first epoch (of `steps` steps), waits until it is
    Suspended with every pod gone (so rank 0's last report is in status), and resumes it; the step of
    the checkpoint rank 0 saved on SIGTERM, which must be in the second epoch."""

    def in_epoch_two() -> JsonDict | None:
        status = status_of(kubectl, namespace, name)
        return (
            status if status.get("state") == "Running" and int(status.get("currentEpoch") or 0) >= 1 else None
        )

    wait(f"{name} past epoch 1", in_epoch_two, timeout=DEADLINE)
    kubectl.run(
        "patch", "trainingjob", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )

    def suspended() -> JsonDict | None:
        status = status_of(kubectl, namespace, name)
        gone = status.get("state") == "Suspended" and not pods_of(kubectl, namespace, name)
        return status if gone else None

    status = wait(f"{name} Suspended, its pods gone", suspended, timeout=180)
    latest = str((status.get("checkpoint") or {}).get("latest"))
    saved = re.fullmatch(r"/checkpoints/epoch-1-step-(\d+)", latest)
    assert saved is not None, status
    step = int(saved.group(1))
    assert steps < step < 2 * steps, f"saved at step {step}, not in epoch 2 of {steps}-step epochs"
    kubectl.run(
        "patch", "trainingjob", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    return step


def test_xgboost_master_and_workers_train_one_booster_to_completed(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    job = apply_example(
        real_node,
        namespace,
        "trainingjob-xgboost.yaml",
        trainer_image("xgboost"),
        memory="512Mi",
        step_seconds=1.5,
    )
    name = str(job["metadata"]["name"])
    rounds = int(job["spec"]["hyperparameters"]["additionalParams"]["rounds_per_epoch"])
    saved = suspend_mid_epoch_two_and_resume(real_node, namespace, name, rounds)
    done = finished(real_node, namespace, name)
    succeeded = condition(done, "Succeeded")
    assert succeeded is not None
    assert succeeded["reason"] == "MasterSucceeded"
    assert (done["currentEpoch"], done["restartCount"], done["attempt"]) == (EPOCHS, 0, 1)
    assert "loss" in done["metrics"]
    for rank, pod in enumerate([f"{name}-master-0", f"{name}-worker-0", f"{name}-worker-1"]):
        log = logs(real_node, namespace, pod)
        resumed = f"rank {rank}: resuming at round {saved} from /checkpoints/epoch-1-step-{saved}"
        assert resumed in log, log
    log = logs(real_node, namespace, f"{name}-master-0")
    assert "master rank 0 of 3 joined the tracker" in log, log
    assert f"rank 0: {EPOCHS * rounds} trees" in log, log  # the saved rounds' trees and the rest
    found = re.search(r"every rank's model the same: True \((\w+), (\w+), (\w+)\)", log)
    assert found is not None, log
    assert len(set(found.groups())) == 1


def test_paddle_launch_across_pods_all_reduces_and_trains_to_completed(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    job = apply_example(
        real_node,
        namespace,
        "trainingjob-paddle.yaml",
        trainer_image("paddlepaddle"),
        memory="2Gi",
        step_seconds=0.4,
    )
    name = str(job["metadata"]["name"])
    saved = suspend_mid_epoch_two_and_resume(real_node, namespace, name, PADDLE_STEPS_PER_EPOCH)
    done = finished(real_node, namespace, name)
    assert (done["currentEpoch"], done["restartCount"], done["attempt"]) == (EPOCHS, 0, 1)
    assert done["metrics"]["max_weight_error"] < 0.05
    weights = set()
    for rank in range(2):
        log = logs(real_node, namespace, f"{name}-worker-{rank}")
        assert f"process {rank} of 2: all_reduce sum = 3 (expected 3)" in log, log
        assert f"process {rank}: resuming at step {saved} from /checkpoints/epoch-1-step-{saved}" in log, log
        found = re.search(r"done: weights (\[.*\])", log)
        assert found is not None, log
        weights.add(found.group(1))
    assert len(weights) == 1, f"the processes' models differ: {weights}"
