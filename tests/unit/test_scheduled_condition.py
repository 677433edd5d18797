"""The Scheduled condition (controller/planner/scheduled.py) through a job's life, and the scheduler's
message the job shows when several pods wait for a node."""

from __future__ import annotations

import copy
import re

import pytest

from controller.runtime.clock import rfc3339
from crd.contract import Condition
from tests.cluster import REPO
from tests.unit.lifecycle_world import INSUFFICIENT_GPU, World, world

OPTIMISTIC = (
    "0/4 nodes are available: 4 rejected while waiting on permit: optimistic rejection in PostFilter. "
    "preemption: 0/4 nodes are available: 4 No preemption victims found for incoming pod."
)


def scheduled(w: World) -> tuple[str, str, str]:
    entry = w.condition("Scheduled")
    assert entry is not None, w.status
    return entry["status"], entry["reason"], entry["message"]


def assert_quiet(w: World) -> None:
    """A further reconcile with nothing changed writes nothing."""
    before = copy.deepcopy(w.job["status"])
    w.advance(1)
    again = w.plan()
    assert again.status == before
    assert again.events == []


def test_a_new_job_is_not_scheduled_until_every_pod_is_bound() -> None:
    w = world(workers=3)
    w.step()
    assert scheduled(w) == ("False", "PodsNotCreated", "0/3 pods of attempt 0 created")
    w.step(1)
    assert scheduled(w) == ("False", "PodsPending", "3/3 pods waiting to be scheduled")
    assert_quiet(w)
    w.bind(0)
    w.unschedulable(1, 2)
    w.step(1)
    assert scheduled(w) == ("False", "Unschedulable", f"2/3 pods unschedulable: {INSUFFICIENT_GPU}")
    assert_quiet(w)
    w.bind(1, 2)
    w.step(5)
    assert scheduled(w) == ("True", "AllPodsScheduled", "3/3 pods of attempt 0 are bound to nodes")
    entry = w.condition("Scheduled")
    assert entry is not None
    assert entry["lastTransitionTime"] == rfc3339(w.now)
    assert entry["observedGeneration"] == 1
    w.start()
    w.step(1)
    assert w.state == "Running"
    assert scheduled(w)[0] == "True"
    assert_quiet(w)


def test_conditions_are_listed_in_order() -> None:
    w = world()
    w.run_to_running()
    types = [entry["type"] for entry in w.status["conditions"]]
    assert types == [str(c) for c in Condition if c in types]
    assert types[:3] == ["Created", "Scheduled", "Running"]


def test_a_restart_resets_it_and_the_next_attempt_sets_it_again() -> None:
    w = world({"spec.failurePolicy.restartBackoff.initialDelaySeconds": 0})
    w.run_to_running()
    w.exit(1, 1)
    w.step(1)
    assert w.state == "Restarting"
    assert scheduled(w) == ("False", "Restarting", "the pods of attempt 0 are being replaced")
    w.step(1)
    assert w.status["attempt"] == 1
    assert scheduled(w) == ("False", "PodsNotCreated", "0/2 pods of attempt 1 created")
    w.step(1)
    w.bind()
    w.step(1)
    assert scheduled(w) == ("True", "AllPodsScheduled", "2/2 pods of attempt 1 are bound to nodes")


def test_a_suspended_job_is_not_scheduled() -> None:
    w = world()
    w.run_to_running()
    w.update_spec(suspend=True)
    w.step(1)
    assert scheduled(w) == ("False", "Suspended", "spec.suspend is true: the job has no pods")


def test_a_finished_job_keeps_what_it_last_said() -> None:
    w = world({"spec.cleanPodPolicy": "All"})
    w.run_to_running()
    w.succeed()
    w.step(1)
    assert w.state == "Completed"
    w.step(1)
    assert w.pods == {}
    assert scheduled(w)[:2] == ("True", "AllPodsScheduled")


def test_a_job_created_suspended_has_no_scheduled_condition_to_show() -> None:
    w = world({"spec.suspend": True})
    w.step()
    assert w.state == "Suspended"
    assert scheduled(w)[:2] == ("False", "Suspended")


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_an_informative_scheduler_message_is_preferred_to_an_optimistic_rejection(
    order: tuple[int, int],
) -> None:
    w = world(workers=2, changes={"spec.scheduling.gangScheduling": True})
    w.step()
    w.step(1)
    first, second = order
    w.unschedulable(first, message=OPTIMISTIC)
    w.unschedulable(second, message=INSUFFICIENT_GPU)
    w.step(1)
    expected = f"2/2 pods unschedulable: {INSUFFICIENT_GPU}"
    assert w.status["message"] == expected
    assert scheduled(w) == ("False", "Unschedulable", expected)


def test_the_optimistic_rejection_is_shown_when_it_is_all_there_is() -> None:
    w = world(workers=2)
    w.step()
    w.step(1)
    w.unschedulable(message=OPTIMISTIC)
    w.step(1)
    assert w.status["message"] == f"2/2 pods unschedulable: {OPTIMISTIC}"


def test_the_readme_lists_every_condition() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    sentence = re.search(r"Conditions follow the API conventions: ([^.]*)\.", " ".join(readme.split()))
    assert sentence is not None
    listed = re.findall(r"`?([A-Z][A-Za-z]+)`?", sentence.group(1))
    assert listed == [str(c) for c in Condition]
