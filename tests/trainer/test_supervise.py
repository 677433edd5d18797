"""The in-place restart's supervisor (trainer/trainingjob_progress/supervise.py) as a real process.

Why: the supervisor is the trainer container's first process for InPlace jobs, so its mistakes end
pods or leave them running: it must report each child's start and end on its own pod, keep a failed
rank's container alive until the operator's order, stop and start children exactly as ordered (once,
however often the watch replays the job), pass the pod's SIGTERM on so the trainer saves its
checkpoint, end with the child's code when the pod must end, and get over a broken or expired watch.
Each test runs `python -m trainingjob_progress.supervise -- python -c <child>` against a small live API
on 127.0.0.1 (tests/trainer/supervisor_api.py) and waits for what it expects with deadlines.
"""

from __future__ import annotations

import re
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster import REPO
from tests.trainer import supervisor_api
from tests.trainer.supervised import Supervised, child_pid, process_gone, supervisor_env
from tests.trainer.supervisor_api import JobApi

AT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
Start = Callable[..., Supervised]


@pytest.fixture
def api() -> Iterator[JobApi]:
    with supervisor_api.running() as server:
        yield server


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("run-token\n")
    return path


@pytest.fixture
def supervise(api: JobApi, token: Path) -> Iterator[Start]:
    started: list[Supervised] = []

    def start(plan: str, command: list[str] | None = None, **env: str) -> Supervised:
        run = Supervised(supervisor_env(api, token, CHILD_PLAN=plan, **env), command)
        started.append(run)
        return run

    yield start
    for run in started:
        run.kill()


def running(attempt: int) -> dict[str, object]:
    return {"attempt": attempt, "state": "Running"}


def exited(attempt: int, code: int) -> dict[str, object]:
    return {"attempt": attempt, "state": "Exited", "exitCode": code}


def stopping(attempt: int) -> dict[str, object]:
    return {"attempt": attempt, "phase": "Stopping", "since": "2026-01-01T00:00:00Z"}


def starting(attempt: int, resume_from: str | None = None) -> dict[str, object]:
    order: dict[str, object] = {"attempt": attempt, "phase": "Starting", "since": "2026-01-01T00:00:05Z"}
    if resume_from:
        order["resumeFrom"] = resume_from
    return order


def watching(api: JobApi, count: int = 1) -> None:
    api.wait_until(lambda: len(api.watches) >= count, message=f"{count} watches")


def test_a_child_that_succeeds_is_reported_and_ends_the_supervisor_with_zero(
    api: JobApi, supervise: Start
) -> None:
    run = supervise("0=exit0")
    assert run.wait_line("child ")[1].startswith("child attempt=0 resume=- pid=")
    assert run.wait_exit() == 0
    assert api.runs() == [running(0), exited(0, 0)]
    for _, report in api.reports:
        assert list(report) in (["at", "attempt", "state"], ["at", "attempt", "exitCode", "state"])
        assert AT.match(report["at"]), report
    headers = api.patch_headers[0]
    assert headers["Content-Type"] == "application/merge-patch+json"
    assert headers["Authorization"] == "Bearer run-token"
    assert any(line.startswith("trainingjob-supervisor: attempt 0 started") for line in run.stderr)


def test_a_failed_child_waits_for_the_order_and_the_next_attempt_gets_its_checkpoint(
    api: JobApi, supervise: Start
) -> None:
    run = supervise("0=exit3,1=run", RESUME_FROM="/ckpt/epoch-1")
    assert "resume=/ckpt/epoch-1 " in run.wait_line("child ")[1]
    assert api.wait_for_runs(2) == [running(0), exited(0, 3)]
    watching(api)
    api.set_status(inPlaceRestart=stopping(1))
    api.set_status(attempt=1, inPlaceRestart=starting(1, "/ckpt/epoch-2"))
    assert run.wait_line("child ")[1].startswith("child attempt=1 resume=/ckpt/epoch-2 pid=")
    assert api.wait_for_runs(3) == [running(0), exited(0, 3), running(1)]
    assert run.alive  # the failed child of attempt 0 did not end it: it started attempt 1


def test_a_start_without_checkpoint_unsets_resume_from(api: JobApi, supervise: Start) -> None:
    run = supervise("0=exit1", RESUME_FROM="/ckpt/epoch-1")
    api.wait_for_runs(2)
    api.set_status(attempt=1, inPlaceRestart=starting(1))
    assert run.wait_line("child attempt=1")[1].startswith("child attempt=1 resume=- pid=")


def test_a_stopping_order_stops_a_running_child_which_saves_and_the_start_follows(
    api: JobApi, supervise: Start
) -> None:
    run = supervise("0=save,1=run")
    first = child_pid(run.wait_line("child ")[1])
    api.wait_for_runs(1)
    watching(api)
    api.set_status(inPlaceRestart=stopping(1))
    assert run.wait_line("saved")[1] == "saved attempt=0"
    assert api.wait_for_runs(2) == [running(0), exited(0, 143)]
    assert process_gone(first)
    api.set_status(attempt=1, inPlaceRestart=starting(1, "/ckpt/step-40"))
    assert "attempt=1 resume=/ckpt/step-40" in run.wait_line("child ")[1]
    assert api.wait_for_runs(3)[2] == running(1)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(api: JobApi, supervise: Start) -> None:
    run = supervise("0=ignore", TRAININGJOB_TERMINATION_GRACE_SECONDS="0.5")
    first = child_pid(run.wait_line("child ")[1])
    watching(api)
    api.set_status(inPlaceRestart=stopping(1))
    assert api.wait_for_runs(2) == [running(0), exited(0, 137)]
    assert process_gone(first)
    assert any("did not stop within 0.5 s" in line for line in run.stderr)
    assert run.alive


def test_a_starting_order_without_stopping_stops_the_running_child_first(
    api: JobApi, supervise: Start
) -> None:
    run = supervise("*=run")
    run.wait_line("child ")
    watching(api)
    api.set_status(attempt=1, inPlaceRestart=starting(1))
    assert run.wait_line("child ")[1].startswith("child attempt=1 ")
    assert api.wait_for_runs(3) == [running(0), exited(0, 143), running(1)]


def test_orders_it_has_followed_or_older_ones_are_ignored(api: JobApi, supervise: Start) -> None:
    run = supervise("0=exit1,*=run")
    api.wait_for_runs(2)
    watching(api)
    api.set_status(attempt=1, inPlaceRestart=starting(1))
    run.wait_line("child attempt=1")
    api.wait_for_runs(3)
    # The same order again, an older one, the Stopping of the running attempt, and a re-listed watch.
    api.set_status(attempt=1, inPlaceRestart=starting(1, "/ckpt/other"))
    api.set_status(inPlaceRestart=stopping(1))
    api.set_status(inPlaceRestart=starting(0))
    lists = api.lists
    api.cut_watches()
    api.wait_until(lambda: api.lists > lists, message="a new list")
    # A fence: the next real order. Everything before it was processed first, in order.
    api.set_status(inPlaceRestart=stopping(2))
    assert api.wait_for_runs(4) == [running(0), exited(0, 1), running(1), exited(1, 143)]
    assert run.alive
    assert run.lines.empty()  # no other child was started


@pytest.mark.parametrize("end", ["Failed", "Completed", "deleted", "recreated"])
def test_a_failed_child_ends_the_supervisor_with_its_code_when_the_job_will_not_restart_it_in_place(
    api: JobApi, supervise: Start, end: str
) -> None:
    run = supervise("0=exit5")
    api.wait_for_runs(2)
    watching(api)
    assert run.alive
    if end == "deleted":
        api.delete_job()
    elif end == "recreated":
        api.set_status(attempt=1, restartCount=1)
    else:
        api.set_status(state=end)
    assert run.wait_exit() == 5
    assert api.runs() == [running(0), exited(0, 5)]


def test_sigterm_reaches_the_child_which_saves_and_the_supervisor_exits_with_its_code(
    api: JobApi, supervise: Start
) -> None:
    run = supervise("0=save")
    first = child_pid(run.wait_line("child ")[1])
    api.wait_for_runs(1)
    run.signal(signal.SIGTERM)
    assert run.wait_line("saved")[1] == "saved attempt=0"
    assert run.wait_exit() == 143
    assert api.runs() == [running(0), exited(0, 143)]
    assert process_gone(first)


def test_sigint_reaches_the_child_too(api: JobApi, supervise: Start) -> None:
    run = supervise("0=run")
    run.wait_line("child ")
    api.wait_for_runs(1)
    run.signal(signal.SIGINT)
    assert run.wait_exit() == 128 + signal.SIGINT  # python -c's KeyboardInterrupt ends it by SIGINT


def test_a_second_signal_kills_a_child_that_ignores_the_first(api: JobApi, supervise: Start) -> None:
    run = supervise("0=ignore")
    first = child_pid(run.wait_line("child ")[1])
    api.wait_for_runs(1)
    run.signal(signal.SIGTERM)
    api.wait_until(lambda: any("SIGTERM received" in line for line in run.stderr), message="the first signal")
    run.signal(signal.SIGTERM)
    assert run.wait_exit() == 137
    assert process_gone(first)


def test_what_a_child_leaves_in_its_process_group_is_killed_when_it_ends(
    api: JobApi, supervise: Start
) -> None:
    """A data loader's worker outliving its trainer must not hold on into the next attempt."""
    run = supervise("", command=["/bin/sh", "-c", 'sleep 600 & echo "child attempt=0 pid=$!"; exit 4'])
    leftover = child_pid(run.wait_line("child ")[1])
    assert api.wait_for_runs(2) == [running(0), exited(0, 4)]
    api.wait_until(lambda: process_gone(leftover), message="the leftover process killed")
    assert run.alive


def test_sigterm_while_waiting_for_an_order_exits_with_the_failed_childs_code(
    api: JobApi, supervise: Start
) -> None:
    run = supervise("0=exit7")
    api.wait_for_runs(2)
    run.signal(signal.SIGTERM)
    assert run.wait_exit() == 7


def test_a_cut_watch_is_listed_again_and_sees_the_order_it_missed(api: JobApi, supervise: Start) -> None:
    run = supervise("0=exit1,*=run")
    api.wait_for_runs(2)
    watching(api)
    api.set_status(silent=True, attempt=1, inPlaceRestart=starting(1, "/ckpt/a"))
    api.cut_watches()
    assert "attempt=1 resume=/ckpt/a" in run.wait_line("child attempt=1")[1]
    assert api.lists >= 2


def test_an_expired_watch_is_listed_again_and_sees_the_order_it_missed(api: JobApi, supervise: Start) -> None:
    run = supervise("0=exit1,*=run")
    api.wait_for_runs(2)
    watching(api)
    api.set_status(silent=True, attempt=1, inPlaceRestart=starting(1))
    api.expire_watches()
    run.wait_line("child attempt=1 ")
    assert api.lists >= 2
    assert any("expired" in line for line in run.stderr)


def test_lists_that_fail_are_tried_again_after_a_short_backoff_and_said_once(
    api: JobApi, supervise: Start
) -> None:
    run = supervise("0=exit1,*=run")
    api.wait_for_runs(2)
    watching(api)
    lists = api.lists
    api.refuse_lists = 3
    api.set_status(silent=True, attempt=1, inPlaceRestart=starting(1))
    api.cut_watches()
    run.wait_line("child attempt=1 ")
    assert api.lists >= lists + 4
    refused = [line for line in run.stderr if "cannot watch the TrainingJob (HTTP 500" in line]
    assert refused == [
        "trainingjob-supervisor: cannot watch the TrainingJob "
        "(HTTP 500: etcdserver: request timed out); retrying"
    ]


def test_a_refused_report_is_sent_again_and_one_refused_every_time_is_said_once(
    api: JobApi, supervise: Start
) -> None:
    api.refuse_patches = 2
    run = supervise("0=exit1,*=run")
    assert api.wait_for_runs(1) == [running(0)]  # the third try
    api.wait_for_runs(2)
    api.refuse_patches = 4
    api.set_status(attempt=1, inPlaceRestart=starting(1))
    run.wait_line("child attempt=1 ")
    api.wait_until(
        lambda: any("could not report Running of attempt 1 after 4 tries" in line for line in run.stderr),
        message="the report given up",
    )
    assert api.runs() == [running(0), exited(0, 1)]
    assert api.refused_patches == 6
    assert run.alive


def test_the_watch_asks_for_bookmarks_from_the_lists_version(api: JobApi, supervise: Start) -> None:
    supervise("0=run")
    watching(api)
    query = api.watches[0]
    assert query["allowWatchBookmarks"] == "true"
    assert query["resourceVersion"] == "1"
    assert query["fieldSelector"] == "metadata.name=mnist"


def test_a_command_that_does_not_exist_is_a_child_that_exited_127(api: JobApi, supervise: Start) -> None:
    run = supervise("", command=["/nonexistent/trainer"])
    assert api.wait_for_runs(1) == [exited(0, 127)]
    api.set_status(state="Failed")
    assert run.wait_exit() == 127


def test_outside_a_pod_it_says_what_is_missing_in_one_line_and_exits_2(tmp_path: Path) -> None:
    run = Supervised({"PYTHONPATH": str(REPO / "trainer")})
    assert run.wait_exit() == 2
    assert run.stderr == [
        "trainingjob-supervisor: not in a TrainingJob's pod: TRAININGJOB_NAME, TRAININGJOB_NAMESPACE, "
        "POD_NAME, KUBERNETES_SERVICE_HOST not set"
    ]


@pytest.mark.parametrize("child", ["sh", "python"])
def test_how_long_a_starting_order_takes_to_the_new_childs_first_line(
    api: JobApi, supervise: Start, child: str
) -> None:
    """A figure for the report, not a limit: from the order on the watch to the child's first line."""
    command = (
        ["/bin/sh", "-c", 'echo "child attempt=$TRAININGJOB_ATTEMPT"; exit 1']
        if child == "sh"
        else [
            sys.executable,
            "-c",
            "import os; print('child attempt=' + os.environ['TRAININGJOB_ATTEMPT'])\nexit(1)",
        ]
    )
    run = supervise("", command=command)
    run.wait_line("child attempt=0")
    api.wait_for_runs(2)
    watching(api)
    delays = []
    for attempt in range(1, 11):
        ordered = time.monotonic()
        api.set_status(attempt=attempt, inPlaceRestart=starting(attempt))
        at, line = run.wait_line("child ")
        assert line == f"child attempt={attempt}"
        delays.append(at - ordered)
        api.wait_for_runs(2 * attempt + 2)
    print(
        f"\n{child} child: Starting order to first line: median {statistics.median(delays) * 1000:.1f} ms, "
        f"max {max(delays) * 1000:.1f} ms over {len(delays)} restarts"
    )
