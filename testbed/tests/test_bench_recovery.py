"""The recovery bench's decisions without a cluster: when a gang counts as running again and as
reporting in its new run, how pods split into gangs, the summary of a series, and refused options.

Why: `make bench-recovery` (docs/bench.md, "Recovery") times from a fault to a condition on the pods;
a condition that held too early (an old pod still running, a report of the failed run) would make a
slow restart look fast, so each is checked here on pods as the watch sees them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from crd import contract
from testbed.harness.bench.podtimeline import RankRun, all_running_again, new_run_reported, next_run, rank_run
from testbed.harness.bench.recovery import parse_options, summary, training_job
from testbed.harness.bench.recoverygang import gang_job, gang_sizes, restarted
from testbed.harness.bench.restartphases import OrderSeen, RunReport, compared, medians, run_report, steps
from testbed.harness.bench.supervisors import answers, run_annotation


def pod(
    name: str,
    uid: str,
    *,
    attempt: int = 0,
    restarts: int = 0,
    running: bool = True,
    reported: bool = False,
    deleting: bool = False,
    progress: str | None = None,
    run: tuple[int, str] | None = None,
) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if reported or progress is not None:
        annotations[contract.PROGRESS_ANNOTATION] = progress or ""
    if run is not None:
        annotations[contract.RUN_ANNOTATION] = json.dumps({"attempt": run[0], "state": run[1], "at": "x"})
    metadata: dict[str, Any] = {
        "name": name,
        "uid": uid,
        "labels": {contract.ATTEMPT_LABEL: str(attempt)},
        "annotations": annotations,
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


def test_a_kept_pod_runs_again_when_its_supervisor_reports_a_newer_attempt_running() -> None:
    """InPlace: the pods, their UIDs, attempt labels and containers stay; the run annotation moves on."""
    old = runs(
        pod("job-worker-0", "a", progress="epoch 3", run=(0, "Running")),
        pod("job-worker-1", "b", run=(0, "Running")),
    )
    before = {name: run.identity for name, run in old.items()}
    assert all_running_again(old, RANKS, {})
    failed = runs(pod("job-worker-0", "a", run=(0, "Running")), pod("job-worker-1", "b", run=(0, "Exited")))
    assert not all_running_again(failed, RANKS, {}), "a rank whose process exited does not run"
    half = runs(pod("job-worker-0", "a", run=(1, "Running")), pod("job-worker-1", "b", run=(0, "Exited")))
    assert not all_running_again(half, RANKS, before)
    both = runs(pod("job-worker-0", "a", run=(1, "Running")), pod("job-worker-1", "b", run=(1, "Running")))
    assert all_running_again(both, RANKS, before)


def test_a_kept_pods_new_run_has_reported_only_when_its_progress_changed_after_it_began() -> None:
    """The kept pod still holds the previous run's last report: that is not the new run's."""
    first = next_run(None, rank_run(pod("job-worker-0", "a", progress="epoch 3", run=(0, "Running"))))
    assert first.reported
    before = {first.name: first.identity}
    saved = next_run(first, rank_run(pod("job-worker-0", "a", progress="epoch 3 step 7", run=(0, "Exited"))))
    started = next_run(
        saved, rank_run(pod("job-worker-0", "a", progress="epoch 3 step 7", run=(1, "Running")))
    )
    assert not new_run_reported({started.name: started}, RANKS[0], before)
    same_run = next_run(
        started, rank_run(pod("job-worker-0", "a", progress="epoch 3 step 7", run=(1, "Running")))
    )
    assert not new_run_reported({started.name: same_run}, RANKS[0], before)
    reported = next_run(same_run, rank_run(pod("job-worker-0", "a", progress="epoch 4", run=(1, "Running"))))
    assert new_run_reported({reported.name: reported}, RANKS[0], before)
    # A new pod of the same name begins without a report.
    fresh = next_run(reported, rank_run(pod("job-worker-0", "c", attempt=2)))
    assert not fresh.reported


def test_the_bench_answers_orders_as_the_supervisors_would() -> None:
    reported = {"p-0": (0, "Exited"), "p-1": (0, "Running"), "p-2": (1, "Running")}
    assert answers({"attempt": 1, "phase": "Stopping"}, reported) == {"p-1": (0, "Exited", 143)}
    assert answers({"attempt": 1, "phase": "Starting"}, reported) == {
        "p-0": (1, "Running", None),
        "p-1": (1, "Running", None),
    }
    assert answers(None, reported) == {}
    assert answers({"attempt": "1", "phase": "Starting"}, reported) == {}
    text = run_annotation(2, "Exited", 1)["metadata"]["annotations"][contract.RUN_ANNOTATION]
    report = json.loads(text)
    assert report["attempt"] == 2
    assert report["state"] == "Exited"
    assert report["exitCode"] == 1
    assert " " not in text


def test_in_place_jobs_ask_for_it_and_keep_the_default_command() -> None:
    for job in (training_job("InPlace"), gang_job("ns", "g", 4, "InPlace")):
        assert job["spec"]["failurePolicy"]["restartStrategy"] == "InPlace"
    for job in (training_job(), gang_job("ns", "g", 4)):
        assert "restartStrategy" not in job["spec"]["failurePolicy"]
    for job in (training_job("InPlace"), gang_job("ns", "g", 4, "InPlace"), training_job()):
        assert "command" not in job["spec"]


def test_a_gang_restart_at_scale_is_done_when_every_pod_runs_anew() -> None:
    before = {"g-worker-0": ("a", "0", 0, -1), "g-worker-1": ("b", "0", 0, -1)}
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
        (["--restart-strategy", "Sometimes"], "--restart-strategy"),
        (["--restart-strategy", "InPlace,InPlace"], "--restart-strategy"),
    ],
)
def test_options_that_cannot_work_are_refused_naming_the_flag(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        parse_options(argv)
    assert ended.value.code == 2
    assert error in capsys.readouterr().err


def test_an_in_place_restarts_steps_are_timed_from_the_fault() -> None:
    """Each step of the first in-place restart after the fault, from the supervisors' stamps and the
    moments the orders were seen; an order of an earlier restart is not this one's."""
    ranks = ("job-worker-0", "job-worker-1")

    def report(pod: str, attempt: int, state: str, at: str) -> RunReport:
        found = run_report(
            pod, json.dumps({"attempt": attempt, "state": state, "at": f"2026-11-29T10:00:{at}Z"})
        )
        assert found is not None
        return found

    fault = report(ranks[0], 1, "Running", "00.000").at
    reports = [
        report(ranks[1], 0, "Exited", "00.300"),  # an earlier restart's
        report(ranks[0], 1, "Running", "00.000"),
        report(ranks[1], 1, "Exited", "01.250"),
        report(ranks[0], 1, "Exited", "01.900"),
        report(ranks[1], 2, "Running", "02.400"),
        report(ranks[0], 2, "Running", "02.450"),
    ]
    orders = [
        OrderSeen(1, "Stopping", fault - 30),
        OrderSeen(2, "Stopping", fault + 1.5),
        OrderSeen(2, "Starting", fault + 2.2),
    ]
    assert steps(fault, ranks, ranks[1], reports, orders) == {
        "failed_rank_exited": 1.25,
        "stopping_order_seen": 1.5,
        "every_rank_exited": 1.9,
        "starting_order_seen": 2.2,
        "every_rank_running": 2.45,
    }
    # Pods recreated instead: no order after the fault, no steps.
    assert steps(fault, ranks, ranks[1], reports, orders[:1]) == {}
    # A rank that has not started the new attempt yet leaves that step out.
    assert "every_rank_running" not in steps(fault, ranks, ranks[1], reports[:-1], orders)
    assert medians([{"failed_rank_exited": 1.0}, {"failed_rank_exited": 3.0, "every_rank_running": 4.0}]) == {
        "failed_rank_exited": 2.0,
        "every_rank_running": 4.0,
    }
    assert run_report(ranks[0], "not json") is None
    assert run_report(ranks[0], json.dumps({"attempt": 1, "state": "Running"})) is None  # no time


def test_both_strategies_in_one_run_are_compared_by_their_medians() -> None:
    assert parse_options(["--restart-strategy", "InPlace,Recreate"]).restart_strategies == (
        "InPlace",
        "Recreate",
    )
    assert parse_options([]).restart_strategies == ("Recreate",)

    def node(running: float, reported: float) -> dict[str, Any]:
        figures = {"to_every_rank_running": running, "to_first_report": reported}
        return {"failure": {name: {"count": 5, "median": value} for name, value in figures.items()}}

    both = compared({"InPlace": node(0.3, 2.4), "Recreate": node(4.0, 6.0)})
    assert both["in_place_against_recreate"] == {"to_every_rank_running": 0.075, "to_first_report": 0.4}
    assert both["InPlace"] == node(0.3, 2.4)
    assert "in_place_against_recreate" not in compared({"InPlace": node(0.3, 2.4)})
