"""Which news jumps the work queue: the pure rule (podstate.changes_the_gang) and the StatusWrites
signal that a reconcile's awaited write arrived. The queue's ordering itself is in test_workqueue.py."""

from __future__ import annotations

from typing import Any

import pytest

from controller.planner.podstate import changes_the_gang
from controller.runtime.clock import FakeClock
from controller.runtime.trackers import StatusWrites

JsonDict = dict[str, Any]


def pod(name: str, phase: str, terminating: bool = False) -> JsonDict:
    metadata: JsonDict = {"name": name}
    if terminating:
        metadata["deletionTimestamp"] = "2026-11-25T00:00:00Z"
    return {"metadata": metadata, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("old", "new", "others", "urgent"),
    [
        pytest.param("Pending", "Running", ["Running", "Running"], True, id="the-last-to-run"),
        pytest.param("Pending", "Running", ["Running", "Pending"], False, id="one-of-several-starting"),
        pytest.param("Pending", "Running", ["Succeeded"], True, id="the-rest-already-done"),
        pytest.param("Running", "Failed", ["Running"], True, id="ended-badly"),
        pytest.param("Running", "Succeeded", ["Running"], True, id="ended-well"),
        pytest.param("Pending", "Pending", ["Running"], False, id="bound-or-other-field"),
        pytest.param("Running", "Running", ["Running"], False, id="unchanged-phase"),
    ],
)
def test_a_pod_update_is_urgent_when_it_may_move_the_job(
    old: str, new: str, others: list[str], urgent: bool
) -> None:
    updated = pod("w-0", new)
    siblings = [updated, *(pod(f"w-{i + 1}", phase) for i, phase in enumerate(others))]
    assert changes_the_gang(pod("w-0", old), updated, siblings) is urgent


def test_a_pod_starting_to_terminate_is_urgent() -> None:
    before, after = pod("w-0", "Running"), pod("w-0", "Running", terminating=True)
    assert changes_the_gang(before, after, [after])
    assert not changes_the_gang(after, after, [after]), "only the moment it starts terminating"


def test_status_writes_say_when_a_turned_away_reconcile_can_go_on() -> None:
    writes = StatusWrites(FakeClock())
    assert writes.observed("ns/job", "1") is False, "nothing was written"
    writes.wrote("ns/job", "5")
    assert writes.observed("ns/job", "5") is False, "our write arrived before any reconcile waited"
    writes.wrote("ns/job", "7")
    assert not writes.settled("ns/job")  # a reconcile is turned away
    assert writes.observed("ns/job", "6") is False
    assert writes.observed("ns/job", "7") is True
    assert writes.settled("ns/job")
    assert writes.observed("ns/job", "7") is False, "already settled"
