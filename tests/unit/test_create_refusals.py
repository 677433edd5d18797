"""What the planner makes of creates the API server refused: the slow start of a blocked job, and one
message however many pods a shared reason refused.

The shell (tests/unit/test_shell.py) shows the batches on the wire; these call `plan` directly.
"""

from __future__ import annotations

from dataclasses import replace

from controller.planner import CreateFailure, plan
from tests.unit.lifecycle_world import world

QUOTA = 'pods "mnist-worker-{}" is forbidden: exceeded quota: gpus'


def refused(*indices: int, alone: bool = False) -> tuple[CreateFailure, ...]:
    return tuple(
        CreateFailure("Pod", f"mnist-worker-{index}", "blocked", f"creating: {QUOTA.format(index)}", alone)
        for index in indices
    )


def test_a_new_job_sends_its_pods_without_a_slow_start() -> None:
    first = world(workers=4).plan()
    assert len([obj for obj in first.creates if obj["kind"] == "Pod"]) == 4
    assert not first.slow_start


def test_a_job_whose_creates_were_refused_starts_slowly_until_they_are_not() -> None:
    w = world(workers=4)
    observed = replace(w.observed(), create_failures=refused(0, 1, 2, 3))
    w.apply(plan(observed, w.settings))
    assert w.status["conditions"][0]["reason"] == "FailedCreate"
    again = w.plan()
    assert again.slow_start
    w.apply(again)  # nothing refused this time
    assert w.status["conditions"][0]["reason"] != "FailedCreate"
    assert not w.plan().slow_start


def test_pods_refused_for_one_shared_reason_make_one_message_however_many_were_tried() -> None:
    w = world(workers=4)
    all_four = plan(replace(w.observed(), create_failures=refused(0, 1, 2, 3)), w.settings)
    just_one = plan(replace(w.observed(), create_failures=refused(0)), w.settings)
    assert all_four.status["message"] == just_one.status["message"]
    assert "mnist-worker-0" in all_four.status["message"]
    assert "mnist-worker-1" not in all_four.status["message"]


def test_pods_refused_each_for_its_own_reason_are_all_named() -> None:
    w = world(workers=4)
    taken = plan(replace(w.observed(), create_failures=refused(1, 2, alone=True)), w.settings)
    assert "mnist-worker-1" in taken.status["message"]
    assert "mnist-worker-2" in taken.status["message"]
