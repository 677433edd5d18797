"""The work queue between informer handlers and reconcile workers, with client-go's guarantees.

Handlers only say "this job needs attention"; workers do the work. The queue in between is what makes
that safe and cheap, exactly like client-go's `util/workqueue`:

- A key waiting in the queue is stored once, however many events mention it (dedup).
- A key is handed to one worker at a time. If it is added again while a worker holds it, it is queued
  again when that worker calls `done`, so a change that lands mid-reconcile is never lost.
- `add_after` defers a key (the earliest requested time wins); a background thread releases it.
- `add_rate_limited` defers a key by what a rate limiter says (per-key exponential backoff bounded by
  a global token bucket by default); `forget` resets the key's backoff after a success.
- `shut_down` wakes every blocked worker; `shut_down_with_drain` also waits for in-flight keys.
- Keys carry a priority (as in controller-runtime's priority queue): a worker takes the highest first,
  FIFO within one priority, and adding a waiting key with a higher priority moves it up. So news about
  work already under way (its pods started) need not wait behind the first reconciles of every newer
  key.

Time comes from an injected `Clock`. With a `FakeClock`, call `wake_delay_loop()` after advancing it so
the delay thread re-reads the clock (a real clock needs no such nudge).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field
from typing import Protocol

from controller.runtime.clock import Clock, RealClock
from controller.runtime.ratelimit import RateLimiter, default_controller_rate_limiter

# The priority of `add` unless told otherwise; higher is taken first.
NORMAL_PRIORITY = 0

# Insurance against a missed wake-up: the delay thread re-checks the clock at least this often.
MAX_DELAY_WAIT_SECONDS = 10.0


class QueueMetrics(Protocol):
    """Receives the workqueue_* measurements of one queue (bind the queue's name in the implementation).

    Hooks are called with the queue's lock held: keep them quick and never call back into the queue.
    """

    def on_add(self, depth: int) -> None:
        """A key became pending (workqueue_adds_total += 1); `depth` is the new workqueue_depth."""

    def on_get(self, depth: int, queue_seconds: float) -> None:
        """A worker took a key after it waited `queue_seconds` (workqueue_queue_duration_seconds)."""

    def on_done(self, work_seconds: float) -> None:
        """A worker finished a key it held for `work_seconds` (workqueue_work_duration_seconds)."""

    def on_retry(self) -> None:
        """A key was scheduled with `add_after` or `add_rate_limited` (workqueue_retries_total += 1)."""

    def on_unfinished_work(self, unfinished_seconds: float, longest_running_seconds: float) -> None:
        """Sets workqueue_unfinished_work_seconds and workqueue_longest_running_processor_seconds."""


class NoopQueueMetrics:
    """Discards every measurement."""

    def on_add(self, depth: int) -> None:
        pass

    def on_get(self, depth: int, queue_seconds: float) -> None:
        pass

    def on_done(self, work_seconds: float) -> None:
        pass

    def on_retry(self) -> None:
        pass

    def on_unfinished_work(self, unfinished_seconds: float, longest_running_seconds: float) -> None:
        pass


@dataclass(order=True)
class _DelayedKey:
    ready_at: float
    sequence: int
    key: str = field(compare=False)
    superseded: bool = field(default=False, compare=False)


class _PriorityFifo:
    """Waiting keys: highest priority first, first in first out within a priority. Raising a key's
    priority pushes a new entry; the old one is skipped when it surfaces (its sequence is stale)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, str]] = []  # (-priority, sequence, key)
        self._entry: dict[str, tuple[int, int]] = {}  # key -> its live (-priority, sequence)
        self._sequence = itertools.count()

    def __len__(self) -> int:
        return len(self._entry)

    def __bool__(self) -> bool:
        return bool(self._entry)

    def push(self, key: str, priority: int) -> None:
        """Queues `key`, or raises the priority of a queued `key` (it never lowers it)."""
        live = self._entry.get(key)
        if live is not None and -live[0] >= priority:
            return
        entry = (-priority, next(self._sequence))
        self._entry[key] = entry
        heapq.heappush(self._heap, (*entry, key))

    def pop(self) -> str:
        while True:
            negative_priority, sequence, key = heapq.heappop(self._heap)
            if self._entry.get(key) == (negative_priority, sequence):
                del self._entry[key]
                return key


class WorkQueue:
    """A deduplicating, delaying, rate-limited FIFO of string keys, safe for many producers and workers."""

    def __init__(
        self,
        name: str,
        clock: Clock | None = None,
        metrics: QueueMetrics | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        self.name = name
        self._clock = clock or RealClock()
        self._metrics: QueueMetrics = metrics or NoopQueueMetrics()
        self._rate_limiter = rate_limiter or default_controller_rate_limiter(clock=self._clock)

        # Invariant: every key in _queue is in _dirty and not in _processing; _queue holds it with the
        # priority _dirty records.
        self._cond = threading.Condition(threading.Lock())
        self._queue = _PriorityFifo()
        self._dirty: dict[str, int] = {}  # key -> the highest priority it was added with
        self._processing: set[str] = set()
        self._shutting_down = False
        self._drain = False
        self._added_at: dict[str, float] = {}
        self._processing_since: dict[str, float] = {}

        self._delay_cond = threading.Condition(threading.Lock())
        self._delay_heap: list[_DelayedKey] = []
        self._delayed: dict[str, _DelayedKey] = {}
        self._delay_sequence = itertools.count()
        self._delay_stopped = False
        self._delay_thread = threading.Thread(
            target=self._release_delayed_keys, name=f"workqueue-delay-{name}", daemon=True
        )
        self._delay_thread.start()

    # --- the queue itself ---------------------------------------------------------------------

    def add(self, key: str, priority: int = NORMAL_PRIORITY) -> None:
        """Marks `key` as needing processing; a no-op if the queue is shut down or `key` is already
        pending with at least this priority (a higher one moves it up)."""
        with self._cond:
            if self._shutting_down:
                return
            pending = self._dirty.get(key)
            if pending is not None:
                if priority > pending:
                    self._dirty[key] = priority
                    if key not in self._processing:
                        self._queue.push(key, priority)
                return
            self._dirty[key] = priority
            self._added_at.setdefault(key, self._clock.monotonic())
            self._metrics.on_add(len(self._dirty))
            if key in self._processing:
                return
            self._queue.push(key, priority)
            self._cond.notify()

    def get(self) -> tuple[str | None, bool]:
        """Blocks until a key is available and returns `(key, False)`; the caller must call `done(key)`.

        Returns `(None, True)` once the queue is shut down and empty: the worker should exit. Keys still
        queued at shutdown are handed out first.
        """
        with self._cond:
            while not self._queue and not self._shutting_down:
                self._cond.wait()
            if not self._queue:
                return None, True
            key = self._queue.pop()
            now = self._clock.monotonic()
            self._processing.add(key)
            del self._dirty[key]
            self._processing_since[key] = now
            queued_since = self._added_at.pop(key, now)
            self._metrics.on_get(len(self._dirty), now - queued_since)
            return key, False

    def done(self, key: str) -> None:
        """Releases `key`; if it was added again meanwhile it is queued again, behind its priority's keys."""
        with self._cond:
            started = self._processing_since.pop(key, None)
            if started is not None:
                self._metrics.on_done(self._clock.monotonic() - started)
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.push(key, self._dirty[key])
                self._cond.notify()
            elif not self._processing:
                # A drain may be waiting for the last in-flight key.
                self._cond.notify_all()

    def len(self) -> int:
        """Keys waiting for a worker (not those being processed or delayed). Informational only."""
        with self._cond:
            return len(self._queue)

    def __len__(self) -> int:
        return self.len()

    def shut_down(self) -> None:
        """Refuses new keys and wakes every blocked `get`; in-flight keys are not waited for."""
        with self._cond:
            self._drain = False
            self._shutting_down = True
            self._cond.notify_all()
        self._stop_delay_loop()

    def shut_down_with_drain(self) -> None:
        """Refuses new keys, then blocks until every key handed out has been `done`.

        Workers must keep calling `get`/`done` until told to stop, or this blocks forever; a later
        `shut_down` (from another thread) ends the wait at once.
        """
        with self._cond:
            self._drain = True
            self._shutting_down = True
            self._cond.notify_all()
        self._stop_delay_loop()
        with self._cond:
            while self._processing and self._drain:
                self._cond.wait()

    def shutting_down(self) -> bool:
        with self._cond:
            return self._shutting_down

    def update_unfinished_work(self) -> tuple[float, float]:
        """Reports (and returns) the seconds spent so far on in-flight keys: total and longest.

        client-go refreshes these every 500 ms; call this from a periodic task or a metrics collector.
        """
        with self._cond:
            if self._shutting_down:
                return 0.0, 0.0
            now = self._clock.monotonic()
            running = [now - started for started in self._processing_since.values()]
            unfinished = sum(running)
            longest = max(running, default=0.0)
            self._metrics.on_unfinished_work(unfinished, longest)
            return unfinished, longest

    # --- delayed adds -------------------------------------------------------------------------

    def add_after(self, key: str, seconds: float) -> None:
        """Adds `key` once `seconds` have passed; a zero or negative delay adds it now.

        A key already waiting keeps the earlier of its two ready times.
        """
        if self.shutting_down():
            return
        with self._cond:
            self._metrics.on_retry()
        if seconds <= 0:
            self.add(key)
            return
        with self._delay_cond:
            if self._delay_stopped:
                return
            ready_at = self._clock.monotonic() + seconds
            waiting = self._delayed.get(key)
            if waiting is not None:
                if waiting.ready_at <= ready_at:
                    return
                waiting.superseded = True
            entry = _DelayedKey(ready_at, next(self._delay_sequence), key)
            heapq.heappush(self._delay_heap, entry)
            self._delayed[key] = entry
            self._delay_cond.notify()

    def delay_remaining(self, key: str) -> float | None:
        """Seconds until a delayed `key` is released, or None if it is not waiting."""
        with self._delay_cond:
            entry = self._delayed.get(key)
            return None if entry is None else entry.ready_at - self._clock.monotonic()

    def wake_delay_loop(self) -> None:
        """Makes the delay thread re-read the clock now. Only needed after advancing a fake clock."""
        with self._delay_cond:
            self._delay_cond.notify()

    def _release_delayed_keys(self) -> None:
        while True:
            with self._delay_cond:
                if self._delay_stopped:
                    return
                now = self._clock.monotonic()
                due = self._pop_due_locked(now)
                if not due:
                    self._drop_superseded_head_locked()
                    timeout = MAX_DELAY_WAIT_SECONDS
                    if self._delay_heap:
                        timeout = min(timeout, self._delay_heap[0].ready_at - now)
                    self._delay_cond.wait(timeout)
                    continue
            for key in due:
                self.add(key)

    def _pop_due_locked(self, now: float) -> list[str]:
        due: list[str] = []
        while self._delay_heap and self._delay_heap[0].ready_at <= now:
            entry = heapq.heappop(self._delay_heap)
            if entry.superseded:
                continue
            del self._delayed[entry.key]
            due.append(entry.key)
        return due

    def _drop_superseded_head_locked(self) -> None:
        while self._delay_heap and self._delay_heap[0].superseded:
            heapq.heappop(self._delay_heap)

    def _stop_delay_loop(self) -> None:
        with self._delay_cond:
            self._delay_stopped = True
            self._delay_heap.clear()
            self._delayed.clear()
            self._delay_cond.notify_all()

    # --- rate-limited adds --------------------------------------------------------------------

    def add_rate_limited(self, key: str) -> None:
        """Adds `key` after the delay the rate limiter assigns (records one more failure for it)."""
        self.add_after(key, self._rate_limiter.when(key))

    def forget(self, key: str) -> None:
        """Resets the rate limiter's memory of `key`; call it when `key` was processed successfully."""
        self._rate_limiter.forget(key)

    def num_requeues(self, key: str) -> int:
        """How many times `key` has been rate-limited since it was last forgotten."""
        return self._rate_limiter.num_requeues(key)
