"""Rate limiters with client-go semantics, for work-queue retries and for client-side request pacing.

A controller that retries a failing key immediately hammers the API server and starves healthy keys;
one that issues requests as fast as it can trips API priority and fairness. client-go solves both with
two small pieces that this module reproduces so the operator behaves like any Go controller:

- `TokenBucket`: golang.org/x/time/rate's `Limiter.Reserve` -- tokens refill continuously at `qps` up
  to `burst`; a reservation always succeeds, possibly driving the bucket negative, and reports how long
  the caller must wait before acting.
- The work-queue limiters of client-go's `default_rate_limiters.go`: a per-item exponential backoff,
  a global token bucket, and the maximum of several limiters (the default controller limiter).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from typing import Protocol

from controller.runtime.clock import Clock, RealClock


class RateLimiter(Protocol):
    """What a rate-limited work queue asks of its limiter."""

    def when(self, item: Hashable) -> float:
        """Seconds to wait before `item` may be processed again; records one more failure."""
        ...

    def forget(self, item: Hashable) -> None:
        """Stops tracking `item` (it succeeded); the next `when` starts from scratch."""
        ...

    def num_requeues(self, item: Hashable) -> int:
        """How many failures are recorded for `item`."""
        ...


class TokenBucket:
    """A token bucket that hands out future tokens instead of refusing.

    The bucket starts full. Each `reserve()` takes one token; when none is left the token is borrowed
    from the future and the returned delay says when it will have been earned. `qps` may be
    `math.inf` for "no limit" (every reservation is immediate).
    """

    def __init__(self, qps: float, burst: int, clock: Clock | None = None) -> None:
        if not qps > 0:
            raise ValueError(f"qps must be positive, got {qps}")
        if burst < 1 and not math.isinf(qps):
            raise ValueError(f"burst must be at least 1, got {burst}")
        self._qps = qps
        self._burst = burst
        self._clock = clock or RealClock()
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._last = self._clock.monotonic()

    @property
    def qps(self) -> float:
        return self._qps

    @property
    def burst(self) -> int:
        return self._burst

    def reserve(self) -> float:
        """Takes one token now and returns the seconds to wait before using it (0 if one was available)."""
        if math.isinf(self._qps):
            return 0.0
        with self._lock:
            now = self._clock.monotonic()
            # A clock reading older than the last one (which a monotonic clock never gives, but a
            # shared fake might between threads) refills nothing rather than draining the bucket.
            elapsed = max(0.0, now - self._last)
            self._tokens = min(float(self._burst), self._tokens + elapsed * self._qps)
            self._last = max(now, self._last)
            self._tokens -= 1.0
            if self._tokens >= 0:
                return 0.0
            return -self._tokens / self._qps

    def wait(self) -> None:
        """Blocks (through the clock) until a reserved token may be used."""
        self._clock.sleep(self.reserve())


class ItemExponentialFailureRateLimiter:
    """Per-item backoff: `base * 2**failures`, capped at `cap`, where failures counts earlier `when` calls."""

    def __init__(self, base: float = 0.005, cap: float = 1000.0) -> None:
        self._base = base
        self._cap = cap
        self._lock = threading.Lock()
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        with self._lock:
            failures = self._failures.get(item, 0)
            self._failures[item] = failures + 1
        try:
            backoff = math.ldexp(self._base, failures)
        except OverflowError:
            return self._cap
        return min(backoff, self._cap)

    def forget(self, item: Hashable) -> None:
        with self._lock:
            self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        with self._lock:
            return self._failures.get(item, 0)


class ItemBucketRateLimiter:
    """One token bucket shared by all items: bounds the overall retry rate, not any single item's."""

    def __init__(self, qps: float = 10.0, burst: int = 100, clock: Clock | None = None) -> None:
        self._bucket = TokenBucket(qps, burst, clock)

    def when(self, item: Hashable) -> float:
        return self._bucket.reserve()

    def forget(self, item: Hashable) -> None:
        """Nothing to forget: the bucket does not track items."""

    def num_requeues(self, item: Hashable) -> int:
        return 0


class MaxOfRateLimiter:
    """Asks every limiter and obeys the strictest: the longest delay and the highest requeue count."""

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        self._limiters = limiters

    def when(self, item: Hashable) -> float:
        # Every limiter must see the failure (each keeps its own count), so no short-circuit.
        return max([limiter.when(item) for limiter in self._limiters])

    def forget(self, item: Hashable) -> None:
        for limiter in self._limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        return max(limiter.num_requeues(item) for limiter in self._limiters)


def default_controller_rate_limiter(
    base: float = 0.005,
    cap: float = 1000.0,
    qps: float = 10.0,
    burst: int = 100,
    clock: Clock | None = None,
) -> MaxOfRateLimiter:
    """client-go's default: per-item exponential backoff, bounded overall by a 10 qps / 100 burst bucket."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(base, cap),
        ItemBucketRateLimiter(qps, burst, clock),
    )
