"""What the supervisor of an in-place restart decides, apart from doing it: pure functions and values.

A TrainingJob with `spec.failurePolicy.restartStrategy: InPlace` keeps its pods across a gang restart;
each trainer container runs `python3 -m trainingjob_progress.supervise -- <command>`, which starts the
training process and restarts it when the operator orders (status.inPlaceRestart), reporting each
process's start and end in its own pod's run annotation. Every rule about which order to follow,
which to ignore and when the supervisor itself must end lives here, so the unit tests call it directly
with a state and a TrainingJob; supervise.py only does what these functions return (processes,
signals, the API).

Standard library only, Python 3.9 or later, like every module of the helper. The names below are the
contract with the operator (crd/contract.py defines the same ones; the helper never imports the
operator's packages, as it runs in users' images).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Union

from .base import UTC

# The pod annotation the supervisor reports in: {"attempt", "state", "exitCode" (Exited only), "at"}.
RUN_ANNOTATION: Final = "ml.example.com/run"
# The TrainingJob's status field the operator orders an in-place restart with:
# {"attempt": N, "phase": "Stopping" | "Starting", "resumeFrom": "<path>" (optional), "since": ...}.
IN_PLACE_RESTART_FIELD: Final = "inPlaceRestart"
STOPPING: Final = "Stopping"
STARTING: Final = "Starting"
RUNNING: Final = "Running"
EXITED: Final = "Exited"
# status.state of a job that will never run again.
TERMINAL_STATES: Final = ("Completed", "Failed")


@dataclass(frozen=True)
class Order:
    """status.inPlaceRestart: bring every rank to `attempt`, first stopped, then started."""

    attempt: int
    phase: str
    resume_from: str | None = None


@dataclass(frozen=True)
class JobView:
    """What the supervisor reads of its TrainingJob. `gone`: deleted (or never found)."""

    gone: bool = False
    state: str = ""
    attempt: int | None = None
    order: Order | None = None

    @property
    def terminal(self) -> bool:
        return self.gone or self.state in TERMINAL_STATES


GONE: Final = JobView(gone=True)


def whole(value: object) -> int | None:
    """A non-negative int from JSON (not a bool, not a float), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def parse_order(raw: object) -> Order | None:
    """status.inPlaceRestart as an Order; None when absent or not understood (then it is ignored)."""
    if not isinstance(raw, Mapping):
        return None
    attempt = whole(raw.get("attempt"))
    phase = raw.get("phase")
    if attempt is None or phase not in (STOPPING, STARTING):
        return None
    resume_from = raw.get("resumeFrom")
    if not isinstance(resume_from, str) or not resume_from:
        resume_from = None
    return Order(attempt=attempt, phase=str(phase), resume_from=resume_from)


def parse_job(obj: Mapping[str, Any]) -> JobView:
    """The parts of a TrainingJob (as the API returns it) that the supervisor acts on."""
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return JobView()
    state = status.get("state")
    return JobView(
        state=state if isinstance(state, str) else "",
        attempt=whole(status.get("attempt")),
        order=parse_order(status.get(IN_PLACE_RESTART_FIELD)),
    )


@dataclass(frozen=True)
class Supervision:
    """The supervisor's state: the newest attempt it started a child for, and that child's fate.

    running: the child is alive. stopping: the supervisor has told it to stop (an order or a signal).
    exit_code: how it ended (None while alive). terminating: the supervisor got SIGTERM or SIGINT and
    only waits for the child to end. ordered_stop: the child was stopped by an order, so even a clean
    exit (0) does not end the supervisor: the next attempt follows.
    """

    attempt: int
    running: bool = True
    stopping: bool = False
    exit_code: int | None = None
    terminating: bool = False
    ordered_stop: bool = False
    pending: Start | None = None


@dataclass(frozen=True)
class Wait:
    """Nothing to do until the next event."""


@dataclass(frozen=True)
class Stop:
    """Stop the running child (SIGTERM to its group, SIGKILL after the grace period)."""


@dataclass(frozen=True)
class Start:
    """Start the child of `attempt` (stopping a child still running first)."""

    attempt: int
    resume_from: str | None = None


@dataclass(frozen=True)
class Exit:
    """End the supervisor with the child's code: the pod ends as it would have without one."""

    code: int


Action = Union[Wait, Stop, Start, Exit]  # noqa: UP007 - a run-time alias on Python 3.9


def decide(state: Supervision, job: JobView | None) -> Action:
    """What to do now, given the state and the newest view of the job (None: not read yet).

    - A terminating supervisor only waits for its child, then exits with its code.
    - A child that ended 0 on its own ends the supervisor with 0 (the pod completes, as today).
    - An order for an attempt newer than any the supervisor ran or is about to run: Starting starts
      it (once the child still running has stopped), Stopping stops a running child. Orders for an
      attempt already run or running are ignored, so a replayed watch is harmless.
    - A failed child waits for an order, unless the job is gone or terminal, or moved to a newer
      attempt without an in-place order for it (the operator recreates the pods instead): then the
      supervisor exits with the child's code.
    """
    exited = not state.running
    code = state.exit_code or 0
    if state.terminating:
        return Exit(code) if exited else Wait()
    if exited and code == 0 and not state.ordered_stop:
        return Exit(0)
    if job is None:
        return Wait()
    if job.terminal:
        return Exit(code) if exited else Wait()
    return follow_orders(state, job)


def follow_orders(state: Supervision, job: JobView) -> Action:
    """decide() for a supervisor that goes on and a job that may still restart in place."""
    newest = max(state.attempt, state.pending.attempt if state.pending else -1)
    order = job.order
    if order is not None and job.attempt is not None and order.attempt < job.attempt:
        order = None  # left over from a restart that went on without it (the pods were recreated)
    if order is not None and order.attempt > newest:
        if order.phase == STARTING:
            return Start(order.attempt, order.resume_from)
        return Stop() if state.running and not state.stopping else Wait()
    if state.pending is not None:
        if not state.running:
            return state.pending
        return Wait() if state.stopping else Stop()
    recreated = job.attempt is not None and job.attempt > state.attempt
    if not state.running and recreated and order is None:
        return Exit(state.exit_code or 0)
    return Wait()


def exit_status(returncode: int) -> int:
    """A child's exit code as a shell reports it: 128+N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def run_report(attempt: int, exit_code: int | None, moment: datetime) -> dict[str, Any]:
    """The run annotation's document: Running (exit_code None) or Exited with the code."""
    report: dict[str, Any] = {"attempt": attempt, "state": RUNNING if exit_code is None else EXITED}
    if exit_code is not None:
        report["exitCode"] = exit_code
    report["at"] = (
        moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    )
    return report


def child_env(environ: Mapping[str, str], attempt: int, resume_from: str | None) -> dict[str, str]:
    """The environment of the child of a restarted attempt: the pod's, with that attempt's
    TRAININGJOB_ATTEMPT and RESUME_FROM (unset when the order names no checkpoint)."""
    env = dict(environ)
    env["TRAININGJOB_ATTEMPT"] = str(attempt)
    env.pop("RESUME_FROM", None)
    if resume_from:
        env["RESUME_FROM"] = resume_from
    return env


def watch_event(line: bytes) -> tuple[str, Mapping[str, Any]]:
    """One line of a watch stream: its type and object. Raises ValueError for a line that is not one."""
    event = json.loads(line)
    if not isinstance(event, Mapping) or not isinstance(event.get("object"), Mapping):
        raise ValueError("not a watch event")
    return str(event.get("type", "")), event["object"]
