"""The planner at the edges of its input: numbers too large for a date or a float, texts too long for a
status field or an Event, specs it cannot read, and the decisions it takes on the way (decide.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller.planner import Observed, plan
from controller.planner.decide import (
    Accept,
    AnyDecision,
    CreateRanks,
    Finish,
    Finished,
    NextAttempt,
    Restart,
    Resume,
    Suspend,
    Track,
    decide,
)
from controller.planner.facts import Facts
from controller.planner.model import Settings
from controller.planner.plan import apply_decision
from controller.planner.texts import MESSAGE_LIMIT, REASON_LIMIT
from controller.planner.timers import LATEST, MAX_WAKE_UP_SECONDS
from controller.runtime.clock import parse_time, rfc3339
from controller.runtime.events import MESSAGE_LIMIT_BYTES
from crd import contract
from crd.spec import parse
from tests.unit.lifecycle_world import T0, World, make_job, world

HUGE = 10**30
BEYOND_FLOATS = 10**400


def assert_fits(scene: World) -> None:
    """Every text the plans wrote fits its field, and every Event its size."""
    status = scene.status
    assert len(status.get("message", "")) <= MESSAGE_LIMIT
    for entry in status.get("conditions", []):
        assert len(entry["message"]) <= MESSAGE_LIMIT
        assert len(entry["reason"]) <= REASON_LIMIT
    for key in ("failureReason", "lastRestartReason"):
        assert len(status.get(key, "")) <= REASON_LIMIT
    assert all(len(event.message.encode()) <= MESSAGE_LIMIT_BYTES for event in scene.events)


# ------------------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("ttl", [10**12, HUGE])
def test_a_ttl_beyond_any_date_keeps_the_job_and_looks_again_in_a_day(ttl: int) -> None:
    scene = world({"spec.ttlSecondsAfterFinished": ttl})
    scene.run_to_running()
    scene.succeed()
    finished = scene.step(1)
    assert scene.state == "Completed"
    assert not finished.delete_job
    assert finished.requeue_after == MAX_WAKE_UP_SECONDS


def test_an_active_deadline_beyond_any_date_never_fires() -> None:
    scene = world({"spec.failurePolicy.activeDeadlineSeconds": HUGE})
    scene.run_to_running()
    running = scene.step(3600)
    assert scene.state == "Running"
    assert running.requeue_after == MAX_WAKE_UP_SECONDS


@pytest.mark.parametrize(
    "backoff",
    [
        {"initialDelaySeconds": 10**12, "multiplier": 1e308, "maxDelaySeconds": HUGE},
        {"initialDelaySeconds": 10, "multiplier": 1e308, "maxDelaySeconds": BEYOND_FLOATS},
        {"initialDelaySeconds": BEYOND_FLOATS, "multiplier": 2, "maxDelaySeconds": BEYOND_FLOATS},
    ],
)
def test_a_failure_still_restarts_the_gang_however_large_the_backoff(backoff: dict[str, Any]) -> None:
    scene = world({"spec.failurePolicy.restartBackoff": backoff, "spec.failurePolicy.backoffLimit": 5})
    scene.run_to_running()
    for restarts in range(1, 4):  # the delay grows past any date, then past any float
        scene.exit(1, 1)
        restarted = scene.step(1)
        assert scene.state == "Restarting"
        assert scene.status["restarts"] == {"failure": restarts}
        assert parse_time(scene.status["restartAt"]) <= LATEST
        assert restarted.requeue_after is not None
        assert restarted.requeue_after <= MAX_WAKE_UP_SECONDS
        scene.job["status"]["restartAt"] = rfc3339(scene.now)  # as if the backoff had passed
        scene.settle()
        scene.start()
        scene.step(1)
        assert scene.state == "Running"


def test_schedule_and_progress_deadlines_beyond_any_date_never_fire() -> None:
    scene = world(
        {"spec.scheduling.scheduleTimeoutSeconds": HUGE, "spec.monitoring.progressDeadlineSeconds": HUGE}
    )
    scene.step()
    scene.unschedulable()
    pending = scene.step(3600)
    assert scene.state == "Pending"
    assert pending.requeue_after == MAX_WAKE_UP_SECONDS
    scene.start()
    scene.step(1)
    running = scene.step(3600)
    assert scene.state == "Running"
    assert running.requeue_after == MAX_WAKE_UP_SECONDS


# --------------------------------------------------------------------------------------- texts


def test_an_invalid_spec_with_huge_names_in_it_fits_status_and_events() -> None:
    # Two additionalParams keys that only differ in case become the same HP_ variable: the error
    # names both, 20,000 characters each.
    keys = {"k" * 20_000: "1", "K" * 20_000: "2"}
    scene = world({"spec.hyperparameters.additionalParams": keys})
    scene.step()
    assert scene.state == "Failed"
    assert scene.status["failureReason"] == "InvalidSpec"
    assert scene.status["message"].startswith("invalid spec: spec.hyperparameters.additionalParams: keys ")
    assert scene.status["message"].endswith("...")
    assert_fits(scene)


def test_a_huge_termination_message_and_reason_fit_status_and_events() -> None:
    scene = world()
    scene.run_to_running()
    scene.exit(1, 137, reason="R" * 5000, message="m" * 40_000)
    scene.step(1)
    assert scene.state == "Restarting"
    assert scene.status["lastRestartReason"] == "PodFailed"
    assert_fits(scene)
    never = world({"spec.failurePolicy.restartPolicy": "Never"})
    never.run_to_running()
    never.exit(1, 1, message="m" * 40_000)
    never.step(1)
    assert never.state == "Failed"
    assert_fits(never)


def test_a_disruption_with_a_huge_reason_fits_status() -> None:
    scene = world()
    scene.run_to_running()
    scene.disrupt(1, "D" * 5000, delete=False, phase="Failed")
    scene.step(1)
    assert scene.state == "Restarting"
    assert scene.status["lastRestartReason"].endswith("...")
    assert_fits(scene)


# ------------------------------------------------------------------------------- unreadable specs


def test_a_spec_of_the_wrong_type_fails_the_job_naming_the_field() -> None:
    job = make_job()
    job["spec"]["numWorkers"] = "two"
    scene = World(job)
    result = scene.step()
    assert scene.state == "Failed"
    assert scene.status["failureReason"] == "InvalidSpec"
    assert "spec.numWorkers" in scene.status["message"]
    assert [event.reason for event in result.events] == ["InvalidSpec"]
    assert result.creates == []
    again = scene.step(60)
    assert again.status == scene.status
    assert again.events == []


# ------------------------------------------------------------------------------------ decisions


def decisions(scene: World) -> list[type]:
    """The decisions one reconcile of the scene takes, in order."""
    observed = scene.observed()
    facts = Facts(parse(observed.job), observed, Settings(), ())
    status = scene.status
    taken: list[AnyDecision] = []
    while not taken or taken[-1].STEP:
        taken.append(decide(facts, status, taken))
        status = apply_decision(facts, status, taken[-1]).status
    return [type(decision) for decision in taken]


def test_decisions_follow_the_state_machine() -> None:
    scene = world()
    assert decisions(scene) == [Accept, CreateRanks]
    scene.run_to_running()
    assert decisions(scene) == [Track]
    scene.update_spec(suspend=True)
    assert decisions(scene) == [Suspend]
    scene.settle()
    scene.update_spec(suspend=False)
    assert decisions(scene) == [Resume, CreateRanks]
    scene.settle()
    scene.start()
    scene.step(1)
    scene.exit(1, 1)
    assert decisions(scene) == [Restart]
    scene.step(1)
    scene.job["status"]["restartAt"] = rfc3339(scene.now)
    assert decisions(scene) == [NextAttempt, CreateRanks]
    scene.settle()
    scene.succeed()
    assert decisions(scene) == [Finish, Finished]


def test_a_resize_compares_world_sizes_as_numbers() -> None:
    scene = world()
    scene.run_to_running()
    for pod in scene.pods.values():
        pod["metadata"]["annotations"][contract.NUM_WORKERS_ANNOTATION] = "02"
    steady = scene.step(1)
    assert scene.state == "Running"
    assert steady.deletes == []


def test_gang_scheduling_without_a_gang_scheduler_is_announced_once() -> None:
    job = make_job({"spec.scheduling.gangScheduling": True})
    first = plan(Observed(job=job, pods=[], owned={}, nodes={}, now=T0))
    assert ("Warning", "GangSchedulingUnavailable") in [(event.type, event.reason) for event in first.events]
    available = plan(Observed(job=job, pods=[], owned={}, nodes={}, now=T0, gang_scheduler="volcano"))
    assert "GangSchedulingUnavailable" not in [event.reason for event in available.events]
    later = copy.deepcopy(job)
    later["status"] = first.status
    again = plan(Observed(job=later, pods=[], owned={}, nodes={}, now=T0))
    assert "GangSchedulingUnavailable" not in [event.reason for event in again.events]
