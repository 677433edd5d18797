"""python3 -m trainingjob_progress.supervise -- <command...>: the trainer container's first process when a
TrainingJob restarts in place (spec.failurePolicy.restartStrategy: InPlace).

Why it exists: recreating a gang's pods to restart training costs seconds per rank (scheduling, the
sandbox, volumes, the image, the container); keeping the pods and restarting only the training
process costs milliseconds. This process starts the command as its child, tells the operator through
its own pod's run annotation when a child of an attempt runs and how it ended, watches its TrainingJob
for the operator's order (status.inPlaceRestart: stop, then start attempt N with RESUME_FROM), and
otherwise stays out of the way: the child inherits stdout and stderr, SIGTERM and SIGINT go to the
child's process group (a deleted pod's trainer saves its checkpoint as without a supervisor), and the
supervisor ends with the child's exit code whenever the pod must end (success, a terminal or deleted
job, a restart that recreates the pods, a signal). What to do when is decided in supervision.py; this
module only does it. Standard library only, Python 3.9 or later (it runs in users' images).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from types import FrameType
from typing import Any, Final, Union

from .base import DEFAULT_TIMEOUT, SERVICE_ACCOUNT_DIR, UTC, OnceLogger, log
from .report import annotation_patch
from .stop import grace_period_seconds
from .supervision import (
    RUN_ANNOTATION,
    Action,
    Exit,
    JobView,
    Start,
    Stop,
    Supervision,
    Wait,
    child_env,
    decide,
    exit_status,
    run_report,
)
from .transport import MERGE_PATCH, ApiAccess, open_api, pod_url, read_text
from .watch import JobWatch

USAGE: Final = "usage: python3 -m trainingjob_progress.supervise -- <command> [args...]"
# Kubernetes' default terminationGracePeriodSeconds, for a pod that does not say (it always does).
DEFAULT_GRACE: Final = 30.0
# A run report that fails is tried this many times, this long apart, before it is given up (the
# operator's deadline then recreates the gang's pods).
REPORT_TRIES: Final = 4
REPORT_RETRY_DELAY: Final = 0.25
# How long the last reports may take to leave before the supervisor exits.
FLUSH_TIMEOUT: Final = 2 * DEFAULT_TIMEOUT
EXIT_NOT_FOUND: Final = 127
EXIT_NOT_EXECUTABLE: Final = 126
EXIT_USAGE: Final = 2


class ConfigError(Exception):
    """The environment lacks what the supervisor needs: one line, exit code 2."""


@dataclass(frozen=True)
class Config:
    namespace: str
    job_name: str
    pod_name: str
    attempt: int
    grace_seconds: float
    access: ApiAccess

    @classmethod
    def from_env(cls, environ: Mapping[str, str], service_account_dir: str = SERVICE_ACCOUNT_DIR) -> Config:
        """What the operator injects into a trainer container (builders/env.py)."""
        access = ApiAccess.from_env(environ, service_account_dir)
        namespace = environ.get("TRAININGJOB_NAMESPACE", "").strip() or read_text(
            f"{service_account_dir}/namespace"
        )
        values = {
            "TRAININGJOB_NAME": environ.get("TRAININGJOB_NAME", "").strip(),
            "TRAININGJOB_NAMESPACE": namespace or "",
            "POD_NAME": environ.get("POD_NAME", "").strip(),
            "KUBERNETES_SERVICE_HOST": access.url if access else "",
        }
        missing = [name for name, value in values.items() if not value]
        if missing or access is None:
            raise ConfigError(f"not in a TrainingJob's pod: {', '.join(missing)} not set")
        attempt_text = environ.get("TRAININGJOB_ATTEMPT", "0").strip() or "0"
        if not attempt_text.isdigit():
            raise ConfigError(f"TRAININGJOB_ATTEMPT is not a whole number: {attempt_text!r}")
        grace = grace_period_seconds(environ)
        return cls(
            namespace=values["TRAININGJOB_NAMESPACE"],
            job_name=values["TRAININGJOB_NAME"],
            pod_name=values["POD_NAME"],
            attempt=int(attempt_text),
            grace_seconds=DEFAULT_GRACE if grace is None or grace < 0 else grace,
            access=access,
        )


class RunReporter:
    """PATCHes run reports onto the pod's annotation from a thread, in order, each retried a few times."""

    def __init__(self, config: Config, once: OnceLogger) -> None:
        self._url = pod_url(config.access.url, config.namespace, config.pod_name)
        self._access = config.access
        self._once = once
        self._queue: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._done = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="trainingjob-run-report", daemon=True)
        self._thread.start()

    def put(self, report: dict[str, Any]) -> None:
        with self._done:
            self._pending += 1
        self._queue.put(report)

    def flush(self, timeout: float) -> bool:
        with self._done:
            return self._done.wait_for(lambda: self._pending == 0, timeout)

    def _run(self) -> None:
        while True:
            report = self._queue.get()
            self._send(report)
            with self._done:
                self._pending -= 1
                self._done.notify_all()

    def _send(self, report: Mapping[str, Any]) -> None:
        body = annotation_patch(RUN_ANNOTATION, report)
        error: Exception | None = None
        for attempt in range(REPORT_TRIES):
            if attempt:
                time.sleep(REPORT_RETRY_DELAY)
            try:
                with open_api(
                    self._url,
                    method="PATCH",
                    body=body,
                    content_type=MERGE_PATCH,
                    token_path=self._access.token_path,
                    ca_path=self._access.ca_path,
                    timeout=DEFAULT_TIMEOUT,
                    once=self._once,
                ) as response:
                    response.read()
                return
            except Exception as caught:
                error = caught
        reason = getattr(error, "reason", error)
        log.warning(
            "could not report %s of attempt %s after %d tries (%s: %s)",
            report.get("state"),
            report.get("attempt"),
            REPORT_TRIES,
            type(reason).__name__,
            reason,
        )


# What the main loop is told: a new version of the job, a child that ended, a signal, a grace
# period that ran out.
@dataclass(frozen=True)
class JobSeen:
    job: JobView


@dataclass(frozen=True)
class ChildEnded:
    serial: int
    returncode: int


@dataclass(frozen=True)
class Signalled:
    signum: int


@dataclass(frozen=True)
class GraceOver:
    serial: int


Event = Union[JobSeen, ChildEnded, Signalled, GraceOver]  # noqa: UP007 - a run-time alias on Python 3.9


class Supervisor:
    """Runs the command under supervision until decide() says to exit; returns the exit code."""

    def __init__(
        self, config: Config, command: Sequence[str], environ: Mapping[str, str], once: OnceLogger
    ) -> None:
        self._config = config
        self._command = list(command)
        self._environ = dict(environ)
        self._events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._reporter = RunReporter(config, once)
        self._watch = JobWatch(
            access=config.access,
            namespace=config.namespace,
            name=config.job_name,
            on_job=lambda job: self._events.put(JobSeen(job)),
            once=once,
        )
        self._state = Supervision(attempt=config.attempt, running=False)
        self._job: JobView | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._serial = 0
        self._timer: threading.Timer | None = None

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        self._launch(self._config.attempt, self._environ)
        self._watch.start()
        try:
            while True:
                action = decide(self._state, self._job)
                if isinstance(action, Exit):
                    return self._exit(action.code)
                if isinstance(action, Wait):
                    self._handle(self._next_event())
                else:
                    self._act(action)
        finally:
            if self._state.running:  # only after a bug: never leave the child behind
                self._signal_child(signal.SIGKILL)

    def _next_event(self) -> Event:
        while True:
            try:
                # A timeout, so that a signal's handler always gets its turn in the main thread.
                return self._events.get(timeout=1.0)
            except queue.Empty:
                self._reap_orphans()

    def _reap_orphans(self) -> None:
        """As a container's first process, the supervisor inherits what its children leave behind when
        they end (a data loader's workers): reaps them, and never the current child, whose code its
        waiter thread collects."""
        waitid = getattr(os, "waitid", None)
        if waitid is None:
            return
        current = self._child.pid if self._child is not None and self._state.running else None
        while True:
            try:
                found = waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if found is None or found.si_pid == current:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(found.si_pid, os.WNOHANG)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._events.put(Signalled(signum))  # SimpleQueue.put is safe in a signal handler

    def _act(self, action: Action) -> None:
        if isinstance(action, Stop):
            self._stop_child(ordered=True)
        elif isinstance(action, Start):
            if self._state.running:
                self._state = replace(self._state, pending=action)
                if not self._state.stopping:
                    self._stop_child(ordered=True)
            else:
                log.info("order: starting attempt %d", action.attempt)
                self._launch(action.attempt, child_env(self._environ, action.attempt, action.resume_from))

    def _handle(self, event: Event) -> None:
        if isinstance(event, JobSeen):
            self._job = event.job
        elif isinstance(event, ChildEnded):
            if event.serial == self._serial:
                self._ended(event.returncode)
        elif isinstance(event, GraceOver):
            if event.serial == self._serial and self._state.running:
                log.warning(
                    "attempt %d did not stop within %g s: killing it", self._state.attempt, self._grace()
                )
                self._signal_child(signal.SIGKILL)
        elif not self._state.terminating:
            name = signal.Signals(event.signum).name
            self._state = replace(self._state, terminating=True)
            if self._state.running:
                log.info("%s received: passing it to attempt %d", name, self._state.attempt)
                self._signal_child(event.signum)
            else:
                log.info("%s received: exiting", name)
        elif self._state.running:
            log.info("second signal received: killing attempt %d", self._state.attempt)
            self._signal_child(signal.SIGKILL)

    def _launch(self, attempt: int, env: Mapping[str, str]) -> None:
        self._serial += 1
        serial = self._serial
        try:
            # A session of its own: its process group takes our signals and nothing else's.
            child = subprocess.Popen(self._command, env=dict(env), start_new_session=True)
        except OSError as error:
            code = EXIT_NOT_FOUND if isinstance(error, FileNotFoundError) else EXIT_NOT_EXECUTABLE
            log.warning("cannot start %s: %s", self._command[0], error.strerror or error)
            self._state = Supervision(attempt=attempt, running=False, exit_code=code)
            self._reporter.put(run_report(attempt, code, datetime.now(UTC)))
            return
        self._child = child
        self._state = Supervision(attempt=attempt, running=True)
        self._reporter.put(run_report(attempt, None, datetime.now(UTC)))
        log.info("attempt %d started (pid %d)", attempt, child.pid)
        threading.Thread(
            target=lambda: self._events.put(ChildEnded(serial, child.wait())),
            name=f"trainingjob-child-{serial}",
            daemon=True,
        ).start()

    def _stop_child(self, *, ordered: bool) -> None:
        self._state = replace(self._state, stopping=True, ordered_stop=ordered)
        log.info("order: stopping attempt %d", self._state.attempt)
        self._signal_child(signal.SIGTERM)
        self._timer = threading.Timer(self._grace(), self._events.put, args=(GraceOver(self._serial),))
        self._timer.daemon = True
        self._timer.start()

    def _ended(self, returncode: int) -> None:
        code = exit_status(returncode)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # Whatever the child left in its process group goes with it, as when a container ends.
        self._signal_child(signal.SIGKILL)
        self._state = replace(self._state, running=False, stopping=False, exit_code=code)
        self._reporter.put(run_report(self._state.attempt, code, datetime.now(UTC)))
        log.info("attempt %d exited with code %d", self._state.attempt, code)
        self._reap_orphans()

    def _signal_child(self, signum: int) -> None:
        if self._child is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._child.pid, signum)

    def _grace(self) -> float:
        return self._config.grace_seconds

    def _exit(self, code: int) -> int:
        self._watch.stop()
        if not self._reporter.flush(FLUSH_TIMEOUT):
            log.warning("the last run report was not sent within %g s", FLUSH_TIMEOUT)
        log.info("exiting with code %d", code)
        return code


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("trainingjob-supervisor: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    if not args:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    env = os.environ if environ is None else environ
    try:
        config = Config.from_env(env)
    except ConfigError as error:
        log.error("%s", error)
        return EXIT_USAGE
    return Supervisor(config, args, env, OnceLogger()).run()


if __name__ == "__main__":
    sys.exit(main())
