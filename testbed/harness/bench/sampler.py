"""What the bench records over a bring-up besides its end points: the operator's work queue depth over
time, and other test or benchmark processes that ran meanwhile.

Why a thread of its own: the depth of the work queue says whether the operator kept up with its news
or let it pile up (and for how long), which a figure at the end cannot say; sampling it at a fixed
interval from /metrics (`workqueue_depth`, which this operator and Kubeflow's controller-runtime both
export) gives a curve that compares across operators and job counts. Any other pytest or bench seen
during the run marks the run as disturbed (testbed/harness/bench/quiet.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from testbed.common import JsonDict, ToolError
from testbed.harness.bench.quiet import busy_processes

DEPTH_INTERVAL = 1.0
BUSY_INTERVAL = 5.0


class Sampler:
    """Samples `depth()` every `interval` seconds and looks for busy processes every `busy_interval`
    seconds, from `start` to `stop`, on a daemon thread."""

    def __init__(
        self,
        depth: Callable[[], float],
        *,
        interval: float = DEPTH_INTERVAL,
        busy_interval: float = BUSY_INTERVAL,
        busy: Callable[[], list[str]] = busy_processes,
    ) -> None:
        self._depth = depth
        self._interval = interval
        self._busy_interval = busy_interval
        self._busy = busy
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.samples: list[tuple[float, float]] = []
        self.disturbed_by: set[str] = set()
        self.started = 0.0

    def start(self, started: float) -> None:
        """Starts sampling; times are seconds since `started` (time.monotonic())."""
        self.started = started
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_busy = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                depth = self._depth()
            except (ToolError, OSError):
                depth = None  # a scrape that failed leaves a gap, not a zero
            if depth is not None:
                with self._lock:
                    self.samples.append((round(now - self.started, 1), depth))
            if now >= next_busy:
                found = self._busy()
                with self._lock:
                    self.disturbed_by.update(line.split(":", 1)[1].strip() for line in found)
                next_busy = now + self._busy_interval
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - now)))

    def latest(self) -> float | None:
        with self._lock:
            return self.samples[-1][1] if self.samples else None

    def stop(self) -> JsonDict:
        """Stops sampling; the depth curve (`[seconds, depth]` pairs) with its maximum and mean, and the
        busy processes seen."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            samples = list(self.samples)
            disturbed = sorted(self.disturbed_by)
        depths = [depth for _, depth in samples]
        return {
            "work_queue_depth": {
                "interval_seconds": self._interval,
                "max": max(depths) if depths else None,
                "mean": round(sum(depths) / len(depths), 1) if depths else None,
                "samples": [[at, depth] for at, depth in samples],
            },
            "disturbed_by": disturbed,
        }
