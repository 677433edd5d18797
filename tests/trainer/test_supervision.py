"""The supervisor's decisions (trainer/trainingjob_progress/supervision.py), called directly.

Why: which order the supervisor follows, which it ignores and when it ends decide whether an in-place
restart restarts every rank exactly once, and whether a pod ends as it would have without a
supervisor. These are pure functions of the supervisor's state and the job, so every rule is checked
here without processes; tests/trainer/test_supervise.py runs the real thing.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from trainingjob_progress import supervision as sv
from trainingjob_progress.report import annotation_patch
from trainingjob_progress.watch import MAX_BACKOFF, backoff

from crd import contract

RUNNING_0 = sv.Supervision(attempt=0)
FAILED_0 = sv.Supervision(attempt=0, running=False, exit_code=3)


def job(state: str = "Running", attempt: int = 0, order: dict[str, Any] | None = None) -> sv.JobView:
    status: dict[str, Any] = {"state": state, "attempt": attempt}
    if order is not None:
        status["inPlaceRestart"] = order
    return sv.parse_job({"metadata": {"name": "mnist"}, "status": status})


def stopping(attempt: int) -> dict[str, Any]:
    return {"attempt": attempt, "phase": "Stopping", "since": "2026-01-01T00:00:00Z"}


def starting(attempt: int, resume_from: str | None = None) -> dict[str, Any]:
    order: dict[str, Any] = {"attempt": attempt, "phase": "Starting"}
    if resume_from is not None:
        order["resumeFrom"] = resume_from
    return order


def test_the_names_match_the_operators_contract() -> None:
    """The helper cannot import crd/ in a pod: its copies of the names must stay equal."""
    assert getattr(contract, "RUN_ANNOTATION", sv.RUN_ANNOTATION) == sv.RUN_ANNOTATION
    assert f"{contract.GROUP}/run" == sv.RUN_ANNOTATION
    assert set(sv.TERMINAL_STATES) == {str(state) for state in contract.FINISHED_STATES}


# --- reading the job -------------------------------------------------------------------------------


def test_parse_job_reads_state_attempt_and_the_order() -> None:
    view = job("Restarting", 2, starting(3, "/ckpt/epoch-4"))
    assert view == sv.JobView(state="Restarting", attempt=2, order=sv.Order(3, "Starting", "/ckpt/epoch-4"))
    assert not view.terminal


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "Starting",
        {"attempt": 1},
        {"attempt": 1, "phase": "Restarting"},
        {"attempt": -1, "phase": "Starting"},
        {"attempt": True, "phase": "Starting"},
        {"attempt": 1.5, "phase": "Starting"},
    ],
)
def test_an_order_it_does_not_understand_is_none(raw: object) -> None:
    assert sv.parse_order(raw) is None


def test_an_empty_resume_from_is_no_checkpoint() -> None:
    assert sv.parse_order({"attempt": 1, "phase": "Starting", "resumeFrom": ""}) == sv.Order(1, "Starting")


def test_a_job_without_status_is_running_without_order() -> None:
    assert sv.parse_job({"metadata": {}}) == sv.JobView()
    assert sv.parse_job({"status": "odd"}) == sv.JobView()


@pytest.mark.parametrize("state", ["Completed", "Failed"])
def test_finished_states_and_a_deleted_job_are_terminal(state: str) -> None:
    assert job(state).terminal
    assert sv.GONE.terminal


# --- deciding --------------------------------------------------------------------------------------


def test_nothing_before_the_job_is_read_and_nothing_without_order() -> None:
    assert sv.decide(RUNNING_0, None) == sv.Wait()
    assert sv.decide(RUNNING_0, job()) == sv.Wait()
    assert sv.decide(FAILED_0, job()) == sv.Wait()
    assert sv.decide(FAILED_0, None) == sv.Wait()


def test_a_child_that_succeeded_ends_the_supervisor_with_zero() -> None:
    done = sv.Supervision(attempt=0, running=False, exit_code=0)
    assert sv.decide(done, None) == sv.Exit(0)
    assert sv.decide(done, job(order=stopping(1))) == sv.Exit(0)


def test_a_child_stopped_by_an_order_that_exits_zero_waits_for_the_start() -> None:
    stopped = sv.Supervision(attempt=0, running=False, exit_code=0, ordered_stop=True)
    assert sv.decide(stopped, job(order=stopping(1))) == sv.Wait()
    assert sv.decide(stopped, job(attempt=1, order=starting(1))) == sv.Start(1)


def test_stopping_stops_a_running_child_once() -> None:
    assert sv.decide(RUNNING_0, job(order=stopping(1))) == sv.Stop()
    in_progress = sv.Supervision(attempt=0, stopping=True, ordered_stop=True)
    assert sv.decide(in_progress, job(order=stopping(1))) == sv.Wait()


def test_stopping_leaves_an_exited_child_alone() -> None:
    assert sv.decide(FAILED_0, job(order=stopping(1))) == sv.Wait()


def test_starting_starts_the_attempt_with_its_checkpoint_or_without() -> None:
    assert sv.decide(FAILED_0, job(attempt=1, order=starting(1, "/c/epoch-2"))) == sv.Start(1, "/c/epoch-2")
    assert sv.decide(FAILED_0, job(attempt=1, order=starting(1))) == sv.Start(1, None)
    # A running child (its Stopping order missed) is stopped first: the shell keeps the Start pending.
    assert sv.decide(RUNNING_0, job(attempt=1, order=starting(1))) == sv.Start(1, None)


def test_a_pending_start_stops_then_starts() -> None:
    pending = sv.Start(1, "/c/epoch-2")
    running = sv.Supervision(attempt=0, pending=pending)
    order = job(attempt=1, order=starting(1, "/c/epoch-2"))
    assert sv.decide(running, order) == sv.Stop()
    assert sv.decide(sv.Supervision(attempt=0, stopping=True, pending=pending), order) == sv.Wait()
    ended = sv.Supervision(attempt=0, running=False, exit_code=143, ordered_stop=True, pending=pending)
    assert sv.decide(ended, order) == pending
    # A newer order replaces it.
    assert sv.decide(ended, job(attempt=2, order=starting(2))) == sv.Start(2)


@pytest.mark.parametrize(
    "order",
    [stopping(0), starting(0), starting(1), stopping(1)],
    ids=["stop-old", "start-old", "start-same", "stop-same"],
)
def test_orders_for_an_attempt_it_ran_are_ignored(order: dict[str, Any]) -> None:
    on_one = sv.Supervision(attempt=1)
    assert sv.decide(on_one, job(attempt=1, order=order)) == sv.Wait()
    failed_one = sv.Supervision(attempt=1, running=False, exit_code=1)
    assert sv.decide(failed_one, job(attempt=1, order=order)) == sv.Wait()


@pytest.mark.parametrize(
    "view", [job("Failed"), job("Completed"), sv.GONE], ids=["failed", "completed", "gone"]
)
def test_a_terminal_or_deleted_job_ends_a_failed_child_with_its_code(view: sv.JobView) -> None:
    assert sv.decide(FAILED_0, view) == sv.Exit(3)
    assert sv.decide(RUNNING_0, view) == sv.Wait()


def test_a_terminal_job_wins_over_an_order() -> None:
    assert sv.decide(FAILED_0, job("Failed", 1, starting(1))) == sv.Exit(3)


def test_a_restart_that_recreates_the_pods_ends_a_failed_child() -> None:
    """status.attempt moved on without an in-place order for it: this pod is being replaced."""
    assert sv.decide(FAILED_0, job(attempt=1)) == sv.Exit(3)
    assert sv.decide(FAILED_0, job(attempt=2, order=stopping(1))) == sv.Exit(3)
    assert sv.decide(RUNNING_0, job(attempt=1)) == sv.Wait()
    # In place: the Stopping order for attempt 1 is out while status.attempt is still 0.
    assert sv.decide(FAILED_0, job(attempt=0, order=stopping(1))) == sv.Wait()


def test_a_terminating_supervisor_only_waits_for_its_child() -> None:
    terminating = sv.Supervision(attempt=0, terminating=True)
    assert sv.decide(terminating, job(attempt=1, order=starting(1))) == sv.Wait()
    ended = sv.Supervision(attempt=0, running=False, exit_code=143, terminating=True)
    assert sv.decide(ended, job(attempt=1, order=starting(1))) == sv.Exit(143)
    assert sv.decide(
        sv.Supervision(attempt=0, running=False, exit_code=5, terminating=True), None
    ) == sv.Exit(5)


# --- what it reports and passes on -----------------------------------------------------------------


def test_run_reports_are_compact_json_with_millisecond_utc_times() -> None:
    moment = datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=timezone(timedelta(hours=2)))
    assert sv.run_report(2, None, moment) == {
        "attempt": 2,
        "state": "Running",
        "at": "2026-03-04T03:06:07.891Z",
    }
    assert sv.run_report(2, 137, moment) == {
        "attempt": 2,
        "state": "Exited",
        "exitCode": 137,
        "at": "2026-03-04T03:06:07.891Z",
    }
    patch = json.loads(annotation_patch(sv.RUN_ANNOTATION, sv.run_report(0, 1, moment)))
    text = patch["metadata"]["annotations"][sv.RUN_ANNOTATION]
    assert " " not in text
    assert json.loads(text)["exitCode"] == 1


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (3, 3), (-15, 143), (-9, 137)])
def test_exit_status_is_a_shells(returncode: int, code: int) -> None:
    assert sv.exit_status(returncode) == code


def test_the_childs_environment_has_the_attempt_and_its_checkpoint_only() -> None:
    pod = {"TRAININGJOB_ATTEMPT": "0", "RESUME_FROM": "/c/epoch-1", "RANK": "3"}
    assert sv.child_env(pod, 1, "/c/epoch-5") == {
        "TRAININGJOB_ATTEMPT": "1",
        "RESUME_FROM": "/c/epoch-5",
        "RANK": "3",
    }
    assert sv.child_env(pod, 1, None) == {"TRAININGJOB_ATTEMPT": "1", "RANK": "3"}
    assert pod["RESUME_FROM"] == "/c/epoch-1"


def test_watch_events_are_parsed_or_refused() -> None:
    assert sv.watch_event(b'{"type": "MODIFIED", "object": {"a": 1}}\n') == ("MODIFIED", {"a": 1})
    for line in (b"[]", b'{"type": "MODIFIED"}', b"not json"):
        with pytest.raises(ValueError):  # noqa: PT011 - json's error is a ValueError too
            sv.watch_event(line)


def test_the_backoff_starts_short_and_is_capped() -> None:
    assert backoff(0) == 0.0
    assert backoff(1) == pytest.approx(0.1)
    assert backoff(2) == pytest.approx(0.2)
    assert backoff(50) == MAX_BACKOFF
