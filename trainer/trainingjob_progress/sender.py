"""The background sender of progress reports: a one-slot mailbox and the daemon thread that empties it.

Split out of the Reporter because this is the part that keeps training from ever waiting on the API:
report() drops a value into the slot (the newest value wins) and returns; one thread sends, one
request at a time, at most once per `min_interval` unless a flush or close makes it urgent. It knows
nothing of what a report says or how it travels: it is handed a `send` function.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .base import DEFAULT_TIMEOUT, OnceLogger


class Sender:
    """Sends the newest report put into its slot from a daemon thread started by the first put."""

    def __init__(
        self, send: Callable[[Mapping[str, Any]], bool], min_interval: float, once: OnceLogger
    ) -> None:
        self._send = send
        self._min_interval = max(0.0, float(min_interval))
        self._once = once
        self._cond = threading.Condition()
        self._slot: dict[str, Any] | None = None
        self._in_flight = False
        self._urgent = False
        self._closing = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._last_start: float | None = None
        self._sent = 0
        self._failed = 0

    @property
    def sent(self) -> int:
        with self._cond:
            return self._sent

    @property
    def failed(self) -> int:
        with self._cond:
            return self._failed

    def put(self, report: dict[str, Any]) -> None:
        """Replaces a report not yet sent; dropped (with a warning, once) after close()."""
        with self._cond:
            if self._closing:
                self._once.warning("closed", "progress report after close() dropped")
                return
            self._slot = report
            self._start_thread()
            self._cond.notify_all()

    def flush(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._urgent = True
            self._cond.notify_all()
            while self._slot is not None or self._in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if self._thread is None or not self._thread.is_alive():
                    return False
                self._cond.wait(remaining)
            return True

    def close(self, timeout: float = 2 * DEFAULT_TIMEOUT) -> None:
        """Sends the last pending report (waiting at most `timeout` seconds) and stops the thread."""
        with self._cond:
            if self._closed:
                return
            self._closing = True
            self._urgent = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                self._once.warning("close", "the last progress report was not sent within %.0fs", timeout)
        with self._cond:
            self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    def _start_thread(self) -> None:
        # Called with the lock held.
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="trainingjob-progress", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._slot is None and not self._closing:
                    self._urgent = False
                    self._cond.notify_all()
                    self._cond.wait()
                if self._slot is None:
                    self._cond.notify_all()
                    return
                while not self._urgent and self._last_start is not None:
                    delay = self._last_start + self._min_interval - time.monotonic()
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
                report, self._slot = self._slot, None
                self._in_flight = True
                self._last_start = time.monotonic()
            ok = self._send(report)
            with self._cond:
                self._in_flight = False
                if ok:
                    self._sent += 1
                else:
                    self._failed += 1
                self._cond.notify_all()
