"""XGBoost's and PaddlePaddle's jobs, by pure functions: the pods and the environment each gets
(builders/env.py; docs/env.md), and through controller.planner.plan in a fake cluster
(tests.unit.lifecycle_world) what each role's end does to the job (controller/planner/roles.py;
docs/api.md's tables of the roles).

An XGBoost job with numWorkers 2 has three pods: slot 0 the master (rank 0, the tracker), slots 1 and 2
the workers. A PaddlePaddle job has workers only.
"""

from __future__ import annotations

from typing import Any

import pytest

from builders.env import distributed_env
from crd import contract
from crd.spec import parse
from tests.unit.lifecycle_steps import assert_steady, created_pod_names
from tests.unit.lifecycle_world import World, env_of, make_job, names, world
from tests.unit.test_env import env_of as job_env

XGBOOST = {"spec.framework": "xgboost", "spec.gpusPerWorker": 0}
PADDLE = {"spec.framework": "paddlepaddle", "spec.gpusPerWorker": 0}
MASTER, WORKER0, WORKER1 = range(3)
XGBOOST_PODS = ["mnist-master-0", "mnist-worker-0", "mnist-worker-1"]


def xgboost_world(changes: dict[str, Any] | None = None) -> World:
    return world({**XGBOOST, **(changes or {})})


# ------------------------------------------------------------------------------------------ XGBoost


def test_an_xgboost_job_has_a_master_before_its_workers() -> None:
    replicas = parse(make_job(XGBOOST)).spec.replicas
    assert [(r.type, r.index, r.slot) for r in replicas.all] == [
        (contract.ReplicaType.MASTER, 0, 0),
        (contract.ReplicaType.WORKER, 0, 1),
        (contract.ReplicaType.WORKER, 1, 2),
    ]


@pytest.mark.parametrize(
    ("slot", "role", "rank"), [(0, "master", "0"), (1, "worker", "1"), (2, "worker", "2")]
)
def test_xgboost_gets_kubeflows_contract(slot: int, role: str, rank: str) -> None:
    env = job_env(XGBOOST, slot)
    assert env["TRAININGJOB_REPLICA_TYPE"] == role
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("case-job-master", "29500")
    assert (env["WORLD_SIZE"], env["RANK"]) == ("3", rank)
    assert env["WORKER_ADDRS"] == "case-job-worker-0.case-job-headless,case-job-worker-1.case-job-headless"
    assert env["WORKER_PORT"] == "29500"
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["TRAININGJOB_NUM_WORKERS"] == "2"
    assert not any(name.startswith(("PET_", "PADDLE_", "JAX_")) or name == "TF_CONFIG" for name in env)


def test_the_xgboost_pods_their_status_by_role_and_the_masters_success() -> None:
    w = xgboost_world()
    assert created_pod_names(w.step()) == XGBOOST_PODS
    w.run_to_running()
    assert env_of(w.pod(MASTER))["RANK"] == "0"
    one = {"pending": 0, "active": 1, "succeeded": 0, "failed": 0}
    assert w.status["roles"] == {"master": one, "worker": {**one, "active": 2}}
    assert w.status["roleSummary"] == "master 1/1, worker 2/2"
    assert w.status["replicas"] == 2
    assert_steady(w)
    # The workers' success decides nothing: the master's does, and stops a worker still running.
    w.succeed(WORKER0)
    w.step()
    assert w.state == "Running"
    w.succeed(MASTER)
    result = w.step()
    assert w.state == "Completed"
    succeeded = w.condition("Succeeded")
    assert succeeded is not None
    assert (succeeded["reason"], succeeded["message"]) == (
        "MasterSucceeded",
        "master mnist-master-0 succeeded",
    )
    assert names(result.deletes) == ["mnist-worker-1"]


@pytest.mark.parametrize(("slot", "pod"), [(MASTER, "mnist-master-0"), (WORKER1, "mnist-worker-1")])
def test_an_xgboost_failure_restarts_the_gang(slot: int, pod: str) -> None:
    w = xgboost_world()
    w.run_to_running()
    w.exit(slot, 1, message="tracker lost")
    result = w.step()
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"failure": 1}
    assert f"pod {pod}, container trainer, exit code 1" in w.status["message"]
    assert names(result.deletes) == XGBOOST_PODS


# ------------------------------------------------------------------------------------- PaddlePaddle


@pytest.mark.parametrize("index", [0, 1])
def test_paddle_gets_what_paddle_distributed_launch_reads(index: int) -> None:
    env = job_env({**PADDLE, "spec.numWorkers": 2}, index)
    master = "$(POD_IP):29500" if index == 0 else "case-job-master:29500"
    assert env["PADDLE_MASTER"] == master
    assert (env["PADDLE_NNODES"], env["PADDLE_RANK"], env["PADDLE_NPROC_PER_NODE"]) == ("2", str(index), "1")
    assert env["PADDLE_JOB_ID"] == "case-job"
    assert env["PADDLE_LOG_DIR"] == "/tmp/paddle-log"
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert (env["WORLD_SIZE"], env["RANK"], env["TRAININGJOB_REPLICA_TYPE"]) == ("2", str(index), "worker")
    assert "WORKER_ADDRS" not in env


def test_paddles_master_address_comes_after_the_pod_ip_it_expands() -> None:
    order = [e["name"] for e in distributed_env(parse(make_job(PADDLE)), 0)]
    assert order.index("POD_IP") < order.index("PADDLE_MASTER")


def test_paddle_has_workers_only_and_completes_by_the_success_policy() -> None:
    w = world(PADDLE)
    assert created_pod_names(w.step()) == ["mnist-worker-0", "mnist-worker-1"]
    w.run_to_running()
    assert "roles" not in w.status
    w.succeed(0)
    w.step()
    assert w.state == "Running"
    w.succeed(1)
    w.step()
    succeeded = w.condition("Succeeded")
    assert succeeded is not None
    assert succeeded["reason"] == "AllWorkersSucceeded"
