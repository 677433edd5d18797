"""Injectable time, so every decision that depends on time can be tested without sleeping.

Durations (lease expiry, backoff, queue delays) use the monotonic clock; timestamps written to the API
use the UTC wall clock. `FakeClock` advances only when told to (or when something sleeps on it).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def now(self) -> datetime: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """A clock that moves only through `advance` (or `sleep`, which advances instead of blocking)."""

    def __init__(self, start: datetime | None = None) -> None:
        self._lock = threading.Lock()
        self._mono = 1000.0
        self._wall = start or datetime(2026, 1, 1, tzinfo=UTC)

    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def now(self) -> datetime:
        with self._lock:
            return self._wall

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._mono += seconds
            self._wall += timedelta(seconds=seconds)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.advance(seconds)


def rfc3339(moment: datetime) -> str:
    """Kubernetes Time: second precision, UTC, trailing Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(moment: datetime) -> str:
    """Kubernetes MicroTime: exactly six fractional digits, UTC, trailing Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """Parses Time or MicroTime as written by the API server."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
