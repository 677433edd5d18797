"""Rate limiters: x/time/rate reservation semantics and client-go's default_rate_limiters cases."""

from __future__ import annotations

import math
from collections.abc import Hashable

import pytest

from controller.runtime.clock import FakeClock
from controller.runtime.ratelimit import (
    ItemBucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    TokenBucket,
    default_controller_rate_limiter,
)


class FastSlowRateLimiter:
    """Test double: `fast` for the first `threshold` failures of an item, `slow` afterwards."""

    def __init__(self, fast: float, slow: float, threshold: int) -> None:
        self._fast = fast
        self._slow = slow
        self._threshold = threshold
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        self._failures[item] = self._failures.get(item, 0) + 1
        return self._fast if self._failures[item] <= self._threshold else self._slow

    def forget(self, item: Hashable) -> None:
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        return self._failures.get(item, 0)


# --- TokenBucket ---------------------------------------------------------------------------------


def test_bucket_starts_full_then_borrows_from_the_future() -> None:
    bucket = TokenBucket(qps=10, burst=3, clock=FakeClock())
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)
    assert bucket.reserve() == pytest.approx(0.3)


def test_bucket_refills_continuously() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=4, burst=1, clock=clock)
    assert bucket.reserve() == 0.0
    clock.advance(0.125)  # half a token earned
    assert bucket.reserve() == pytest.approx(0.125)
    # That reservation left the bucket at -0.5; after 0.375 s it holds 1.0 again, minus the next one.
    clock.advance(0.375)
    assert bucket.reserve() == 0.0
    assert bucket.reserve() == pytest.approx(0.25)


def test_bucket_refill_is_capped_at_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=100, burst=2, clock=clock)
    clock.advance(3600)
    assert [bucket.reserve() for _ in range(2)] == [0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.01)


def test_bucket_repays_debt_before_refilling() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=1, burst=1, clock=clock)
    bucket.reserve()
    assert bucket.reserve() == pytest.approx(1.0)
    assert bucket.reserve() == pytest.approx(2.0)
    clock.advance(2.0)  # repays the two borrowed tokens, the bucket is empty (not full)
    assert bucket.reserve() == pytest.approx(1.0)


def test_bucket_ignores_a_clock_that_goes_backwards() -> None:
    class BackwardsClock(FakeClock):
        def __init__(self) -> None:
            super().__init__()
            self.readings = [100.0, 50.0, 50.0]

        def monotonic(self) -> float:
            return self.readings.pop(0)

    bucket = TokenBucket(qps=1, burst=1, clock=BackwardsClock())
    assert bucket.reserve() == 0.0
    assert bucket.reserve() == pytest.approx(1.0)


def test_bucket_wait_sleeps_for_the_reserved_delay() -> None:
    clock = FakeClock()
    bucket = TokenBucket(qps=2, burst=1, clock=clock)
    start = clock.monotonic()
    bucket.wait()
    assert clock.monotonic() == start
    bucket.wait()
    assert clock.monotonic() == pytest.approx(start + 0.5)
    bucket.wait()
    assert clock.monotonic() == pytest.approx(start + 1.0)


def test_bucket_without_limit_never_waits() -> None:
    bucket = TokenBucket(qps=math.inf, burst=0, clock=FakeClock())
    assert all(bucket.reserve() == 0.0 for _ in range(1000))


@pytest.mark.parametrize(("qps", "burst"), [(0, 1), (-1, 1), (10, 0)])
def test_bucket_rejects_settings_that_could_never_grant(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        TokenBucket(qps=qps, burst=burst, clock=FakeClock())


# --- client-go default_rate_limiters_test.go -----------------------------------------------------


def test_exponential_failure_rate_limiter() -> None:
    limiter = ItemExponentialFailureRateLimiter(base=0.001, cap=1.0)
    assert [limiter.when("one") for _ in range(5)] == pytest.approx([0.001, 0.002, 0.004, 0.008, 0.016])
    assert limiter.num_requeues("one") == 5

    assert [limiter.when("two") for _ in range(2)] == pytest.approx([0.001, 0.002])
    assert limiter.num_requeues("two") == 2

    limiter.forget("one")
    assert limiter.num_requeues("one") == 0
    assert limiter.when("one") == pytest.approx(0.001)
    assert limiter.num_requeues("two") == 2


def test_exponential_failure_rate_limiter_caps_and_survives_overflow() -> None:
    limiter = ItemExponentialFailureRateLimiter(base=0.001, cap=1000.0)
    for _ in range(5):
        limiter.when("one")
    assert limiter.when("one") == pytest.approx(0.032)
    for _ in range(1000):
        limiter.when("overflow1")
    assert limiter.when("overflow1") == 1000.0

    limiter = ItemExponentialFailureRateLimiter(base=60.0, cap=1000 * 3600.0)
    for _ in range(2):
        limiter.when("two")
    assert limiter.when("two") == 240.0
    for _ in range(5000):  # 60 * 2**5000 does not fit a float
        limiter.when("overflow2")
    assert limiter.when("overflow2") == 1000 * 3600.0


def test_exponential_failure_rate_limiter_defaults() -> None:
    limiter = ItemExponentialFailureRateLimiter()
    assert limiter.when("key") == pytest.approx(0.005)
    assert limiter.when("key") == pytest.approx(0.010)
    for _ in range(30):
        limiter.when("key")
    assert limiter.when("key") == 1000.0


def test_max_of_rate_limiter() -> None:
    limiter = MaxOfRateLimiter(
        FastSlowRateLimiter(fast=0.005, slow=3.0, threshold=3),
        ItemExponentialFailureRateLimiter(base=0.001, cap=1.0),
    )
    assert [limiter.when("one") for _ in range(5)] == pytest.approx([0.005, 0.005, 0.005, 3.0, 3.0])
    assert limiter.num_requeues("one") == 5

    assert [limiter.when("two") for _ in range(2)] == pytest.approx([0.005, 0.005])
    assert limiter.num_requeues("two") == 2

    limiter.forget("one")
    assert limiter.num_requeues("one") == 0
    assert limiter.when("one") == pytest.approx(0.005)


def test_max_of_reports_the_highest_requeue_count() -> None:
    clock = FakeClock()
    limiter = MaxOfRateLimiter(
        ItemBucketRateLimiter(qps=1, burst=1, clock=clock), ItemExponentialFailureRateLimiter()
    )
    limiter.when("a")
    limiter.when("a")
    assert limiter.num_requeues("a") == 2


def test_max_of_needs_a_limiter() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MaxOfRateLimiter()


def test_item_bucket_rate_limiter_is_shared_across_items() -> None:
    limiter = ItemBucketRateLimiter(qps=1, burst=2, clock=FakeClock())
    assert limiter.when("a") == 0.0
    assert limiter.when("b") == 0.0
    assert limiter.when("c") == pytest.approx(1.0)
    assert limiter.when("a") == pytest.approx(2.0)
    assert limiter.num_requeues("a") == 0
    limiter.forget("a")
    assert limiter.when("d") == pytest.approx(3.0)


def test_default_controller_rate_limiter_is_the_slower_of_backoff_and_bucket() -> None:
    clock = FakeClock()
    limiter = default_controller_rate_limiter(clock=clock)
    # The bucket's burst of 100 absorbs the first failures; the per-item backoff decides.
    delays = [limiter.when(f"key-{index}") for index in range(100)]
    assert delays == pytest.approx([0.005] * 100)
    # The bucket is now empty: at 10 qps the next retry of any key waits 0.1 s.
    assert limiter.when("key-100") == pytest.approx(0.1)
    # A key that failed many times is bounded by its own backoff.
    for _ in range(10):
        limiter.when("hot")
    clock.advance(1000)
    assert limiter.when("hot") == pytest.approx(0.005 * 2**10)
    assert limiter.num_requeues("hot") == 11
    limiter.forget("hot")
    assert limiter.num_requeues("hot") == 0


def test_default_controller_rate_limiter_is_configurable() -> None:
    limiter = default_controller_rate_limiter(base=1.0, cap=4.0, qps=1, burst=1, clock=FakeClock())
    assert limiter.when("k") == 1.0
    assert limiter.when("k") == 2.0  # bucket says 1.0, backoff says 2.0
    assert limiter.when("k") == 4.0
    assert limiter.when("k") == 4.0  # capped backoff, bucket now 3.0 behind
    assert limiter.when("k") == pytest.approx(4.0)
    assert limiter.when("k") == pytest.approx(5.0)  # the bucket debt exceeds the cap
