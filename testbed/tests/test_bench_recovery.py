"""The recovery bench's decisions without a cluster: when a gang counts as running again and as
reporting in its new run, how pods split into gangs, the summary of a series, and refused options.

Why: `make bench-recovery` (docs/bench.md, "Recovery") times from a fault to a condition on the pods;
a condition that held too early (an old pod still running, a report of the failed run) would make a
slow restart look fast, so each is checked here on pods as the watch sees them.
"""

from __future__ import annotations

from typing import Any

import pytest

from crd import contract
from testbed.harness.bench.podtimeline import RankRun, all_running_again, new_run_reported, rank_run
from testbed.harness.bench.recovery import parse_options, summary
from testbed.harness.bench.recoverygang import gang_sizes, restarted


def pod(
    name: str,
    uid: str,
    *,
    attempt: int = 0,
    restarts: int = 0,
    running: bool = True,
    reported: bool = False,
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "uid": uid,
        "labels": {contract.ATTEMPT_LABEL: str(attempt)},
        "annotations": {contract.PROGRESS_ANNOTATION: ""} if reported else {},
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state = {"running": {}} if running else {"terminated": {"exitCode": 1}}
    return {
        "metadata": metadata,
        "status": {
            "phase": "Running" if running else "Failed",
            "containerStatuses": [
                {"name": contract.CONTAINER_NAME, "restartCount": restarts, "state": state}
            ],
        },
    }


def runs(*pods: dict[str, Any]) -> dict[str, RankRun]:
    return {(run := rank_run(p)).name: run for p in pods}


RANKS = ("job-worker-0", "job-worker-1")
OLD = runs(pod("job-worker-0", "a", reported=True), pod("job-worker-1", "b"))
BEFORE = {name: run.identity for name, run in OLD.items()}


def test_the_old_pods_running_are_not_a_recovery() -> None:
    assert all_running_again(OLD, RANKS, {})
    assert not all_running_again(OLD, RANKS, BEFORE)
    assert not new_run_reported(OLD, RANKS[0], BEFORE)


def test_every_rank_must_run_a_new_trainer() -> None:
    # One pod recreated and running, the other still the old one (or being deleted): not yet.
    half = runs(pod("job-worker-0", "c", attempt=1), pod("job-worker-1", "b"))
    assert not all_running_again(half, RANKS, BEFORE)
    leaving = runs(pod("job-worker-0", "c", attempt=1), pod("job-worker-1", "d", attempt=1, deleting=True))
    assert not all_running_again(leaving, RANKS, BEFORE)
    waiting = runs(pod("job-worker-0", "c", attempt=1), pod("job-worker-1", "d", attempt=1, running=False))
    assert not all_running_again(waiting, RANKS, BEFORE)
    both = runs(pod("job-worker-0", "c", attempt=1), pod("job-worker-1", "d", attempt=1))
    assert all_running_again(both, RANKS, BEFORE)
    assert not new_run_reported(both, RANKS[0], BEFORE)
    assert new_run_reported(runs(pod("job-worker-0", "c", attempt=1, reported=True)), RANKS[0], BEFORE)


def test_a_container_restarted_in_its_pod_or_a_new_attempt_label_is_a_new_run() -> None:
    # Kept pods: the kubelet restarting the container, or the attempt moving on, makes a new run.
    kept = runs(pod("job-worker-0", "a", restarts=1, reported=True), pod("job-worker-1", "b", attempt=1))
    assert all_running_again(kept, RANKS, BEFORE)
    assert new_run_reported(kept, RANKS[0], BEFORE)


def test_a_gang_restart_at_scale_is_done_when_every_pod_runs_anew() -> None:
    before = {"g-worker-0": ("a", "0", 0), "g-worker-1": ("b", "0", 0)}
    partial = runs(pod("g-worker-0", "c", attempt=1))
    assert not restarted(partial, 2, before)
    old = runs(pod("g-worker-0", "c", attempt=1), pod("g-worker-1", "b"))
    assert not restarted(old, 2, before)
    assert restarted(runs(pod("g-worker-0", "c", attempt=1), pod("g-worker-1", "d", attempt=1)), 2, before)


def test_pods_split_into_gangs_of_at_most_the_gang_size() -> None:
    assert gang_sizes(256, 64) == [64, 64, 64, 64]
    assert gang_sizes(1024, 100) == [100] * 10 + [24]
    assert gang_sizes(5, 10) == [5]


def test_summary_is_the_median_and_max() -> None:
    assert summary([3.0, 1.0, 2.0]) == {"count": 3, "median": 2.0, "max": 3.0, "values": [3.0, 1.0, 2.0]}
    assert summary([]) == {"count": 0}


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--parts", "node,disk"], "--parts"),
        (["--gang", "101"], "--gang"),
        (["--sizes", "many"], "--sizes"),
        (["--failures", "-1"], "--failures"),
    ],
)
def test_options_that_cannot_work_are_refused_naming_the_flag(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        parse_options(argv)
    assert ended.value.code == 2
    assert error in capsys.readouterr().err
