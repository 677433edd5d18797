"""controller.planner.plan through whole job lives in a fake cluster (tests.unit.lifecycle_world):
rank 0's progress reports, stalls and the success policy.

Each test steps a stored, defaulted TrainingJob with a fixed clock; tests.unit.lifecycle_steps has
the shared steps and the check that a resting state writes nothing.
"""

from __future__ import annotations

import copy

import pytest

from controller.planner import Settings
from controller.runtime.clock import rfc3339
from crd import contract
from tests.unit.lifecycle_steps import (
    W0,
    W1,
    assert_steady,
    fail_and_restart,
    pod_creates,
    until_restarted,
)
from tests.unit.lifecycle_world import (
    env_of,
    names,
    world,
)


def test_rank_zeros_progress_report_is_copied_into_status() -> None:
    w = world({"spec.hyperparameters.epochs": 10})
    w.run_to_running()
    w.report(
        epoch=4,
        totalEpochs=10,
        step=1200,
        metrics={"loss": 0.41, "accuracy": 0.87},
        checkpoint="/checkpoints/epoch-4",
    )
    w.step(30)
    status = w.status
    assert status["currentEpoch"] == 4
    assert status["totalEpochs"] == 10
    assert status["step"] == 1200
    assert status["progress"] == "40%"
    assert status["metrics"] == {"loss": 0.41, "accuracy": 0.87}
    assert status["checkpoint"] == {"latest": "/checkpoints/epoch-4", "count": 1, "time": rfc3339(w.now)}
    assert status["lastProgressTime"] == rfc3339(w.now)
    assert w.state == "Running"


def test_a_report_from_another_rank_is_ignored() -> None:
    w = world()
    w.run_to_running()
    w.report(1, epoch=4, totalEpochs=10)
    w.step(30)
    assert "currentEpoch" not in w.status


def test_progress_updates_are_rate_limited_and_deferred_not_lost() -> None:
    w = world(settings=Settings(progress_min_interval=5.0))
    w.run_to_running()
    w.report(epoch=1, totalEpochs=10)
    w.step(10)
    assert w.status["currentEpoch"] == 1
    w.report(epoch=2, totalEpochs=10)
    result = w.step(2)
    assert w.status["currentEpoch"] == 1
    assert result.requeue_after == pytest.approx(3)
    result = w.step(3)
    assert w.status["currentEpoch"] == 2
    assert w.status["lastProgressTime"] == rfc3339(w.now)


def test_an_unchanged_report_writes_nothing() -> None:
    w = world()
    w.run_to_running()
    w.report(epoch=1, totalEpochs=10, metrics={"loss": 1.0})
    w.step(10)
    stamp = w.status["lastProgressTime"]
    assert_steady(w, 60)
    w.step(60)
    assert w.status["lastProgressTime"] == stamp


def test_checkpoints_are_counted_and_timed() -> None:
    w = world()
    w.run_to_running()
    w.report(epoch=1, checkpoint={"path": "/checkpoints/epoch-1", "time": "2026-03-01T12:00:30Z"})
    w.step(60)
    w.report(epoch=2, checkpoint="/checkpoints/epoch-2")
    w.step(60)
    assert w.status["checkpoint"] == {"latest": "/checkpoints/epoch-2", "count": 2, "time": rfc3339(w.now)}
    w.report(epoch=3, checkpoint="/checkpoints/epoch-2")  # same checkpoint again: not a new one
    w.step(60)
    assert w.status["checkpoint"]["count"] == 2


def test_a_restart_resumes_from_the_latest_checkpoint() -> None:
    w = world({"spec.checkpoint.enabled": True, "spec.checkpoint.resumeFrom": "epoch-0"})
    w.run_to_running()
    assert env_of(w.pod(0))["RESUME_FROM"] == "/checkpoints/epoch-0"
    w.report(epoch=5, checkpoint="/checkpoints/epoch-5")
    w.step(10)
    fail_and_restart(w)
    result = until_restarted(w)
    assert {env_of(pod)["RESUME_FROM"] for pod in pod_creates(result)} == {"/checkpoints/epoch-5"}


def test_an_unusable_report_warns_and_changes_nothing() -> None:
    w = world()
    w.run_to_running()
    w.pod(0)["metadata"].setdefault("annotations", {})[contract.PROGRESS_ANNOTATION] = "{not json"
    before = copy.deepcopy(w.status)
    result = w.step(10)
    assert [(event.type, event.reason) for event in result.events] == [("Warning", "InvalidProgressReport")]
    assert w.status == before
    assert w.state == "Running"


def test_a_job_without_progress_for_the_deadline_is_stalled() -> None:
    w = world({"spec.monitoring.progressDeadlineSeconds": 600})
    w.run_to_running()
    w.report(epoch=1)
    result = w.step(100)
    assert result.requeue_after == pytest.approx(600)
    result = w.step(599)
    assert w.condition("Stalled") is None
    assert result.requeue_after == pytest.approx(1)
    result = w.step(1)
    stalled = w.condition("Stalled")
    assert stalled is not None
    assert (stalled["status"], stalled["reason"]) == ("True", "ProgressDeadlineExceeded")
    assert "epoch 1" in stalled["message"]
    assert [(event.type, event.reason) for event in result.events] == [("Warning", "Stalled")]
    assert w.state == "Running"
    assert result.deletes == []
    assert_steady(w, 120)
    w.report(epoch=2)
    w.step(1)
    stalled = w.condition("Stalled")
    assert stalled is not None
    assert (stalled["status"], stalled["reason"]) == ("False", "ProgressResumed")


def test_reports_held_back_by_the_progress_rate_limit_are_not_a_stall() -> None:
    # Bug found end to end: with progressDeadlineSeconds shorter than the operator's progress
    # interval, a trainer reporting a new epoch every second was declared stalled (and restarted)
    # because its reports were waiting out the rate limit and lastProgressTime lagged behind.
    w = world(
        {"spec.monitoring.progressDeadlineSeconds": 3, "spec.monitoring.restartOnStall": True},
        settings=Settings(progress_min_interval=5.0),
    )
    w.run_to_running()
    for epoch in range(1, 13):
        w.report(epoch=epoch)
        w.step(1)
        assert w.state == "Running", (epoch, w.status["message"])
        assert w.condition("Stalled") is None
    assert w.status["currentEpoch"] >= 10
    # Reports stop: the stall is still detected, the deadline after the last applied report.
    w.step(5)
    assert w.status["currentEpoch"] == 12
    w.step(3)
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"stall": 1}


def test_stall_time_counts_from_when_the_job_started_running() -> None:
    w = world({"spec.monitoring.progressDeadlineSeconds": 600})
    w.settle()
    w.step(3000)  # pending for a long time: not stalled, it never ran
    w.start()
    result = w.step(1)
    assert w.state == "Running"
    assert w.condition("Stalled") is None
    assert result.requeue_after == pytest.approx(600)


def test_a_stall_restarts_the_gang_when_asked_to() -> None:
    w = world(
        {
            "spec.monitoring.progressDeadlineSeconds": 600,
            "spec.monitoring.restartOnStall": True,
            "spec.failurePolicy.backoffLimit": 1,
        }
    )
    w.run_to_running()
    result = w.step(600)
    assert w.state == "Restarting"
    assert names(result.deletes) == [W0, W1]
    assert w.status["restarts"] == {"stall": 1}
    assert w.status["lastRestartReason"] == "Stalled"
    until_restarted(w)
    stalled = w.condition("Stalled")
    assert stalled is not None
    assert stalled["status"] == "False"
    w.settle()
    w.start()
    w.step(1)
    w.step(600)
    assert w.state == "Failed"
    assert w.status["failureReason"] == "BackoffLimitExceeded"


def test_reaching_the_target_accuracy_completes_the_job_and_stops_the_pods() -> None:
    w = world({"spec.successPolicy.targetAccuracy": 0.9, "spec.cleanPodPolicy": "None"})
    w.run_to_running()
    w.report(epoch=3, metrics={"accuracy": 0.89})
    w.step(10)
    assert w.state == "Running"
    w.report(epoch=4, metrics={"accuracy": 0.91})
    result = w.step(10)
    assert w.state == "Completed"
    succeeded = w.condition("Succeeded")
    assert succeeded is not None
    assert succeeded["reason"] == "TargetReached"
    assert "0.91" in w.status["message"]
    assert names(result.deletes) == [W0, W1]
    assert w.status["metrics"] == {"accuracy": 0.91}


def test_a_minimised_metric_reaches_its_target_from_above() -> None:
    w = world(
        {
            "spec.successPolicy.targetAccuracy": 0.2,
            "spec.successPolicy.metric": "loss",
            "spec.successPolicy.metricMode": "min",
        }
    )
    w.run_to_running()
    w.report(epoch=1, metrics={"loss": 0.5})
    w.step(10)
    assert w.state == "Running"
    w.report(epoch=2, metrics={"loss": 0.19})
    w.step(10)
    assert w.state == "Completed"


def test_no_improvement_for_the_patience_stops_the_job_early() -> None:
    w = world({"spec.successPolicy.earlyStoppingPatience": 3, "spec.successPolicy.minDelta": 0.01})
    w.run_to_running()
    for epoch, accuracy in [(1, 0.5), (2, 0.6), (3, 0.605), (4, 0.59)]:
        w.report(epoch=epoch, metrics={"accuracy": accuracy})
        w.step(10)
        assert w.state == "Running", epoch
    assert w.status["bestMetric"] == {"value": 0.6, "epoch": 2}
    w.report(epoch=5, metrics={"accuracy": 0.6})
    result = w.step(10)
    assert w.state == "Completed"
    succeeded = w.condition("Succeeded")
    assert succeeded is not None
    assert succeeded["reason"] == "EarlyStopped"
    assert names(result.deletes) == [W0, W1]


def test_rank_zeros_last_report_reaches_status_despite_the_rate_limit() -> None:
    scene = world()
    scene.run_to_running()
    scene.report(0, epoch=9, totalEpochs=10)
    scene.step()
    assert scene.status["currentEpoch"] == 9
    scene.advance(1)  # within --progress-interval (5 s): the next report would be held back
    scene.report(0, epoch=10, totalEpochs=10)
    scene.succeed()
    scene.step()
    assert scene.state == "Completed"
    assert scene.status["currentEpoch"] == 10
    assert scene.status["progress"] == "100%"


def test_a_finished_job_is_not_left_stalled() -> None:
    scene = world({"spec.monitoring.progressDeadlineSeconds": 10})
    scene.run_to_running()
    scene.step(11)
    assert (scene.condition("Stalled") or {}).get("status") == "True"
    scene.succeed()
    scene.step()
    assert scene.state == "Completed"
    assert (scene.condition("Stalled") or {}).get("status") == "False"
