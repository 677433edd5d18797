"""controller.planner.plan through whole job lives in a fake cluster (tests.unit.lifecycle_world):
a new job: its objects, its gang created at once, Pending and Initializing, and success.

Each test steps a stored, defaulted TrainingJob with a fixed clock; tests.unit.lifecycle_steps has
the shared steps and the check that a resting state writes nothing.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest

from controller.planner import plan
from controller.runtime.clock import parse_time, rfc3339
from crd import contract
from tests.unit.lifecycle_steps import (
    W1,
    created_pod_names,
    pod_creates,
)
from tests.unit.lifecycle_world import (
    INSUFFICIENT_GPU,
    T0,
    env_of,
    names,
    world,
)


def test_a_new_job_gets_its_objects_and_the_whole_gang_at_once() -> None:
    w = world(workers=3)
    result = w.step()
    kinds = [obj["kind"] for obj in result.creates]
    # Supporting objects come first (the pods mount the trainer's ConfigMap and run under the account):
    # the namespace's shared ones, then the job's.
    assert kinds == [
        "ConfigMap",
        "ServiceAccount",
        "RoleBinding",
        "Service",
        "Service",
        "Pod",
        "Pod",
        "Pod",
    ]
    assert created_pod_names(result) == ["mnist-worker-0", "mnist-worker-1", "mnist-worker-2"]
    for pod in pod_creates(result):
        assert pod["metadata"]["labels"][contract.ATTEMPT_LABEL] == "0"
        assert "RESUME_FROM" not in env_of(pod)
    status = w.status
    assert status["state"] == "Pending"
    assert status["observedGeneration"] == 1
    assert status["startTime"] == rfc3339(T0)
    assert status["attempt"] == 0
    assert status["restartCount"] == 0
    created = w.condition("Created")
    assert created is not None
    assert created["status"] == "False"
    assert created["reason"] == "Creating"
    # No Event for the first state: the shell's SuccessfulCreate for the objects above tells of it.
    assert not result.events
    assert result.deletes == []


def test_conditions_follow_the_api_conventions() -> None:
    w = world()
    w.step()
    for entry in w.status["conditions"]:
        assert set(entry) >= {"type", "status", "reason", "message", "lastTransitionTime"}
        assert entry["status"] in ("True", "False", "Unknown")
        assert entry["reason"][0].isupper()
        assert " " not in entry["reason"]
        assert entry["observedGeneration"] == 1
        parse_time(entry["lastTransitionTime"])


def test_created_pods_waiting_for_the_scheduler_keep_the_job_pending() -> None:
    w = world()
    w.step()
    result = w.step(2)
    assert result.creates == []
    assert w.state == "Pending"
    assert w.status["message"] == "2/2 pods waiting to be scheduled"
    created = w.condition("Created")
    assert created is not None
    assert created["status"] == "True"
    running = w.condition("Running")
    assert running is not None
    assert (running["status"], running["reason"]) == ("False", "PodsPending")
    assert w.status["workers"] == {"pending": 2, "active": 0, "succeeded": 0, "failed": 0}
    assert w.status["resources"] == {"gpus": 2, "workers": 2}


def test_unschedulable_pods_are_named_with_the_schedulers_reason() -> None:
    w = world(workers=4)
    w.step()
    w.bind(0, 1)
    w.unschedulable(2, 3)
    w.step(3)
    assert w.state == "Pending"
    assert w.status["message"] == f"2/4 pods unschedulable: {INSUFFICIENT_GPU}"
    running = w.condition("Running")
    assert running is not None
    assert running["reason"] == "PodsUnschedulable"
    assert running["message"] == w.status["message"]


def test_scheduled_pods_that_are_not_running_yet_are_initializing() -> None:
    w = world()
    w.settle()
    w.bind()
    result = w.step(3)
    assert w.state == "Initializing"
    assert w.status["message"] == "0/2 pods running"
    assert [event.reason for event in result.events] == ["PodsScheduled"]
    w.start(0)
    w.step(3)
    assert w.state == "Initializing"
    assert w.status["message"] == "1/2 pods running"
    assert w.status["workers"] == {"pending": 1, "active": 1, "succeeded": 0, "failed": 0}


def test_all_pods_running_is_running() -> None:
    w = world(workers=3)
    w.settle()
    w.start()
    result = w.step(10)
    assert w.state == "Running"
    assert w.status["message"] == "3/3 workers running"
    assert w.status["workers"] == {"pending": 0, "active": 3, "succeeded": 0, "failed": 0}
    assert w.status["resources"] == {"gpus": 3, "workers": 3}
    running = w.condition("Running")
    assert running is not None
    assert (running["status"], running["reason"]) == ("True", "AllWorkersRunning")
    assert running["lastTransitionTime"] == rfc3339(T0 + timedelta(seconds=10))
    assert [(event.type, event.reason) for event in result.events] == [("Normal", "Running")]


def test_every_state_transition_has_an_event() -> None:
    w = world()
    w.step()
    w.step(1)
    w.bind()
    w.step(1)
    w.start()
    w.step(1)
    w.succeed()
    w.step(1)
    states = [event.message.split(":")[0] for event in w.events]
    # The first state, Pending, is told by the shell's SuccessfulCreate Event (World.apply checks each).
    assert states == ["Initializing", "Running", "Completed"]


def test_last_transition_time_moves_only_when_a_condition_flips() -> None:
    w = world()
    w.step()
    w.step(5)  # Running False, PodsPending
    first = w.condition("Running")
    assert first is not None
    w.bind()
    w.step(5)  # Running False, PodsStarting: reason and message change, status does not
    second = w.condition("Running")
    assert second is not None
    assert second["reason"] == "PodsStarting"
    assert second["lastTransitionTime"] == first["lastTransitionTime"]
    w.start()
    w.step(5)
    third = w.condition("Running")
    assert third is not None
    assert third["status"] == "True"
    assert third["lastTransitionTime"] == rfc3339(w.now)


def test_observed_generation_follows_the_spec() -> None:
    w = world()
    w.run_to_running()
    w.update_spec(ttlSecondsAfterFinished=600)
    w.step(1)
    assert w.status["observedGeneration"] == 2
    running = w.condition("Running")
    assert running is not None
    assert running["observedGeneration"] == 2


def test_the_plan_does_not_modify_what_it_observed() -> None:
    w = world()
    w.run_to_running()
    w.exit(1, 1)
    observed = w.observed()
    snapshot = copy.deepcopy((observed.job, list(observed.pods), dict(observed.owned)))
    plan(observed, w.settings)
    assert (observed.job, list(observed.pods), dict(observed.owned)) == snapshot


def test_all_workers_succeeded_completes_the_job() -> None:
    w = world({"spec.ttlSecondsAfterFinished": None})
    w.run_to_running()
    w.succeed(0)
    w.step(30)
    assert w.state == "Running"  # AllWorkers waits for every rank
    w.succeed(1)
    result = w.step(30)
    status = w.status
    assert status["state"] == "Completed"
    assert status["completionTime"] == rfc3339(w.now)
    assert status["duration"] == "1m0s"
    assert status["workers"] == {"pending": 0, "active": 0, "succeeded": 2, "failed": 0}
    assert "failureReason" not in status
    succeeded = w.condition("Succeeded")
    assert succeeded is not None
    assert (succeeded["status"], succeeded["reason"]) == ("True", "AllWorkersSucceeded")
    running = w.condition("Running")
    assert running is not None
    assert running["status"] == "False"
    assert [(event.type, event.reason) for event in result.events] == [("Normal", "AllWorkersSucceeded")]
    assert result.deletes == []  # cleanPodPolicy Running: nothing runs any more


def test_rank_zero_mode_completes_when_rank_zero_succeeds_and_stops_the_others() -> None:
    w = world({"spec.successPolicy.mode": "RankZero"}, workers=3)
    w.run_to_running()
    w.succeed(0)
    result = w.step(20)
    assert w.state == "Completed"
    succeeded = w.condition("Succeeded")
    assert succeeded is not None
    assert succeeded["reason"] == "RankZeroSucceeded"
    assert names(result.deletes) == ["mnist-worker-1", "mnist-worker-2"]


def test_rank_zero_mode_stops_the_other_workers_even_with_clean_pod_policy_none() -> None:
    # successPolicy.mode RankZero: "the other workers are then stopped"; cleanPodPolicy None only
    # keeps finished pods for inspection.
    w = world({"spec.successPolicy.mode": "RankZero", "spec.cleanPodPolicy": "None"})
    w.run_to_running()
    w.succeed(0)
    result = w.step(20)
    assert w.state == "Completed"
    assert names(result.deletes) == [W1]


def test_a_worker_other_than_rank_zero_succeeding_first_does_not_complete_rank_zero_mode() -> None:
    w = world({"spec.successPolicy.mode": "RankZero"})
    w.run_to_running()
    w.succeed(1)
    w.step(20)
    assert w.state == "Running"


def test_a_create_that_keeps_failing_does_not_restamp_the_attempt_start() -> None:
    scene = world()
    first = scene.plan()
    assert sorted(obj["metadata"]["name"] for obj in first.creates if obj["kind"] == "Pod") == [
        "mnist-worker-0",
        "mnist-worker-1",
    ]
    scene.job["status"] = first.status  # status written, then every create refused (nothing applied)
    scene.advance(30)
    second = scene.plan()
    assert len([obj for obj in second.creates if obj["kind"] == "Pod"]) == 2
    assert second.status["attemptStartTime"] == first.status["attemptStartTime"]
    assert second.status == first.status


@pytest.mark.parametrize(
    ("changes", "first_event"),
    [
        ({}, None),  # Pending: the shell's SuccessfulCreate for what the same reconcile creates tells it
        ({"spec.suspend": True}, ("Normal", "Suspended", "Suspended: suspended")),
        (
            {"spec.hyperparameters.additionalParams": {"lr": "1", "LR": "2"}},
            ("Warning", "InvalidSpec", "Failed: invalid spec"),
        ),
    ],
)
def test_a_new_jobs_first_state_has_an_event_but_pending(
    changes: dict[str, Any], first_event: tuple[str, str, str] | None
) -> None:
    """README ("Status"): every change of state is an Event but a new job's first Pending, whose reconcile
    goes on to create the job's objects (one SuccessfulCreate Event names them, or FailedCreate)."""
    w = world(changes)
    result = w.step()
    states = [(event.type, event.reason, event.message) for event in result.events]
    if first_event is None:
        assert w.state == "Pending"
        assert result.creates
        assert not states
    else:
        assert w.state == first_event[2].split(":")[0]
        assert len(states) == 1
        assert states[0][:2] == first_event[:2]
        assert states[0][2].startswith(first_event[2])
