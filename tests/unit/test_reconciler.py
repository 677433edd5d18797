"""The helpers behind reporting create failures on a job (the planner's summary and blocked state) and
the Tombstones tracker the manager's delete handler feeds.

The reconciler around them is tested in process in tests/unit/test_shell.py, and end to end in
tests/e2e/test_reconcile.py.
"""

from __future__ import annotations

from controller.planner.texts import MAX_LISTED_PROBLEMS, MAX_PROBLEM_TEXT
from controller.planner.texts import summary as _summary
from controller.planner.transitions import blocked as _blocked
from controller.runtime.clock import FakeClock
from controller.runtime.trackers import Tombstones


def test_summary_is_sorted_so_a_repeated_problem_reads_the_same() -> None:
    one = _summary(["creating Pod a-worker-1: forbidden", "creating Pod a-worker-0: forbidden"])
    other = _summary(["creating Pod a-worker-0: forbidden", "creating Pod a-worker-1: forbidden"])

    assert one == other == "creating Pod a-worker-0: forbidden; creating Pod a-worker-1: forbidden"


def test_summary_lists_a_few_problems_and_counts_the_rest() -> None:
    problems = [f"creating Pod a-worker-{index:02d}: forbidden" for index in range(100)]

    text = _summary(problems)

    assert text.count("creating Pod") == MAX_LISTED_PROBLEMS
    assert text.startswith("creating Pod a-worker-00: forbidden; creating Pod a-worker-01")
    assert text.endswith(f"; and {100 - MAX_LISTED_PROBLEMS} more")


def test_summary_is_bounded() -> None:
    text = _summary(["x" * 100_000])

    assert len(text) == MAX_PROBLEM_TEXT
    assert text.endswith("...")


def test_blocked_means_created_false_because_a_create_failed() -> None:
    def status(condition_status: str, reason: str) -> dict[str, object]:
        return {"conditions": [{"type": "Created", "status": condition_status, "reason": reason}]}

    assert _blocked(status("False", "FailedCreate"))
    assert not _blocked(status("False", "Creating"))
    assert not _blocked(status("True", "PodsCreated"))
    assert not _blocked({})


def test_tombstones_keep_last_states_per_job_until_they_expire() -> None:
    clock = FakeClock()
    tombstones = Tombstones(clock, ttl=600)
    tombstones.record("ml/a", {"metadata": {"name": "a-worker-1"}})
    clock.advance(300)
    tombstones.record("ml/a", {"metadata": {"name": "a-worker-0"}})
    assert [pod["metadata"]["name"] for pod in tombstones.recent("ml/a")] == ["a-worker-1", "a-worker-0"]
    assert tombstones.recent("ml/b") == []
    clock.advance(301)
    assert [pod["metadata"]["name"] for pod in tombstones.recent("ml/a")] == ["a-worker-0"]
    tombstones.forget("ml/a")
    assert tombstones.recent("ml/a") == []


def test_tombstones_of_jobs_never_reconciled_are_swept_out_by_later_records() -> None:
    # A standby records deletes but never reconciles: what it holds must still expire.
    clock = FakeClock()
    tombstones = Tombstones(clock, ttl=600)
    for index in range(50):
        tombstones.record(f"ml/job-{index}", {"metadata": {"name": f"job-{index}-worker-0"}})
    assert len(tombstones) == 50
    clock.advance(601)
    tombstones.record("ml/new", {"metadata": {"name": "new-worker-0"}})
    assert len(tombstones) == 1
