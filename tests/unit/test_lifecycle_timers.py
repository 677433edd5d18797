"""controller.planner.plan through whole job lives in a fake cluster (tests.unit.lifecycle_world):
deadlines, suspend and resume, TTL and clean-up, scheduling timeouts, and time arithmetic that never
fires early.

Each test steps a stored, defaulted TrainingJob with a fixed clock; tests.unit.lifecycle_steps has
the shared steps and the check that a resting state writes nothing.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from controller.planner import format_duration
from controller.runtime.clock import parse_time, rfc3339
from crd import contract
from tests.unit.lifecycle_steps import (
    W0,
    W1,
    assert_steady,
    created_pod_names,
    fail_and_restart,
    pod_creates,
    restart_delay_of,
    until_restarted,
)
from tests.unit.lifecycle_world import (
    INSUFFICIENT_GPU,
    env_of,
    names,
    world,
)


def test_active_deadline_fails_the_job_and_removes_its_pods() -> None:
    w = world({"spec.failurePolicy.activeDeadlineSeconds": 300})
    w.run_to_running()
    result = w.step(100)
    assert result.requeue_after == pytest.approx(200)
    w.advance(199)
    assert w.step().deletes == []
    assert w.state == "Running"
    result = w.step(1)
    assert w.state == "Failed"
    assert w.status["failureReason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds (300s)" in w.status["message"]
    failed = w.condition("Failed")
    assert failed is not None
    assert failed["reason"] == "DeadlineExceeded"
    assert names(result.deletes) == [W0, W1]
    assert [(event.type, event.reason) for event in result.events] == [("Warning", "DeadlineExceeded")]


def test_the_deadline_clock_stops_while_suspended() -> None:
    w = world({"spec.failurePolicy.activeDeadlineSeconds": 300})
    w.run_to_running()
    w.step(100)  # 100 s active
    w.update_spec(suspend=True)
    w.settle()
    assert w.state == "Suspended"
    w.step(10_000)
    assert w.state == "Suspended"
    w.update_spec(suspend=False)
    w.step(1)
    w.settle()
    w.start()
    w.step(1)
    assert w.state == "Running"
    w.step(197)  # 100 + 1 + 197 = 298 s active
    assert w.state == "Running"
    w.step(2)
    assert w.state == "Failed"
    assert w.status["failureReason"] == "DeadlineExceeded"


def test_the_deadline_counts_restarts() -> None:
    w = world({"spec.failurePolicy.activeDeadlineSeconds": 60})
    w.run_to_running()
    fail_and_restart(w)
    w.step(61)
    assert w.state == "Failed"
    assert w.status["failureReason"] == "DeadlineExceeded"
    assert "restartAt" not in w.status


def test_suspending_deletes_the_pods_and_says_so() -> None:
    w = world()
    w.run_to_running()
    w.update_spec(suspend=True)
    result = w.step(5)
    assert names(result.deletes) == [W0, W1]
    assert w.state == "Suspended"
    suspended = w.condition("Suspended")
    assert suspended is not None
    assert (suspended["status"], suspended["reason"]) == ("True", "Suspended")
    running = w.condition("Running")
    assert running is not None
    assert running["status"] == "False"
    assert [event.reason for event in result.events] == ["Suspended"]
    # The deletes were only just sent; the next reconcile (the pods' delete events) sees them gone.
    assert w.status["message"] == "suspending: 2 pod(s) still terminating"
    w.step(1)
    assert w.status["message"] == "suspended"
    assert w.status["resources"] == {"gpus": 0, "workers": 0}
    assert w.status["workers"] == {"pending": 0, "active": 0, "succeeded": 0, "failed": 0}


def test_suspending_waits_for_terminating_pods_and_names_them() -> None:
    w = world(graceful=True)
    w.run_to_running()
    w.update_spec(suspend=True)
    w.step(5)
    w.step(5)
    assert w.status["message"] == "suspending: 2 pod(s) still terminating"
    w.finish_terminating()
    w.step(5)
    assert w.status["message"] == "suspended"


def test_resuming_recreates_the_gang_from_the_latest_checkpoint() -> None:
    w = world({"spec.checkpoint.enabled": True})
    w.run_to_running()
    w.report(epoch=3, totalEpochs=10, checkpoint="/checkpoints/epoch-3")
    w.step(10)
    assert w.status["checkpoint"]["latest"] == "/checkpoints/epoch-3"
    fail_and_restart(w)
    until_restarted(w)
    w.settle()
    w.start()
    w.step(5)
    w.update_spec(suspend=True)
    w.settle()
    assert w.pods == {}
    w.step(600)
    w.update_spec(suspend=False)
    result = w.step(1)
    pods = pod_creates(result)
    assert [pod["metadata"]["name"] for pod in pods] == [W0, W1]
    assert all(env_of(pod)["RESUME_FROM"] == "/checkpoints/epoch-3" for pod in pods)
    assert all(pod["metadata"]["labels"][contract.ATTEMPT_LABEL] == "2" for pod in pods)
    assert w.status["restartCount"] == 1
    assert w.status["attempt"] == 2
    suspended = w.condition("Suspended")
    assert suspended is not None
    assert suspended["status"] == "False"
    assert "Resumed" in [event.reason for event in result.events]
    assert w.state == "Pending"
    assert "epoch-3" in w.status["message"]


def test_resuming_waits_for_the_suspended_pods_to_be_gone() -> None:
    w = world(graceful=True)
    w.run_to_running()
    w.update_spec(suspend=True)
    w.step(1)
    w.update_spec(suspend=False)
    result = w.step(1)
    assert pod_creates(result) == []
    assert w.status["message"] == "waiting for 2 pod(s) of a previous attempt to terminate"
    w.finish_terminating()
    assert created_pod_names(w.step(1)) == [W0, W1]


def test_a_job_created_suspended_creates_no_pods() -> None:
    w = world({"spec.suspend": True})
    result = w.step()
    assert pod_creates(result) == []
    assert w.state == "Suspended"
    assert "startTime" not in w.status
    w.update_spec(suspend=False)
    result = w.step(30)
    assert created_pod_names(result) == [W0, W1]
    assert w.status["startTime"] == rfc3339(w.now)


def test_suspending_a_restarting_job_cancels_the_pending_restart() -> None:
    w = world()
    w.run_to_running()
    fail_and_restart(w)
    w.update_spec(suspend=True)
    w.step(1)
    assert w.state == "Suspended"
    assert "restartAt" not in w.status
    restarting = w.condition("Restarting")
    assert restarting is not None
    assert restarting["status"] == "False"
    w.update_spec(suspend=False)
    assert created_pod_names(w.step(1)) == [W0, W1]
    assert w.status["restartCount"] == 1


def test_ttl_after_finished_deletes_the_job_when_it_expires() -> None:
    w = world({"spec.ttlSecondsAfterFinished": 100})
    w.run_to_running()
    w.succeed()
    result = w.step(1)
    assert w.state == "Completed"
    assert result.requeue_after == pytest.approx(100)
    assert not result.delete_job
    result = w.step(60)
    assert result.requeue_after == pytest.approx(40)
    assert not result.delete_job
    result = w.step(40)
    assert result.delete_job
    assert result.events[0].reason == "TTLExpired"


def test_ttl_zero_deletes_a_failed_job_at_once() -> None:
    w = world({"spec.ttlSecondsAfterFinished": 0, "spec.failurePolicy.restartPolicy": "Never"})
    w.run_to_running()
    fail_and_restart(w)
    assert w.state == "Failed"
    assert w.plans[-1].delete_job


def test_without_ttl_a_finished_job_is_kept() -> None:
    w = world()
    w.run_to_running()
    w.succeed()
    w.step(1)
    result = w.step(10**6)
    assert not result.delete_job
    assert result.requeue_after is None


@pytest.mark.parametrize(
    ("policy", "deleted"),
    [("All", [W0, W1]), ("Running", [W0]), ("None", [])],
)
def test_clean_pod_policy_decides_which_pods_of_a_finished_job_go(policy: str, deleted: list[str]) -> None:
    # The job fails while rank 0 still runs: All removes both pods, Running only the running one.
    w = world({"spec.cleanPodPolicy": policy, "spec.failurePolicy.restartPolicy": "Never"})
    w.run_to_running()
    w.exit(1, 1)
    result = w.step(10)
    assert w.state == "Failed"
    if policy == "None":
        # The failed pod stays for inspection. Whether the still-running rank of a failed job is
        # stopped under None is not specified; the planner stops it (it holds GPUs for nothing).
        assert W1 not in names(result.deletes)
    else:
        assert names(result.deletes) == deleted
    assert names(w.step(10).deletes) == []


@pytest.mark.parametrize(("policy", "deleted"), [("All", [W0, W1]), ("Running", []), ("None", [])])
def test_clean_pod_policy_on_a_completed_job(policy: str, deleted: list[str]) -> None:
    w = world({"spec.cleanPodPolicy": policy})
    w.run_to_running()
    w.succeed()
    result = w.step(10)
    assert w.state == "Completed"
    assert names(result.deletes) == deleted
    assert names(w.step(10).deletes) == []


def test_rank_zero_completion_with_other_ranks_finished_and_running() -> None:
    w = world({"spec.successPolicy.mode": "RankZero", "spec.cleanPodPolicy": "Running"}, workers=3)
    w.run_to_running()
    w.succeed(2)
    w.step(10)
    w.succeed(0)
    result = w.step(10)
    assert w.state == "Completed"
    assert names(result.deletes) == ["mnist-worker-1"]


def test_status_workers_of_a_finished_job_follow_the_released_pods() -> None:
    # Bug found end to end: status.workers (the Workers printer column) was last written when the
    # job finished, so a job whose running workers were then stopped showed them active forever.
    w = world({"spec.successPolicy.mode": "RankZero", "spec.cleanPodPolicy": "Running"}, workers=3)
    w.run_to_running()
    w.succeed(2)
    w.step(10)
    w.succeed(0)
    w.step(10)
    assert w.state == "Completed"
    w.finish_terminating()
    w.step(1)
    assert w.status["workers"] == {"pending": 0, "active": 0, "succeeded": 2, "failed": 0}
    assert w.status["resources"] == {"gpus": 0, "workers": 0}
    assert_steady(w)


def test_a_gang_that_does_not_fit_in_time_is_released_and_retried() -> None:
    w = world(
        {"spec.scheduling.scheduleTimeoutSeconds": 300, "spec.failurePolicy.backoffLimit": 0}, workers=4
    )
    w.step()
    w.bind(0, 1)
    w.start(0, 1)
    w.unschedulable(2, 3)
    result = w.step(100)
    assert result.requeue_after == pytest.approx(200)
    assert w.state == "Pending"
    w.advance(199)
    assert w.step().deletes == []
    failed_at = w.now + timedelta(seconds=1)
    result = w.step(1)
    assert names(result.deletes) == [f"mnist-worker-{i}" for i in range(4)]
    status = w.status
    assert status["state"] == "Restarting"
    assert status["restarts"] == {"scheduling": 1}
    assert status["lastRestartReason"] == "ScheduleTimeout"
    assert "2/4 pods unschedulable" in status["message"]
    assert INSUFFICIENT_GPU in status["message"]
    assert "scheduleTimeoutSeconds" in status["message"]
    assert 10 <= restart_delay_of(w, failed_at) <= 11
    result = until_restarted(w)
    assert len(pod_creates(result)) == 4
    assert w.status["attemptStartTime"] == rfc3339(w.now)
    assert w.state == "Pending"


def test_a_gang_scheduled_in_time_is_not_released() -> None:
    w = world({"spec.scheduling.scheduleTimeoutSeconds": 300})
    w.step()
    w.step(299)
    w.start()
    result = w.step(1)
    assert w.state == "Running"
    assert result.deletes == []
    assert w.step(1000).deletes == []


def test_scheduling_retries_back_off_by_their_own_count() -> None:
    w = world({"spec.scheduling.scheduleTimeoutSeconds": 60})
    w.step()
    delays = []
    for _ in range(3):
        w.unschedulable()
        failed_at = w.now + timedelta(seconds=60)
        w.step(60)
        assert w.state == "Restarting"
        delays.append(restart_delay_of(w, failed_at))
        until_restarted(w)
    assert [int(d // 10 * 10) for d in delays] == [10, 20, 40]
    assert w.status["restarts"] == {"scheduling": 3}


def test_format_duration() -> None:
    assert format_duration(0) == "0s"
    assert format_duration(59.9) == "59s"
    assert format_duration(61) == "1m1s"
    assert format_duration(3723) == "1h2m3s"
    assert format_duration(-5) == "0s"


def test_status_times_are_rounded_up_so_timers_never_fire_early() -> None:
    scene = world({"spec.scheduling.scheduleTimeoutSeconds": 3})
    scene.now = scene.now.replace(microsecond=900_000)
    scene.step()
    started = scene.status["attemptStartTime"]
    assert parse_time(started) > scene.now
    scene.unschedulable()
    scene.step(2.5)  # 3 s after the create by the wall clock would be 3.4 s; by the stamp, 2.6 s
    assert scene.state == "Pending"


def test_clean_pod_policy_none_keeps_running_ranks_of_a_failed_job() -> None:
    scene = world({"spec.cleanPodPolicy": "None", "spec.failurePolicy.restartPolicy": "Never"}, workers=3)
    scene.run_to_running()
    scene.exit(2, 1)
    failed = scene.step()
    assert scene.state == "Failed"
    assert failed.deletes == []
    assert len(scene.live_pods()) == 3


def test_the_deadline_stops_pods_even_under_clean_pod_policy_none() -> None:
    scene = world({"spec.cleanPodPolicy": "None", "spec.failurePolicy.activeDeadlineSeconds": 60})
    scene.run_to_running()
    ended = scene.step(61)
    assert scene.state == "Failed"
    assert scene.status["failureReason"] == "DeadlineExceeded"
    assert names(ended.deletes) == ["mnist-worker-0", "mnist-worker-1"]
