"""controller.planner.plan for elastic jobs (spec.elastic), stepped through their lives in a fake cluster.

A worker lost to a disruption shrinks the world (no gang restart, nothing counted against backoffLimit
or maxDisruptionRestarts) and is replaced; fewer than minWorkers left, or worker 0 (the rendezvous
host) lost, falls back to a gang restart; an application failure keeps failurePolicy's verdict; a
scale moves numWorkers within the bounds without a restart.
"""

from __future__ import annotations

from typing import Any

import pytest

from crd import contract
from tests.unit.lifecycle_steps import assert_steady, created_pod_names
from tests.unit.lifecycle_world import INSUFFICIENT_GPU, World, names, world

ELASTIC = {"spec.elastic": {"minWorkers": 2, "maxWorkers": 4}}
W0, W1, W2, W3 = (f"mnist-worker-{index}" for index in range(4))


def elastic_world(workers: int = 3, changes: dict[str, Any] | None = None, **kwargs: Any) -> World:
    return world({**ELASTIC, **(changes or {})}, workers=workers, **kwargs)


def running(workers: int = 3, changes: dict[str, Any] | None = None, **kwargs: Any) -> World:
    w = elastic_world(workers, changes, **kwargs)
    w.run_to_running()
    return w


def condition_of(w: World, type_: str) -> dict[str, Any]:
    found = w.condition(type_)
    assert found is not None, type_
    return found


def reasons(w: World) -> list[str]:
    return [event.reason for event in w.events]


def elastic_status(w: World) -> dict[str, Any]:
    return dict(w.status.get("elastic") or {})


def assert_no_restart(w: World) -> None:
    assert w.status["restartCount"] == 0
    assert not w.status.get("restarts")
    assert "restartAt" not in w.status
    assert w.status["attempt"] == 0


# ---------------------------------------------------------------------------------------------------
# Starting


def test_pods_of_an_elastic_job_record_no_size() -> None:
    w = elastic_world()
    w.settle()
    assert contract.NUM_WORKERS_ANNOTATION not in (w.pod(1)["metadata"].get("annotations") or {})
    assert w.pod(1)["spec"]["containers"][0]["command"] == list(contract.ELASTIC_DEFAULT_COMMAND)


def test_an_elastic_job_runs_once_min_workers_run_and_the_others_wait_without_a_timeout() -> None:
    w = elastic_world(changes={"spec.scheduling.scheduleTimeoutSeconds": 60})
    w.settle()
    w.start(0, 1)
    w.unschedulable(2)
    w.step()
    assert w.state == "Running"
    assert w.status["message"] == (
        f"2/3 workers running (elastic.minWorkers 2); waiting for {W2} ({INSUFFICIENT_GPU})"
    )
    assert condition_of(w, "Running")["reason"] == "MinWorkersRunning"
    w.step(600)  # far past scheduleTimeoutSeconds: the ones that run are not released
    assert w.state == "Running"
    assert_no_restart(w)
    w.start(2)
    w.step()
    assert w.status["message"] == "3/3 workers running"
    assert condition_of(w, "Running")["reason"] == "AllWorkersRunning"
    assert_steady(w)


def test_fewer_than_min_workers_scheduled_still_time_out() -> None:
    w = elastic_world(changes={"spec.scheduling.scheduleTimeoutSeconds": 60})
    w.settle()
    w.start(0)
    w.unschedulable(1, 2)
    w.step()
    assert w.state == "Pending"
    w.step(61)
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"scheduling": 1}


def test_the_scale_subresource_sees_the_pods_and_their_selector() -> None:
    w = running()
    assert w.status["replicas"] == 3
    assert w.status["selector"] == "training-job=mnist,app.kubernetes.io/managed-by=trainingjob-operator"


# ---------------------------------------------------------------------------------------------------
# Shrinking and growing back


@pytest.mark.parametrize("reason", ["PreemptionByScheduler", "EvictionByEvictionAPI", "TerminationByKubelet"])
def test_a_worker_lost_to_a_disruption_shrinks_the_world_and_is_replaced(reason: str) -> None:
    w = running(graceful=True)
    w.disrupt(2, reason)
    lost = w.step()
    assert lost.deletes == []  # already on its way out
    assert w.state == "Running"
    assert_no_restart(w)
    assert elastic_status(w) == {"shrinks": 1, "replacing": [2], "lastShrinkReason": reason}
    assert w.status["message"].startswith(f"pod {W2}, reason {reason}")
    assert "the other 2 worker(s) continue without a gang restart (elastic)" in w.status["message"]
    [event] = [event for event in w.events if event.reason == "WorkerLost"]
    assert event.type == "Warning"
    # While the lost pod terminates its name is taken: nothing is created, nothing counted again.
    waiting = w.step()
    assert waiting.creates == []
    assert w.status["message"] == f"2/3 workers running; {W2} will be created once the old pod has terminated"
    assert elastic_status(w)["shrinks"] == 1
    # Once the lost pod is gone its name is free again.
    w.finish_terminating()
    replaced = w.step()
    assert created_pod_names(replaced) == [W2]
    assert w.state == "Running"
    assert condition_of(w, "Created")["status"] == "False"
    w.settle()
    assert elastic_status(w)["shrinks"] == 1
    assert condition_of(w, "Created")["status"] == "True"
    w.start(2)
    w.step()
    assert elastic_status(w) == {"shrinks": 1, "grows": 1, "replacing": [], "lastShrinkReason": reason}
    assert "WorkerRejoined" in reasons(w)
    assert w.status["message"] == "3/3 workers running"
    assert_no_restart(w)
    assert_steady(w)


def test_a_lost_worker_held_by_its_tracking_finalizer_is_counted_once() -> None:
    # Preempted and deleted before any reconcile saw it: the tracking finalizer keeps the pod, and its
    # DisruptionTarget condition, until the status counts the loss; every later look counts nothing new.
    w = running(tracking=True)
    w.disrupt(2, "PreemptionByScheduler")
    w.confirm(w.pod(2))
    assert W2 in w.pods, "the finalizer holds the deleted pod"
    shrunk = w.step()
    assert elastic_status(w)["shrinks"] == 1
    assert [release.name for release in shrunk.releases] == [W2]
    assert W2 not in w.pods
    w.settle()
    assert W2 in w.pods
    assert elastic_status(w)["shrinks"] == 1
    w.start(2)
    w.settle()
    assert elastic_status(w) == {
        "shrinks": 1,
        "grows": 1,
        "replacing": [],
        "lastShrinkReason": "PreemptionByScheduler",
    }
    assert_no_restart(w)


def test_a_failed_pod_of_a_disruption_is_deleted_and_replaced() -> None:
    w = running()
    w.disrupt(1, "TerminationByKubelet", delete=False, phase="Failed")
    lost = w.step()
    assert names(lost.deletes) == [W1]
    assert elastic_status(w)["replacing"] == [1]
    w.settle()
    assert w.pod(1)["status"]["phase"] == "Pending"
    assert_no_restart(w)


def test_a_worker_on_a_lost_node_shrinks_the_world() -> None:
    w = running()
    w.set_node_ready("node-2", None)
    w.step()
    assert w.state == "Running"
    assert elastic_status(w)["lastShrinkReason"] == "NodeLost"
    assert w.pod(2)["metadata"].get("deletionTimestamp")  # no kubelet confirms it
    w.step(w.settings.force_delete_after)
    w.settle()
    assert w.pod(2)["status"]["phase"] == "Pending"  # the replacement
    assert_no_restart(w)


def test_a_pod_deleted_by_someone_else_shrinks_the_world() -> None:
    w = running(graceful=True)
    w.pod(1)["metadata"]["deletionTimestamp"] = w.pod(0)["metadata"]["creationTimestamp"]
    w.step()
    assert elastic_status(w) == {"shrinks": 1, "replacing": [1], "lastShrinkReason": "PodDeleted"}
    assert_no_restart(w)


def test_a_replacement_lost_before_it_ran_is_not_another_shrink() -> None:
    w = running(graceful=True)
    w.disrupt(2, "PreemptionByScheduler")
    w.step()
    w.finish_terminating()
    w.settle()
    w.bind(2)
    w.disrupt(2, "PreemptionByScheduler", delete=False, phase="Failed")
    again = w.step()
    assert names(again.deletes) == [W2]
    assert elastic_status(w)["shrinks"] == 1
    w.finish_terminating()
    w.settle()
    w.start(2)
    w.settle()
    assert (elastic_status(w)["shrinks"], elastic_status(w)["grows"]) == (1, 1)


def test_a_replacement_lost_after_it_rejoined_is_a_new_shrink() -> None:
    w = running()
    for _ in range(2):
        w.disrupt(2, "PreemptionByScheduler")
        w.step()
        w.finish_terminating()
        w.settle()
        w.start(2)
        w.settle()
    assert (elastic_status(w)["shrinks"], elastic_status(w)["grows"]) == (2, 2)
    assert_no_restart(w)


# ---------------------------------------------------------------------------------------------------
# When the job cannot shrink


def test_losing_a_worker_below_min_workers_restarts_the_gang_as_a_disruption() -> None:
    w = running(2, {"spec.elastic": {"minWorkers": 2, "maxWorkers": 4}})
    w.disrupt(1, "PreemptionByScheduler")
    w.step()
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"disruption": 1}
    assert "1 worker(s) would be left, fewer than elastic.minWorkers 2" in w.status["message"]
    assert not elastic_status(w)


def test_losing_worker_zero_restarts_the_gang_because_it_hosts_the_rendezvous() -> None:
    w = running()
    w.disrupt(0, "PreemptionByScheduler")
    w.step()
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"disruption": 1}
    assert f"{W0} it hosts the rendezvous (PET_RDZV_ENDPOINT)" in w.status["message"]


def test_an_application_failure_keeps_the_failure_policy() -> None:
    w = running()
    w.exit(2, 1, message="Traceback: ValueError")
    w.step()
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"failure": 1}
    assert not elastic_status(w)


def test_an_application_failure_of_a_replacement_keeps_the_failure_policy() -> None:
    w = running()
    w.disrupt(2, "PreemptionByScheduler")
    w.step()
    w.finish_terminating()
    w.settle()
    w.exit(2, 1)
    w.step()
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"failure": 1}


def test_a_gang_restart_forgets_the_workers_being_replaced() -> None:
    w = running(graceful=True)
    w.disrupt(2, "PreemptionByScheduler")
    w.step()
    assert elastic_status(w)["replacing"] == [2]
    w.disrupt(1, "PreemptionByScheduler")  # now fewer than minWorkers would be left
    w.step()
    assert w.state == "Restarting"
    w.finish_terminating()
    w.step(3600)
    assert w.status["attempt"] == 1
    assert elastic_status(w) == {"shrinks": 1, "lastShrinkReason": "PreemptionByScheduler"}


# ---------------------------------------------------------------------------------------------------
# Scaling and finishing


def test_scaling_up_and_down_within_the_bounds_adds_and_removes_workers_without_a_restart() -> None:
    w = running()
    w.update_spec(numWorkers=4)
    added = w.step()
    assert created_pod_names(added) == [W3]
    assert w.state == "Running"
    w.settle()
    w.start(3)
    w.settle()
    assert w.status["message"] == "4/4 workers running"
    assert w.status["replicas"] == 4
    w.update_spec(numWorkers=2)
    removed = w.step()
    assert names(removed.deletes) == [W2, W3]
    w.settle()
    assert w.status["message"] == "2/2 workers running"
    assert w.status["replicas"] == 2
    assert_no_restart(w)
    assert not elastic_status(w)  # requested sizes are not shrinks or grows
    assert_steady(w)


def test_a_scale_down_stops_replacing_a_worker_beyond_it() -> None:
    w = running(4, graceful=True)
    w.disrupt(3, "PreemptionByScheduler")
    w.step()
    w.update_spec(numWorkers=3)
    w.finish_terminating()
    w.settle()
    assert elastic_status(w)["replacing"] == []
    assert W3 not in w.pods


def test_worker_zero_succeeding_completes_the_job_and_stops_the_others() -> None:
    w = running()
    w.succeed(0)
    done = w.step()
    assert w.state == "Completed"
    assert condition_of(w, "Succeeded")["reason"] == "AllWorkersSucceeded"
    assert names(done.deletes) == [W1, W2]


def test_progress_is_read_from_the_pod_with_the_newest_report() -> None:
    w = running()
    w.report(0, epoch=2, totalEpochs=5, step=20, time="2026-03-01T12:00:10Z")
    w.report(1, epoch=3, totalEpochs=5, step=30, time="2026-03-01T12:00:20Z")
    w.step()
    assert w.status["currentEpoch"] == 3
