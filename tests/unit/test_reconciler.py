"""The helpers behind reporting create failures on a job (the planner's summary and blocked state).

The reconciler around them is tested in process in tests/unit/test_shell.py, and end to end in
tests/e2e/test_reconcile.py.
"""

from __future__ import annotations

from controller.planner.texts import MAX_LISTED_PROBLEMS, MAX_PROBLEM_TEXT
from controller.planner.texts import summary as _summary
from controller.planner.transitions import blocked as _blocked


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
