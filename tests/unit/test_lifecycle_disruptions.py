"""controller.planner.plan through whole job lives in a fake cluster (tests.unit.lifecycle_world):
disruptions (preemption, eviction, lost nodes, deleted ranks), force deletion, and the pod-tracking
finalizer that keeps a deleted pod until its end is counted.

Each test steps a stored, defaulted TrainingJob with a fixed clock; tests.unit.lifecycle_steps has
the shared steps and the check that a resting state writes nothing.
"""

from __future__ import annotations

import pytest

from controller.planner import Delete, Settings, plan
from controller.runtime.clock import rfc3339
from crd import contract
from tests.unit.lifecycle_steps import (
    W0,
    W1,
    created_pod_names,
    fail_and_restart,
    until_restarted,
)
from tests.unit.lifecycle_world import (
    World,
    names,
    world,
)


@pytest.mark.parametrize(
    ("reason", "deleted", "phase"),
    [
        ("PreemptionByScheduler", True, None),
        ("EvictionByEvictionAPI", True, None),
        ("DeletionByTaintManager", True, None),
        ("TerminationByKubelet", False, "Failed"),
    ],
)
def test_disruptions_restart_without_consuming_the_backoff_limit(
    reason: str, deleted: bool, phase: str | None
) -> None:
    w = world({"spec.failurePolicy.backoffLimit": 0, "spec.failurePolicy.restartPolicy": "Never"})
    w.run_to_running()
    w.disrupt(1, reason, delete=deleted, phase=phase)
    w.step(2)
    status = w.status
    assert status["state"] == "Restarting", status
    assert status["restarts"] == {"disruption": 1}
    assert status["restartCount"] == 1
    assert status["lastRestartReason"] == reason
    restarting = w.condition("Restarting")
    assert restarting is not None
    assert reason in restarting["message"]
    assert "mnist-worker-1" in restarting["message"]


def test_a_disruption_explains_the_other_ranks_failures() -> None:
    # The preempted rank takes the collective down: rank 0 exits 1 a moment later. The disruption is the
    # root cause, so no backoffLimit is used even though a pod failed with a program error.
    w = world({"spec.failurePolicy.backoffLimit": 0})
    w.run_to_running()
    w.disrupt(1, "EvictionByEvictionAPI", delete=False, phase="Failed")
    w.exit(0, 1, message="NCCL error")
    w.step(2)
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"disruption": 1}


@pytest.mark.parametrize("node_state", ["NotReady", "Unknown", "missing"])
def test_pods_on_a_lost_node_are_restarted_as_a_disruption(node_state: str) -> None:
    w = world({"spec.failurePolicy.backoffLimit": 0})
    w.run_to_running()
    if node_state == "missing":
        w.remove_node("node-1")
    else:
        w.set_node_ready("node-1", None if node_state == "Unknown" else False)
    result = w.step(40)
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"disruption": 1}
    assert w.status["lastRestartReason"] == "NodeLost"
    assert names(result.deletes) == [W0, W1]
    restarting = w.condition("Restarting")
    assert restarting is not None
    assert "node-1" in restarting["message"]


def test_node_loss_is_not_judged_without_a_node_cache() -> None:
    w = world()
    w.run_to_running()
    w.remove_node("node-1")
    w.nodes_known = False
    result = w.step(40)
    assert w.state == "Running"
    assert result.deletes == []


def test_disruption_restarts_have_their_own_cap() -> None:
    w = world({"spec.failurePolicy.maxDisruptionRestarts": 2, "spec.failurePolicy.backoffLimit": 0})
    w.run_to_running()
    for _ in range(2):
        w.disrupt(0, "PreemptionByScheduler", delete=False, phase="Failed")
        w.step(1)
        assert w.state == "Restarting"
        until_restarted(w)
        w.settle()
        w.start()
        w.step(30)
    w.disrupt(0, "PreemptionByScheduler", delete=False, phase="Failed")
    w.step(1)
    assert w.state == "Failed"
    assert w.status["failureReason"] == "DisruptionLimitExceeded"
    assert "PreemptionByScheduler" in w.status["message"]
    assert w.status["restarts"] == {"disruption": 2}


def test_a_rank_deleted_by_someone_else_restarts_the_gang() -> None:
    w = world()
    w.run_to_running()
    del w.pods[W1]
    result = w.step(3)
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"disruption": 1}
    assert result.creates == []
    assert names(result.deletes) == [W0]


def test_pods_stuck_terminating_on_a_lost_node_are_force_deleted() -> None:
    w = world(settings=Settings(force_delete_after=60))
    w.run_to_running()
    w.set_node_ready("node-1", False)
    w.step(1)  # NodeLost: the gang is deleted; rank 1 cannot confirm it and stays Terminating
    assert W0 not in w.pods
    assert w.pods[W1]["metadata"]["deletionTimestamp"]
    result = w.step(30)
    assert result.deletes == []
    assert result.requeue_after == pytest.approx(30)
    assert result.creates == []
    uid = w.pods[W1]["metadata"]["uid"]
    result = w.step(30)
    assert result.deletes == [Delete("Pod", W1, uid, "stuck terminating on lost node node-1", force=True)]
    assert w.pods == {}
    assert created_pod_names(w.step(1)) == [W0, W1]


def test_a_tracked_pod_on_a_lost_node_is_released_then_force_deleted() -> None:
    w = world(settings=Settings(force_delete_after=60), tracking=True)
    w.run_to_running()
    w.set_node_ready("node-1", False)
    w.step(1)  # NodeLost: the gang is deleted; both pods are held by their finalizer
    assert sorted(w.pods) == [W0, W1]
    released = w.step()
    # W0's kubelet confirmed its deletion; W1's trainer may still run (its node is only unreachable) and
    # report, until its grace period is over or it is force-deleted.
    assert sorted(release.name for release in released.releases) == [W0]
    assert W0 not in w.pods  # confirmed by its kubelet, and no longer held
    assert w.pods[W1]["metadata"]["finalizers"] == [contract.TRACKING_FINALIZER]
    uid = w.pods[W1]["metadata"]["uid"]
    result = w.step(60)
    assert result.deletes == [Delete("Pod", W1, uid, "stuck terminating on lost node node-1", force=True)]
    assert [release.name for release in result.releases] == [W1]
    assert w.pods == {}
    assert created_pod_names(w.step(1)) == [W0, W1]


def test_nothing_is_force_deleted_while_the_node_cache_cannot_tell() -> None:
    w = world(settings=Settings(force_delete_after=60))
    w.run_to_running()
    w.set_node_ready("node-1", False)
    w.step(1)
    w.nodes_known = False
    result = w.step(3600)
    assert result.deletes == []
    assert W1 in w.pods


def test_terminating_pods_on_healthy_nodes_are_never_force_deleted() -> None:
    w = world(graceful=True)
    w.run_to_running()
    fail_and_restart(w)
    result = w.step(3600)
    assert not [delete for delete in result.deletes if delete.force]


def test_stuck_pods_are_force_deleted_while_suspended() -> None:
    w = world(settings=Settings(force_delete_after=60))
    w.run_to_running()
    w.set_node_ready("node-0", None)
    w.nodes_known = True
    w.update_spec(suspend=True)
    w.step(1)
    assert w.pods[W0]["metadata"]["deletionTimestamp"]
    w.step(1)
    assert w.status["message"] == "suspending: 1 pod(s) still terminating"
    result = w.step(59)
    assert [(delete.name, delete.force) for delete in result.deletes] == [(W0, True)]
    w.step(1)
    assert w.status["message"] == "suspended"


def test_stuck_pods_of_a_finished_job_are_force_deleted() -> None:
    w = world({"spec.failurePolicy.activeDeadlineSeconds": 100}, settings=Settings(force_delete_after=60))
    w.run_to_running()
    w.set_node_ready("node-1", False)
    w.nodes_known = False  # the node cache is still syncing: no NodeLost verdict
    w.step(100)
    assert w.state == "Failed"
    w.nodes_known = True
    result = w.step(61)
    assert [(delete.name, delete.force) for delete in result.deletes] == [(W1, True)]


def test_stuck_pods_of_a_job_being_deleted_are_force_deleted() -> None:
    # The garbage collector deleted them, but no kubelet on the lost node confirms it.
    w = world(settings=Settings(force_delete_after=60), tracking=True)
    w.run_to_running()
    w.set_node_ready("node-1", None)
    w.job["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    pod = w.pod(1)
    w.delete_pod(Delete("Pod", W1, pod["metadata"]["uid"], "garbage collector"))
    w.step(1)
    assert W1 in w.pods, "released, but nothing confirmed the deletion"
    result = w.step(61)
    assert [(delete.name, delete.force) for delete in result.deletes] == [(W1, True)]
    assert w.state == "Running"
    assert not w.status.get("restarts")


def test_a_node_counts_as_lost_only_after_node_lost_after() -> None:
    scene = world(settings=Settings(node_lost_after=30))
    scene.run_to_running()
    node = scene.pod(1)["spec"]["nodeName"]
    scene.set_node_ready(node, False)
    scene.nodes[node]["status"]["conditions"][0]["lastTransitionTime"] = rfc3339(scene.now)
    blip = scene.step(10)
    assert scene.state == "Running"
    assert blip.deletes == []
    assert blip.requeue_after is not None
    assert blip.requeue_after <= 20
    scene.step(20)
    assert scene.state == "Restarting"
    assert scene.status["lastRestartReason"] == "NodeLost"


def _preempted_and_deleted(scene: World, index: int) -> None:
    """Rank `index` is preempted and deleted while no reconcile runs (the leader is down, say): the
    tracking finalizer keeps the pod, with its DisruptionTarget condition, Terminating."""
    scene.disrupt(index, "PreemptionByScheduler")
    scene.confirm(scene.pod(index))
    assert scene.pod(index)["metadata"]["deletionTimestamp"]


def test_a_rank_preempted_and_deleted_before_the_reconcile_counts_as_preemption() -> None:
    # Rank 1 is preempted and deleted, rank 0 exits 1 a second later (its peer is lost), and only then
    # does a reconcile run: disruption first, so with backoffLimit 0 the gang restarts.
    scene = world({"spec.failurePolicy.backoffLimit": 0}, tracking=True)
    scene.run_to_running()
    _preempted_and_deleted(scene, 1)
    scene.advance(1)
    scene.exit(0, 1, message="peer lost")
    result = scene.step()
    assert result.status["state"] == "Restarting"
    assert result.status["lastRestartReason"] == "PreemptionByScheduler"
    assert result.status["restarts"] == {"disruption": 1}
    # Both ends are in the status now: their pods may go.
    assert sorted(release.name for release in result.releases) == ["mnist-worker-0", "mnist-worker-1"]


def test_a_rank_that_failed_before_it_was_deleted_counts_as_its_failure() -> None:
    scene = world(tracking=True)
    scene.run_to_running()
    scene.exit(1, 1, message="CUDA error")
    scene.advance(2)
    pod = scene.pod(1)
    scene.delete_pod(Delete("Pod", pod["metadata"]["name"], pod["metadata"]["uid"], "someone"))
    result = scene.step()
    assert result.status["lastRestartReason"] == "PodFailed"
    assert result.status["restarts"] == {"failure": 1}


def test_a_rank_deleted_while_running_is_a_deletion_whatever_its_exit_code() -> None:
    scene = world(tracking=True)
    scene.run_to_running()
    pod = scene.pod(1)
    scene.delete_pod(Delete("Pod", pod["metadata"]["name"], pod["metadata"]["uid"], "someone"))
    scene.advance(1)
    scene.exit(1, 143)  # SIGTERM from the kubelet, after the deletion
    result = scene.step()
    assert result.status["lastRestartReason"] == "PodDeleted"
    assert result.status["restarts"] == {"disruption": 1}


def test_every_rank_deleted_at_once_is_one_disruption_restart() -> None:
    # `kubectl delete pods -l ...`, or the namespace going: no live rank is left to show that the gang
    # had formed, but the ranks being deleted show it.
    scene = world({"spec.failurePolicy.backoffLimit": 0}, graceful=True, tracking=True)
    scene.run_to_running()
    for pod in list(scene.pods.values()):
        scene.delete_pod(Delete("Pod", pod["metadata"]["name"], pod["metadata"]["uid"], "someone"))
    result = scene.step()
    assert scene.state == "Restarting"
    assert result.status["lastRestartReason"] == "PodDeleted"
    assert result.status["restarts"] == {"disruption": 1}
    # Their trainers still run in their grace period and may report a checkpoint: held until they stop.
    assert result.releases == ()
    scene.finish_terminating()
    assert sorted(release.name for release in scene.step().releases) == [W0, W1]
    scene.advance(60)
    scene.settle()
    assert scene.status["attempt"] == 1
    assert scene.status["restarts"] == {"disruption": 1}, "counted once"


def test_a_job_being_deleted_creates_and_counts_nothing_and_lets_its_pods_go() -> None:
    # `kubectl delete --cascade=foreground`: the job stays while the garbage collector deletes its
    # pods and Services. Re-creating them, or counting their deletion, would fight the deletion.
    scene = world(graceful=True, tracking=True)
    scene.run_to_running()
    scene.job["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    scene.job["metadata"]["finalizers"] = ["foregroundDeletion"]
    for pod in list(scene.pods.values()):
        scene.delete_pod(Delete("Pod", pod["metadata"]["name"], pod["metadata"]["uid"], "garbage collector"))
    scene.owned.clear()
    result = scene.step()
    assert (result.creates, result.deletes, result.events) == ([], [], [])
    assert (scene.state, scene.status["attempt"], scene.status["restartCount"]) == ("Running", 0, 0)
    assert scene.status["workers"]["active"] == 0, "the status still says what the pods are"
    assert result.releases == ()  # their trainers still run in their grace period
    scene.finish_terminating()
    let_go = scene.step()
    assert sorted(release.name for release in let_go.releases) == [W0, W1]
    assert let_go.creates == []
    assert scene.pods == {}


def test_ranks_of_a_suspended_attempt_still_terminating_after_the_resume_are_no_restart() -> None:
    scene = world(graceful=True, tracking=True)
    scene.run_to_running()
    scene.update_spec(suspend=True)
    scene.step()
    scene.update_spec(suspend=False)
    scene.step()
    assert scene.state == "Pending"
    assert scene.status["attempt"] == 1
    assert len(scene.pods) == 2, "the suspended attempt's pods are still terminating"
    scene.step()
    assert scene.state == "Pending"
    assert not scene.status.get("restarts")


def test_without_its_last_state_the_missing_rank_is_an_unexplained_deletion() -> None:
    # Only when someone strips the tracking finalizer can a rank vanish unseen.
    scene = world()
    scene.run_to_running()
    scene.disrupt(1, "PreemptionByScheduler")
    del scene.pods["mnist-worker-1"]
    result = plan(scene.observed(), scene.settings)
    assert result.status["lastRestartReason"] == "PodDeleted"


def test_a_running_pod_keeps_its_finalizer_and_an_ended_one_is_released() -> None:
    scene = world(tracking=True)
    scene.run_to_running()
    assert scene.step().releases == ()
    assert all(contract.TRACKING_FINALIZER in pod["metadata"]["finalizers"] for pod in scene.pods.values())
    scene.succeed(1)
    result = scene.step()
    assert scene.state == "Running"
    assert [release.name for release in result.releases] == ["mnist-worker-1"]
    assert scene.pod(1)["metadata"]["finalizers"] == []
    scene.succeed(0)
    scene.step()
    assert scene.state == "Completed"
    assert [pod["metadata"]["finalizers"] for pod in scene.pods.values()] == [[], []]


def test_a_preemption_held_by_the_finalizer_restarts_the_gang_once() -> None:
    scene = world({"spec.failurePolicy.backoffLimit": 0}, tracking=True)
    scene.run_to_running()
    _preempted_and_deleted(scene, 1)
    scene.step()
    assert scene.state == "Restarting"
    scene.step()
    until_restarted(scene)
    scene.settle()
    assert (scene.status["attempt"], scene.status["restartCount"]) == (1, 1)
    assert scene.status["restarts"] == {"disruption": 1}
    assert scene.state == "Pending"
