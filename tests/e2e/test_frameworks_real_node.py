"""Every framework the API accepts, in containers on the real node: TensorFlow's strategies and replica
roles, JAX across processes, and a preempted rank whose work is not lost.

Why: the environment contract (docs/env.md) claims these frameworks work with what the operator
injects; here the examples' programs (their ConfigMaps) run in the trainer images on the local
cluster's real node (testbed/node/realnode.py), their peers found through CoreDNS and the job's
Services, their traffic over the pod network, and the operator reacts to what a real kubelet reports:

- MultiWorkerMirroredStrategy across two workers, to Completed;
- ParameterServerStrategy with a chief, two workers and a parameter server, to Completed by the chief
  (the workers and the parameter server are stopped);
- an evaluator that exits 1: recorded, and the job still Completes;
- a worker that exits 1: the gang restarts, and Completes;
- three JAX processes: a psum over every process, to Completed;
- the reference trainer with real torch, a rank evicted mid-epoch (Eviction API): the ranks stop after
  the step where the signal came, rank 0 saves and reports it, the next attempt resumes at that step,
  and no backoffLimit is spent.

The jobs name the trainer images testbed/images builds from the test environment's frameworks:
trainingjob-trainer:tensorflow-<version> and trainingjob-trainer:jax-<version>, the versions of the
tensorflow-cpu and jax distributions installed here; the PyTorch job runs its framework's default
image, which the node has as the torch trainer image.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from typing import Any

import pytest
import yaml

from crd import contract
from testbed import Kubectl, trainer_image
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import condition, job_manifest, pods_of, status_of, wait, wait_for_state
from tests.e2e.kueue_support import gpu_queue, queued_job, workload_priority_classes
from tests.e2e.realnode import SELECTOR, TOLERATION, job_on_node

JsonDict = dict[str, Any]

pytestmark = [pytest.mark.slow, pytest.mark.images("trainer-tensorflow", "trainer-jax")]

TENSORFLOW_IMAGE = trainer_image("tensorflow")
JAX_IMAGE = trainer_image("jax")
# TensorFlow starts slowly in a container on two cores; a whole job gets this long.
DEADLINE = 600.0
EPOCHS = 2


def example(name: str) -> list[JsonDict]:
    return [doc for doc in yaml.safe_load_all((REPO / "examples" / name).read_text()) if doc]


def apply_example(kubectl: Kubectl, namespace: str, name: str, image: str, **spec: Any) -> JsonDict:
    """Applies the example's ConfigMap and its TrainingJob, placed on the real node, with `image` and the
    `spec` fields given; returns the job as applied."""
    docs = example(name)
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            kubectl.apply(doc, "-n", namespace)
    (job,) = (copy.deepcopy(doc) for doc in docs if doc["kind"] == contract.KIND)
    job["spec"].update(image=image, **spec)
    job["spec"]["hyperparameters"] = {**job["spec"].get("hyperparameters", {}), "epochs": EPOCHS}
    placed = job_on_node(job, memory="1Gi", cpu="100m")
    kubectl.apply(placed, "-n", namespace)
    return placed


def logs(kubectl: Kubectl, namespace: str, pod: str) -> str:
    return kubectl.run("logs", pod, "-n", namespace, "-c", contract.CONTAINER_NAME)


def tensorflow_job(kubectl: Kubectl, namespace: str, **spec: Any) -> str:
    """The TensorFlow example on the node, its checkpoint claim deleted with the job; its name."""
    checkpoint = {"enabled": True, "storage": {"type": "pvc", "pvc": {"create": {"whenDeleted": "Delete"}}}}
    job = apply_example(
        kubectl, namespace, "trainingjob-tensorflow.yaml", TENSORFLOW_IMAGE, checkpoint=checkpoint, **spec
    )
    return str(job["metadata"]["name"])


def failing(task: str) -> list[JsonDict]:
    """The example's environment, with the task `task` (a role, or <role>-<index>) exiting 1 at its
    start in the job's first attempt (the program's TRAIN_FAIL_ROLE)."""
    return [
        {"name": "PYTHONPATH", "value": "/etc/trainingjob"},
        {"name": "TRAIN_FAIL_ROLE", "value": task},
    ]


def test_multi_worker_mirrored_strategy_trains_across_pods_to_completed(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    name = tensorflow_job(real_node, namespace, numWorkers=2, tensorflow={})
    done = wait_for_state(real_node, namespace, name, "Completed", timeout=DEADLINE)["status"]
    assert (done["currentEpoch"], done["restartCount"]) == (EPOCHS, 0)
    assert done["checkpoint"]["latest"] == f"/checkpoints/epoch-{EPOCHS}"
    finals = set()
    for index in range(2):
        log = logs(real_node, namespace, f"{name}-worker-{index}")
        assert "(2 replicas)" in log, log
        found = re.search(r"done: held-out loss (\d+\.\d+)", log)
        assert found is not None, log
        finals.add(found.group(1))
    assert len(finals) == 1, f"the workers' models differ: {finals}"


@pytest.mark.long
def test_parameter_server_strategy_with_a_chief_two_workers_and_a_ps_completes(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    name = tensorflow_job(real_node, namespace, tensorflow={"chief": 1, "ps": 1})
    done = wait_for_state(real_node, namespace, name, "Completed", timeout=DEADLINE)["status"]
    succeeded = condition(done, "Succeeded")
    assert succeeded is not None
    assert succeeded["reason"] == "ChiefSucceeded"
    assert (done["currentEpoch"], done["restartCount"]) == (EPOCHS, 0)
    assert f"chief 0: epoch {EPOCHS}/{EPOCHS}" in logs(real_node, namespace, f"{name}-chief-0")
    # The workers and the parameter server served until the chief was done; the job's end stopped them.
    wait(
        "only the chief's pod left",
        lambda: [p["metadata"]["name"] for p in pods_of(real_node, namespace, name)] == [f"{name}-chief-0"],
        timeout=120,
    )


def test_an_evaluator_that_exits_1_does_not_fail_the_job(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    name = tensorflow_job(
        real_node,
        namespace,
        tensorflow={"chief": 1, "ps": 1, "evaluator": 1},
        env=failing("evaluator"),
    )
    done = wait_for_state(real_node, namespace, name, "Completed", timeout=DEADLINE)["status"]
    recorded = condition(done, "EvaluatorFailed")
    assert recorded is not None
    assert recorded["status"] == "True"
    assert f"pod {name}-evaluator-0, container trainer, exit code 1" in recorded["message"]
    assert done["restartCount"] == 0


@pytest.mark.long
def test_a_worker_that_exits_1_restarts_the_gang(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    name = tensorflow_job(
        real_node,
        namespace,
        numWorkers=2,
        tensorflow={},
        env=failing("worker-1"),
        failurePolicy={"restartBackoff": {"initialDelaySeconds": 0}},
    )
    done = wait_for_state(real_node, namespace, name, "Completed", timeout=DEADLINE)["status"]
    assert done["restarts"] == {"failure": 1}
    assert done["attempt"] == 1
    assert done["currentEpoch"] == EPOCHS


def test_jax_processes_psum_across_pods_to_completed(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    job = apply_example(real_node, namespace, "trainingjob-jax.yaml", JAX_IMAGE)
    name = str(job["metadata"]["name"])
    workers = int(job["spec"]["numWorkers"])
    done = wait_for_state(real_node, namespace, name, "Completed", timeout=DEADLINE)["status"]
    assert done["currentEpoch"] == EPOCHS
    expected = workers * (workers + 1) // 2
    for index in range(workers):
        log = logs(real_node, namespace, f"{name}-worker-{index}")
        assert f"process {index} of {workers}: psum over every process = {expected}" in log, log


def test_a_rank_evicted_mid_epoch_resumes_at_the_step_where_the_signal_came(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    steps = 20
    pace = {"TRAIN_STEPS_PER_EPOCH": str(steps), "TRAIN_STEP_SECONDS": "0.2", "TRAIN_PROGRESS_INTERVAL": "0"}
    job = job_on_node(
        job_manifest(
            "preempted",
            hyperparameters={"epochs": 3},
            checkpoint={
                "enabled": True,
                "storage": {"type": "pvc", "pvc": {"create": {"whenDeleted": "Delete"}}},
            },
            failurePolicy={"backoffLimit": 0, "restartBackoff": {"initialDelaySeconds": 0}},
            env=[{"name": key, "value": value} for key, value in pace.items()],
        )
    )
    real_node.apply(job, "-n", namespace)

    def in_epoch_two() -> JsonDict | None:
        status = status_of(real_node, namespace, "preempted")
        return (
            status if status.get("state") == "Running" and int(status.get("currentEpoch") or 0) >= 1 else None
        )

    wait("preempted past epoch 1", in_epoch_two, timeout=DEADLINE)
    # Rank 1's log, followed until its pod goes: it says during which step SIGTERM came.
    follow = subprocess.Popen(
        [*real_node.command(), "logs", "-f", "preempted-worker-1", f"--namespace={namespace}", "-c=trainer"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "preempted-worker-1"}}
    try:
        real_node.run(
            "create",
            "--raw",
            f"/api/v1/namespaces/{namespace}/pods/preempted-worker-1/eviction",
            "-f",
            "-",
            stdin=json.dumps(eviction),
        )
        rank1, _ = follow.communicate(timeout=180)
    finally:
        follow.kill()
    signalled = re.search(r"SIGTERM received during step (\d+)", rank1)
    assert signalled is not None, rank1
    step = int(signalled.group(1))
    assert steps < step < 2 * steps, "mid-epoch 2"

    def restarted() -> JsonDict | None:
        status = status_of(real_node, namespace, "preempted")
        return status if status.get("attempt") == 1 and status.get("state") == "Running" else None

    status = wait("the gang's next attempt running", restarted, timeout=DEADLINE)
    assert status["restarts"] == {"disruption": 1}, "an eviction spends no backoffLimit"
    saved = f"/checkpoints/epoch-1-step-{step}"
    assert status["checkpoint"]["latest"] == saved
    resumed = wait(
        "the new rank 0 resuming",
        lambda: "resuming from epoch 1 (checkpoint" in logs(real_node, namespace, "preempted-worker-0"),
        timeout=300,
    )
    assert resumed
    assert (
        f"resuming from epoch 1 (checkpoint {saved}): 2 of 3 epochs left, at step {step} of {3 * steps}"
        in logs(real_node, namespace, "preempted-worker-0")
    )
    done = wait_for_state(real_node, namespace, "preempted", "Completed", timeout=DEADLINE)["status"]
    assert done["restarts"] == {"disruption": 1}
    assert done["currentEpoch"] == 3


@pytest.mark.long
def test_a_job_preempted_by_kueue_resumes_at_the_step_where_the_signal_came(
    real_node: Kubectl, kueue: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """Kueue preempts a running job for a higher-priority one: the operator suspends it, every rank
    gets SIGTERM, rank 0 saves and reports the step they stopped at; readmitted, it resumes there."""
    steps = 20
    pace = {"TRAIN_STEPS_PER_EPOCH": str(steps), "TRAIN_STEP_SECONDS": "0.2", "TRAIN_PROGRESS_INTERVAL": "0"}
    with (
        gpu_queue(
            real_node,
            namespace,
            gpus=2,
            node_labels=SELECTOR,
            tolerations=[TOLERATION],
            quota={"cpu": "1", "memory": "4Gi"},
        ),
        workload_priority_classes(real_node, low=10, high=1000) as classes,
    ):
        start_operator("--progress-interval=0")
        low = job_on_node(
            queued_job(
                "low",
                priority=classes["low"],
                numWorkers=2,
                gpusPerWorker=1,
                hyperparameters={"epochs": 3},
                checkpoint={
                    "enabled": True,
                    "storage": {"type": "pvc", "pvc": {"create": {"whenDeleted": "Delete"}}},
                },
                failurePolicy={"backoffLimit": 0},
                env=[{"name": key, "value": value} for key, value in pace.items()],
            )
        )
        real_node.apply(low, "-n", namespace)

        def in_epoch_two() -> JsonDict | None:
            status = status_of(real_node, namespace, "low")
            running = status.get("state") == "Running" and int(status.get("currentEpoch") or 0) >= 1
            return status if running else None

        wait("low past epoch 1", in_epoch_two, timeout=DEADLINE)
        follow = subprocess.Popen(
            [*real_node.command(), "logs", "-f", "low-worker-0", f"--namespace={namespace}", "-c=trainer"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            high = job_on_node(
                queued_job(
                    "high",
                    priority=classes["high"],
                    numWorkers=1,
                    gpusPerWorker=1,
                    image="python:3.11-slim",
                    command=["python3", "-c", "print('the high-priority job ran')"],
                ),
                memory="64Mi",
            )
            real_node.apply(high, "-n", namespace)
            rank0, _ = follow.communicate(timeout=180)
        finally:
            follow.kill()
        # Whichever rank the kubelet signals first, every rank stops after the same step (they agree
        # on it after each step) and rank 0 saves that one.
        stopped = re.search(r"stopping at step (\d+) of", rank0)
        assert stopped is not None, rank0
        step = int(stopped.group(1))
        assert steps < step < 2 * steps, "mid-epoch 2"
        saved = f"/checkpoints/epoch-1-step-{step}"

        def preempted() -> JsonDict | None:
            status = status_of(real_node, namespace, "low")
            return status if (status.get("queue") or {}).get("evictions") == 1 else None

        status = wait("low evicted by Kueue", preempted, timeout=120)
        assert status["checkpoint"]["latest"] == saved
        wait_for_state(real_node, namespace, "high", "Completed", timeout=DEADLINE)
        done = wait_for_state(real_node, namespace, "low", "Completed", timeout=DEADLINE)["status"]
        log = logs(real_node, namespace, "low-worker-0")
        assert (
            f"resuming from epoch 1 (checkpoint {saved}): 2 of 3 epochs left, at step {step} of {3 * steps}"
            in log
        )
        # A preemption is neither a failure nor a restart: no backoffLimit spent.
        assert (done["restartCount"], done.get("restarts", {})) == (0, {})
        assert done["queue"]["admissions"] == 2
        assert done["currentEpoch"] == 3
