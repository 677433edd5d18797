"""What the fuzz run watches of the operator process itself: that it is alive and healthy, the log
lines it wrote since a mark, and how many writes it made.

Why apart from tests/fuzz/harness.py: the harness decides what a batch or a manifest did wrong; this
module only reads the operator (its process, /readyz and /healthz, its JSON log file, its
rest_client_requests_total), the same way for a batch and for a manifest alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tests.e2e.jobs import write_requests
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]
# How long the operator may take to finish the writes of what came before.
QUIET_DEADLINE = 60.0


def wait_until(probe: Callable[[], bool], timeout: float) -> bool:
    """Asks `probe` every second until it says True (True) or `timeout` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if probe():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)


class LogCursor:
    """Reads the operator's JSON log lines written since the last read."""

    def __init__(self, operator: OperatorProcess) -> None:
        self._path = operator.log_path
        self._offset = 0

    def skip(self) -> None:
        self._offset = self._path.stat().st_size if self._path.exists() else 0

    def read(self) -> list[JsonDict]:
        with self._path.open("rb") as handle:
            handle.seek(self._offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        entries = []
        for line in data[:end].splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                entries.append({"level": "RAW", "message": line.decode(errors="replace")[:500]})
                continue
            if isinstance(entry, dict):
                entries.append(entry)
        return entries


class OperatorWatch:
    """The operator process as the fuzz run sees it: health, new log lines, writes."""

    def __init__(self, operator: OperatorProcess) -> None:
        self.operator = operator
        self._logs = LogCursor(operator)

    def health_problems(self, when: str) -> list[str]:
        """What /readyz and /healthz say is wrong; an operator that exited fails the run at once."""
        if not self.operator.alive():
            raise AssertionError(f"the operator exited {when}:\n{self.operator.tail()}")
        problems = []
        for path in ("/readyz", "/healthz"):
            code, body = self.operator.get(path)
            if code != 200:
                problems.append(f"{path} answered {code} {when}: {body[:200]}")
        return problems

    def skip_logs(self) -> None:
        """Marks the log's end: the next read_logs returns what comes after."""
        self._logs.skip()

    def read_logs(self) -> list[JsonDict]:
        return self._logs.read()

    def quiet_writes(self) -> float:
        """The write count once it has stopped moving: Events of jobs already deleted (refused, as
        their namespace is going) are still being sent for a while and must not count against what
        comes next."""
        last: list[float | None] = [None]

        def quiet() -> bool:
            current = self.job_writes()
            settled = current == last[0]
            last[0] = current
            return settled

        wait_until(quiet, QUIET_DEADLINE)
        return last[0] or 0.0

    def job_writes(self) -> float:
        """The operator's writes for jobs: POST, PATCH and DELETE (write_requests leaves out its
        Lease renewals)."""
        return sum(write_requests(self.operator).values())
