"""controller.planner.conditions: Kubernetes condition conventions, and no change unless something changed."""

from __future__ import annotations

import copy
from typing import Any

from controller.planner import conditions as cond
from crd.contract import Condition

T1 = "2026-03-01T12:00:00Z"
T2 = "2026-03-01T12:05:00Z"


def one(entries: list[dict[str, Any]], type_: str) -> dict[str, Any]:
    found = [entry for entry in entries if entry["type"] == type_]
    assert len(found) == 1
    return found[0]


def test_a_new_condition_has_every_conventional_field() -> None:
    entries = cond.set_condition(
        [], Condition.RUNNING, True, reason="AllWorkersRunning", message="2/2", now=T1
    )
    assert entries == [
        {
            "type": "Running",
            "status": "True",
            "reason": "AllWorkersRunning",
            "message": "2/2",
            "lastTransitionTime": T1,
        }
    ]


def test_generation_is_recorded_when_given() -> None:
    entries = cond.set_condition([], Condition.RUNNING, False, reason="R", message="m", now=T1, generation=4)
    assert entries[0]["observedGeneration"] == 4


def test_reason_and_message_change_without_a_transition() -> None:
    entries = cond.set_condition([], Condition.RUNNING, False, reason="PodsPending", message="a", now=T1)
    entries = cond.set_condition(
        entries, Condition.RUNNING, False, reason="PodsStarting", message="b", now=T2
    )
    running = one(entries, Condition.RUNNING)
    assert running["lastTransitionTime"] == T1
    assert (running["reason"], running["message"]) == ("PodsStarting", "b")


def test_a_flip_moves_the_transition_time() -> None:
    entries = cond.set_condition([], Condition.RUNNING, False, reason="PodsPending", message="a", now=T1)
    entries = cond.set_condition(
        entries, Condition.RUNNING, True, reason="AllWorkersRunning", message="b", now=T2
    )
    assert one(entries, Condition.RUNNING)["lastTransitionTime"] == T2
    assert one(entries, Condition.RUNNING)["status"] == "True"


def test_setting_what_it_already_says_changes_nothing() -> None:
    entries = cond.set_condition([], Condition.STALLED, True, reason="R", message="m", now=T1, generation=2)
    again = cond.set_condition(
        entries, Condition.STALLED, True, reason="R", message="m", now=T2, generation=2
    )
    assert again == entries


def test_the_input_is_not_modified() -> None:
    entries = cond.set_condition([], Condition.RUNNING, False, reason="R", message="m", now=T1)
    before = copy.deepcopy(entries)
    cond.set_condition(entries, Condition.RUNNING, True, reason="X", message="y", now=T2)
    cond.clear(entries, Condition.RUNNING, reason="X", message="y", now=T2)
    assert entries == before


def test_conditions_are_kept_in_a_stable_order() -> None:
    entries: list[dict[str, Any]] = []
    for type_ in (Condition.FAILED, "Custom", Condition.STALLED, Condition.CREATED, Condition.RUNNING):
        entries = cond.set_condition(entries, type_, True, reason="R", message="m", now=T1)
    assert [entry["type"] for entry in entries] == ["Created", "Running", "Stalled", "Failed", "Custom"]


def test_one_entry_per_type() -> None:
    entries: list[dict[str, Any]] = []
    for status in (True, False, True):
        entries = cond.set_condition(entries, Condition.RESTARTING, status, reason="R", message="m", now=T1)
    assert len(entries) == 1


def test_clearing_an_absent_condition_adds_nothing() -> None:
    entries = cond.set_condition([], Condition.RUNNING, True, reason="R", message="m", now=T1)
    assert cond.clear(entries, Condition.RESTARTING, reason="Done", message="m", now=T2) == entries
    assert cond.clear(None, Condition.RESTARTING, reason="Done", message="m", now=T2) == []


def test_clearing_a_present_condition_sets_it_false() -> None:
    entries = cond.set_condition([], Condition.RESTARTING, True, reason="PodFailed", message="m", now=T1)
    cleared = cond.clear(entries, Condition.RESTARTING, reason="GangRestarted", message="n", now=T2)
    restarting = one(cleared, Condition.RESTARTING)
    assert (restarting["status"], restarting["reason"], restarting["lastTransitionTime"]) == (
        "False",
        "GangRestarted",
        T2,
    )


def test_get_and_is_true() -> None:
    entries = cond.set_condition([], Condition.RUNNING, True, reason="R", message="m", now=T1)
    entries = cond.set_condition(entries, Condition.STALLED, False, reason="R", message="m", now=T1)
    assert cond.is_true(entries, Condition.RUNNING)
    assert not cond.is_true(entries, Condition.STALLED)
    assert not cond.is_true(entries, Condition.FAILED)
    assert not cond.is_true(None, Condition.RUNNING)
    assert cond.get(entries, Condition.FAILED) is None
    found = cond.get(entries, Condition.STALLED)
    assert found is not None
    assert found["status"] == "False"
