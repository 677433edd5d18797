"""controller.planner.plan through whole job lives in a fake cluster (tests.unit.lifecycle_world):
resize, invalid specs, supporting objects, and resting states that write nothing.

Each test steps a stored, defaulted TrainingJob with a fixed clock; tests.unit.lifecycle_steps has
the shared steps and the check that a resting state writes nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from builders.configmap import TRAINER_SOURCES_NAME
from controller.planner import Observed, plan
from controller.runtime import boundedjson
from crd import contract
from tests.unit.lifecycle_steps import (
    W0,
    W1,
    assert_steady,
    created_pod_names,
    pod_creates,
)
from tests.unit.lifecycle_world import (
    T0,
    World,
    env_of,
    make_job,
    names,
    world,
)


def test_growing_the_gang_restarts_it_with_the_new_world_size() -> None:
    w = world({"spec.failurePolicy.backoffLimit": 0})
    w.run_to_running()
    w.update_spec(numWorkers=4)
    result = w.step(5)
    assert result.creates == []
    assert names(result.deletes) == [W0, W1]
    assert w.state == "Restarting"
    assert w.status["lastRestartReason"] == "Resized"
    assert w.status["restartCount"] == 1
    assert w.status.get("restarts", {}).get("failure", 0) == 0
    result = w.step(1)
    pods = pod_creates(result)
    assert [pod["metadata"]["name"] for pod in pods] == [f"mnist-worker-{i}" for i in range(4)]
    assert all(env_of(pod)["WORLD_SIZE"] == "4" for pod in pods)
    w.start()
    w.step(1)
    w.step(1)
    assert w.state == "Running"
    assert w.status["workers"]["active"] == 4


def test_shrinking_the_gang_deletes_out_of_range_pods_and_restarts() -> None:
    w = world(workers=4, graceful=True)
    w.run_to_running()
    w.update_spec(numWorkers=2)
    result = w.step(5)
    assert names(result.deletes) == [f"mnist-worker-{i}" for i in range(4)]
    assert w.state == "Restarting"
    assert w.step(5).creates == []
    w.finish_terminating()
    result = w.step(1)
    assert created_pod_names(result) == [W0, W1]
    assert all(
        pod["metadata"]["annotations"][contract.NUM_WORKERS_ANNOTATION] == "2" for pod in pod_creates(result)
    )


def test_a_second_pod_for_a_rank_is_deleted() -> None:
    w = world()
    w.run_to_running()
    intruder = copy.deepcopy(w.pod(1))
    intruder["metadata"].update({"name": "mnist-worker-1-copy", "uid": "uid-copy"})
    w.pods["mnist-worker-1-copy"] = intruder
    result = w.step(1)
    assert [(d.name, d.uid) for d in result.deletes] == [("mnist-worker-1-copy", "uid-copy")]
    assert w.state == "Running"


def test_a_pod_beyond_the_world_size_is_deleted() -> None:
    w = world()
    w.run_to_running()
    extra = copy.deepcopy(w.pod(1))
    extra["metadata"].update({"name": "mnist-worker-7", "uid": "uid-7"})
    extra["metadata"]["labels"][contract.REPLICA_INDEX_LABEL] = "7"
    extra["metadata"]["annotations"].pop(contract.NUM_WORKERS_ANNOTATION)
    w.pods["mnist-worker-7"] = extra
    result = w.step(1)
    assert names(result.deletes) == ["mnist-worker-7"]


def test_an_invalid_spec_fails_the_job_without_creating_anything() -> None:
    w = World(make_job({"spec.gpusPerWorker": 0, "spec.networking.backend": "nccl"}))
    result = w.step()
    assert result.creates == []
    assert w.state == "Failed"
    assert w.status["failureReason"] == "InvalidSpec"
    assert "spec.networking.backend" in w.status["message"]
    failed = w.condition("Failed")
    assert failed is not None
    assert failed["reason"] == "InvalidSpec"
    assert [(event.type, event.reason) for event in result.events] == [("Warning", "InvalidSpec")]
    assert_steady(w, 60)


def test_a_spec_that_becomes_invalid_fails_the_running_job() -> None:
    w = world()
    w.run_to_running()
    # resumeFrom may change; a URL does not fit the default pvc storage (only the operator can tell).
    w.update_spec(**{"checkpoint.resumeFrom": "s3://bucket/epoch-3"})
    result = w.step(1)
    assert w.state == "Failed"
    assert w.status["failureReason"] == "InvalidSpec"
    assert "spec.checkpoint.resumeFrom" in w.status["message"]
    assert names(result.deletes) == [W0, W1]


def test_a_spec_cut_by_the_bounded_decoder_fails_the_job_naming_where() -> None:
    deep = '{"nodeAffinity": ' + '{"k": [' * 600 + "1" + "]}" * 600 + "}"
    affinity = boundedjson.loads(deep)
    w = World(make_job({"spec.scheduling.affinity": affinity}))
    result = w.step()
    assert result.creates == []
    assert w.state == "Failed"
    assert w.status["failureReason"] == "InvalidSpec"
    assert "spec.scheduling.affinity.nodeAffinity.k[0]" in w.status["message"]
    assert "nested deeper than 100 levels" in w.status["message"]
    assert_steady(w, 60)


def test_supporting_objects_are_created_once_and_repaired_when_changed() -> None:
    w = world()
    w.run_to_running()
    assert {kind for kind, _ in w.owned} == {"ConfigMap", "ServiceAccount", "RoleBinding", "Service"}
    w.owned[("ConfigMap", TRAINER_SOURCES_NAME)]["data"][contract.TRAINER_FILE] = "print()"
    result = w.step(1)
    assert [(patch.kind, patch.name) for patch in result.patches] == [("ConfigMap", TRAINER_SOURCES_NAME)]
    del w.owned[("Service", "mnist-master")]
    result = w.step(1)
    assert [(obj["kind"], obj["metadata"]["name"]) for obj in result.creates] == [("Service", "mnist-master")]


def test_a_gang_scheduled_job_gets_a_pod_group_and_pods_that_join_it() -> None:
    job = make_job({"spec.scheduling.gangScheduling": True})
    result = plan(Observed(job=job, pods=[], owned={}, nodes={}, now=T0, gang_scheduler="coscheduling"))
    kinds = [obj["kind"] for obj in result.creates]
    assert "PodGroup" in kinds
    assert kinds.index("PodGroup") < kinds.index("Pod")
    pods = pod_creates(result)
    assert all(pod["metadata"]["labels"][contract.COSCHEDULING_POD_GROUP_LABEL] == "mnist" for pod in pods)


def _running(w: World) -> None:
    w.run_to_running()


def _initializing(w: World) -> None:
    w.settle()
    w.bind()
    w.step(1)


def _pending_unschedulable(w: World) -> None:
    w.settle()
    w.unschedulable()
    w.step(1)


def _suspended(w: World) -> None:
    w.run_to_running()
    w.update_spec(suspend=True)
    w.settle()


def _completed(w: World) -> None:
    w.run_to_running()
    w.succeed()
    w.step(1)
    w.step(1)


def _failed(w: World) -> None:
    w.update_spec(**{"failurePolicy.restartPolicy": "Never"})
    w.run_to_running()
    w.exit(1, 1)
    w.step(1)
    w.step(1)


def _restarting_in_backoff(w: World) -> None:
    w.run_to_running()
    w.exit(1, 1)
    w.step(1)
    w.step(1)


def _restarting_waiting_for_pods(w: World) -> None:
    w.graceful = True
    w.run_to_running()
    w.exit(1, 1)
    w.step(1)
    w.step(1)


def _stalled(w: World) -> None:
    w.update_spec(**{"monitoring.progressDeadlineSeconds": 60})
    w.run_to_running()
    w.step(60)


def _deadline_and_ttl(w: World) -> None:
    w.update_spec(**{"failurePolicy.activeDeadlineSeconds": 3600, "ttlSecondsAfterFinished": 3600})
    w.run_to_running()
    w.report(epoch=2, metrics={"accuracy": 0.5}, checkpoint="/ckpt/2")
    w.step(10)


def _completed_awaiting_ttl(w: World) -> None:
    w.update_spec(ttlSecondsAfterFinished=3600)
    w.run_to_running()
    w.succeed()
    w.step(1)


def _pending_schedule_timeout(w: World) -> None:
    w.update_spec(**{"scheduling.scheduleTimeoutSeconds": 600})
    w.settle()
    w.unschedulable()
    w.step(1)


STEADY: dict[str, tuple[Callable[[World], None], str]] = {
    "running": (_running, "Running"),
    "initializing": (_initializing, "Initializing"),
    "pending-unschedulable": (_pending_unschedulable, "Pending"),
    "pending-with-schedule-timeout": (_pending_schedule_timeout, "Pending"),
    "suspended": (_suspended, "Suspended"),
    "completed": (_completed, "Completed"),
    "completed-awaiting-ttl": (_completed_awaiting_ttl, "Completed"),
    "failed": (_failed, "Failed"),
    "restarting-in-backoff": (_restarting_in_backoff, "Restarting"),
    "restarting-waiting-for-pods": (_restarting_waiting_for_pods, "Restarting"),
    "stalled": (_stalled, "Running"),
    "running-with-deadline-and-progress": (_deadline_and_ttl, "Running"),
}


@pytest.mark.parametrize("name", sorted(STEADY))
def test_a_steady_state_plans_no_writes(name: str) -> None:
    setup, state = STEADY[name]
    w = world()
    setup(w)
    assert w.state == state
    assert_steady(w, 1)
    assert_steady(w, 2)


def test_requeue_after_is_the_earliest_pending_deadline() -> None:
    w = world(
        {
            "spec.failurePolicy.activeDeadlineSeconds": 1000,
            "spec.monitoring.progressDeadlineSeconds": 300,
        }
    )
    w.run_to_running()
    result = w.step(10)
    assert result.requeue_after == pytest.approx(290)
