"""A supervisor run as the pod runs it, for tests/trainer/test_supervise*.py: `python -m
trainingjob_progress.supervise -- <a small child program>` as a real process, with the environment the
operator injects pointed at a JobApi, its output read line by line as it comes.

The child (CHILD) prints one line naming its attempt, RESUME_FROM and pid, then does what CHILD_PLAN
says for its attempt: `exitN` exits with N, `run` waits until SIGTERM kills it, `save` prints
"saved" on SIGTERM and exits 143 (a trainer saving its checkpoint), `ignore` ignores SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from tests.cluster import REPO
from tests.trainer.supervisor_api import JOB, NAMESPACE, POD, JobApi

DEADLINE = 15.0

CHILD = """
import os, signal, sys
attempt = os.environ["TRAININGJOB_ATTEMPT"]
plan = dict(item.split("=") for item in os.environ["CHILD_PLAN"].split(","))
what = plan.get(attempt, plan.get("*", "run"))
def save(signum, frame):
    os.write(1, ("saved attempt=" + attempt + "\\n").encode())  # not print: it may interrupt one
    os._exit(143)
if what == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if what == "save":
    signal.signal(signal.SIGTERM, save)
print(f"child attempt={attempt} resume={os.environ.get('RESUME_FROM', '-')} pid={os.getpid()}", flush=True)
if what.startswith("exit"):
    sys.exit(int(what[4:]))
while True:
    signal.pause()
"""


def supervisor_env(api: JobApi, token: Path, **extra: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(REPO / "trainer"),
        "TRAININGJOB_PROGRESS_API_URL": api.url,
        "TRAININGJOB_PROGRESS_TOKEN_FILE": str(token),
        "TRAININGJOB_NAME": JOB,
        "TRAININGJOB_NAMESPACE": NAMESPACE,
        "POD_NAME": POD,
        "TRAININGJOB_ATTEMPT": "0",
        "TRAININGJOB_TERMINATION_GRACE_SECONDS": "30",
    }
    env.update(extra)
    return env


class Supervised:
    """The supervisor process and what it printed; stdout lines with the time they arrived."""

    def __init__(self, env: Mapping[str, str], command: list[str] | None = None) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainingjob_progress.supervise",
                "--",
                *(command or [sys.executable, "-c", CHILD]),
            ],
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: queue.SimpleQueue[tuple[float, str]] = queue.SimpleQueue()
        self.stderr: list[str] = []
        self.child_pids: list[int] = []
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self._line), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.stderr.append), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[bytes], sink: Callable[[str], None]) -> None:
        for raw in stream:
            sink(raw.decode().rstrip("\n"))

    def _line(self, text: str) -> None:
        if "pid=" in text:
            self.child_pids.append(child_pid(text))
        self.lines.put((time.monotonic(), text))

    def next_line(self, timeout: float = DEADLINE) -> tuple[float, str]:
        """The next line the child printed, and when it arrived."""
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output within {timeout} s; stderr: {self.stderr}") from None

    def wait_line(self, starts_with: str, timeout: float = DEADLINE) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while True:
            at, text = self.next_line(max(0.0, deadline - time.monotonic()))
            if text.startswith(starts_with):
                return at, text
            if time.monotonic() > deadline:
                raise AssertionError(f"no line starting with {starts_with!r}; stderr: {self.stderr}")

    def wait_exit(self, timeout: float = DEADLINE) -> int:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the supervisor did not exit; stderr: {self.stderr}") from None
        for reader in self._readers:
            reader.join(timeout)
        return code

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def kill(self) -> None:
        """Test cleanup: as a pod's deletion ends it (SIGTERM, which it passes to a child it may have
        started before printing anything; a second one kills the child), then SIGKILL for what is left."""
        for _ in range(2):
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(DEADLINE / 3)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(DEADLINE)
        for pid in self.child_pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def child_pid(line: str) -> int:
    return int(line.rsplit("pid=", 1)[1])


def process_gone(pid: int) -> bool:
    """No such process, or only its zombie (dead, not yet reaped by its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
