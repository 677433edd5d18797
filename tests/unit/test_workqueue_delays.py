"""Work queue guarantees with time in them, ported from client-go's delaying-queue and
rate-limiting-queue tests, and the queue's metrics.

Split out of tests/unit/test_workqueue.py (client-go's queue tests); the fixtures come from
tests/unit/workqueue_support.py.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from controller.runtime.clock import FakeClock, RealClock
from controller.runtime.ratelimit import ItemExponentialFailureRateLimiter
from controller.runtime.workqueue import NoopQueueMetrics, WorkQueue
from tests.unit import workqueue_support
from tests.unit.workqueue_support import wait_until

# The shared fixtures, bound here so that pytest finds them for this module's tests.
make_queue = workqueue_support.make_queue
clock = workqueue_support.clock


# --- delaying_queue_test.go ----------------------------------------------------------------------


def test_simple_delayed_add(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    queue = make_queue(clock=clock)
    queue.add_after("foo", 0.050)
    assert queue.len() == 0
    assert queue.delay_remaining("foo") == pytest.approx(0.050)

    clock.advance(0.060)
    queue.wake_delay_loop()
    wait_until(lambda: queue.len() == 1)
    key, _ = queue.get()
    assert key == "foo"
    queue.done("foo")

    clock.advance(10.0)  # past the delay thread's insurance wake-up
    queue.wake_delay_loop()
    assert queue.delay_remaining("foo") is None
    assert queue.len() == 0


def test_delayed_keys_wait_for_the_clock(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    queue = make_queue(clock=clock)
    queue.add_after("foo", 0.050)
    clock.advance(0.049)
    queue.wake_delay_loop()
    assert queue.delay_remaining("foo") == pytest.approx(0.001)
    assert queue.len() == 0
    clock.advance(0.001)
    queue.wake_delay_loop()
    wait_until(lambda: queue.len() == 1)


def test_deduping_keeps_the_earliest_ready_time(
    make_queue: Callable[..., WorkQueue], clock: FakeClock
) -> None:
    queue = make_queue(clock=clock)
    queue.add_after("foo", 0.050)
    queue.add_after("foo", 0.070)
    assert queue.len() == 0
    assert queue.delay_remaining("foo") == pytest.approx(0.050)

    clock.advance(0.060)
    queue.wake_delay_loop()
    wait_until(lambda: queue.len() == 1)
    queue.get()
    queue.done("foo")

    clock.advance(0.020)  # past the later request: it was merged away, nothing comes back
    queue.wake_delay_loop()
    assert queue.delay_remaining("foo") is None
    assert queue.len() == 0

    # The other way round: the earlier request overrides the pending later one.
    queue.add_after("foo", 0.050)
    queue.add_after("foo", 0.030)
    assert queue.delay_remaining("foo") == pytest.approx(0.030)
    clock.advance(0.040)
    queue.wake_delay_loop()
    wait_until(lambda: queue.len() == 1)
    queue.get()
    queue.done("foo")

    clock.advance(0.020)
    queue.wake_delay_loop()
    assert queue.delay_remaining("foo") is None
    assert queue.len() == 0


def test_add_two_fire_early(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    queue = make_queue(clock=clock)
    queue.add_after("foo", 1.0)
    queue.add_after("bar", 0.050)
    assert queue.len() == 0

    clock.advance(0.060)
    queue.wake_delay_loop()
    wait_until(lambda: queue.len() == 1)
    assert queue.get() == ("bar", False)

    queue.add_after("baz", 2.0)
    clock.advance(1.0)
    queue.wake_delay_loop()
    wait_until(lambda: queue.len() == 1)
    assert queue.get() == ("foo", False)

    clock.advance(2.0)
    queue.wake_delay_loop()
    wait_until(lambda: queue.len() == 1)
    assert queue.get() == ("baz", False)


def test_copy_shifting(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    queue = make_queue(clock=clock)
    queue.add_after("foo", 1.0)
    queue.add_after("bar", 0.500)
    queue.add_after("baz", 0.250)
    assert queue.len() == 0

    clock.advance(2.0)
    queue.wake_delay_loop()
    wait_until(lambda: queue.len() == 3)
    assert [queue.get()[0] for _ in range(3)] == ["baz", "bar", "foo"]


@pytest.mark.parametrize("delay", [0.0, -1.0])
def test_zero_or_negative_delay_adds_at_once(
    make_queue: Callable[..., WorkQueue], clock: FakeClock, delay: float
) -> None:
    queue = make_queue(clock=clock)
    queue.add_after("foo", delay)
    assert queue.len() == 1
    assert queue.delay_remaining("foo") is None


def test_delayed_add_of_a_key_in_flight_requeues_it_after_done(
    make_queue: Callable[..., WorkQueue], clock: FakeClock
) -> None:
    queue = make_queue(clock=clock)
    queue.add("foo")
    assert queue.get() == ("foo", False)
    queue.add_after("foo", 0.005)
    clock.advance(0.005)
    queue.wake_delay_loop()
    wait_until(lambda: queue.delay_remaining("foo") is None)
    queue.done("foo")
    wait_until(lambda: queue.len() == 1)
    assert queue.get() == ("foo", False)


def test_delayed_add_is_ignored_after_shutdown(
    make_queue: Callable[..., WorkQueue], clock: FakeClock
) -> None:
    queue = make_queue(clock=clock)
    queue.add_after("pending", 1.0)
    queue.shut_down()
    queue.add_after("foo", 1.0)
    queue.add_after("bar", 0.0)
    assert queue.delay_remaining("foo") is None
    assert queue.delay_remaining("pending") is None, "shutdown drops keys still waiting"
    assert queue.get() == (None, True)


def test_delay_thread_uses_real_time_without_nudging(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue(clock=RealClock())
    queue.add_after("later", 0.020)
    queue.add_after("sooner", 0.010)
    wait_until(lambda: queue.len() == 2)
    assert queue.get() == ("sooner", False)
    assert queue.get() == ("later", False)


# --- rate_limiting_queue_test.go -----------------------------------------------------------------


def test_rate_limiting_queue(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    limiter = ItemExponentialFailureRateLimiter(base=0.001, cap=1.0)
    queue = make_queue(clock=clock, rate_limiter=limiter)

    queue.add_rate_limited("one")
    assert queue.delay_remaining("one") == pytest.approx(0.001)
    queue.add_rate_limited("one")  # asks for 2 ms; the pending 1 ms wins
    assert queue.delay_remaining("one") == pytest.approx(0.001)
    assert queue.num_requeues("one") == 2

    queue.add_rate_limited("two")
    assert queue.delay_remaining("two") == pytest.approx(0.001)
    queue.add_rate_limited("two")
    assert queue.num_requeues("two") == 2

    queue.forget("one")
    assert queue.num_requeues("one") == 0
    assert queue.num_requeues("two") == 2

    clock.advance(0.001)
    queue.wake_delay_loop()
    wait_until(lambda: queue.len() == 2)
    assert queue.get() == ("one", False)
    queue.add_rate_limited("one")
    assert queue.delay_remaining("one") == pytest.approx(0.001), "forgotten: backoff restarts at base"
    queue.add_rate_limited("two")
    assert queue.delay_remaining("two") == pytest.approx(0.004)


def test_default_rate_limiter_backs_off_exponentially(
    make_queue: Callable[..., WorkQueue], clock: FakeClock
) -> None:
    queue = make_queue(clock=clock)
    expected = [0.005, 0.010, 0.020, 0.040]
    for delay in expected:
        queue.add_rate_limited("job")
        assert queue.delay_remaining("job") == pytest.approx(delay)
        clock.advance(delay)
        queue.wake_delay_loop()
        wait_until(lambda: queue.len() == 1)
        assert queue.get() == ("job", False)
        queue.done("job")
    assert queue.num_requeues("job") == len(expected)
    queue.forget("job")
    assert queue.num_requeues("job") == 0


# --- metrics -------------------------------------------------------------------------------------


class RecordingMetrics(NoopQueueMetrics):
    def __init__(self) -> None:
        self.adds: list[int] = []
        self.gets: list[tuple[int, float]] = []
        self.dones: list[float] = []
        self.retries = 0
        self.unfinished: list[tuple[float, float]] = []

    def on_add(self, depth: int) -> None:
        self.adds.append(depth)

    def on_get(self, depth: int, queue_seconds: float) -> None:
        self.gets.append((depth, queue_seconds))

    def on_done(self, work_seconds: float) -> None:
        self.dones.append(work_seconds)

    def on_retry(self) -> None:
        self.retries += 1

    def on_unfinished_work(self, unfinished_seconds: float, longest_running_seconds: float) -> None:
        self.unfinished.append((unfinished_seconds, longest_running_seconds))


def test_metrics_follow_a_key_through_the_queue(
    make_queue: Callable[..., WorkQueue], clock: FakeClock
) -> None:
    metrics = RecordingMetrics()
    queue = make_queue(clock=clock, metrics=metrics)

    queue.add("foo")
    queue.add("foo")  # deduplicated: not an add
    assert metrics.adds == [1]

    clock.advance(0.5)
    queue.get()
    assert metrics.gets == [(0, 0.5)]

    queue.add("foo")  # dirty again while processing: counts, depth 1
    assert metrics.adds == [1, 1]

    clock.advance(2.0)
    queue.done("foo")
    assert metrics.dones == pytest.approx([2.0])

    clock.advance(1.0)
    queue.get()
    # Waited from its add during processing (2 s before done) plus the 1 s after.
    assert metrics.gets[-1] == pytest.approx((0, 3.0))
    queue.done("foo")


def test_metrics_count_retries(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    metrics = RecordingMetrics()
    queue = make_queue(clock=clock, metrics=metrics)
    queue.add_after("a", 1.0)
    queue.add_after("b", 0.0)
    queue.add_rate_limited("c")
    assert metrics.retries == 3
    queue.shut_down()
    queue.add_after("d", 1.0)
    assert metrics.retries == 3


def test_unfinished_work(make_queue: Callable[..., WorkQueue], clock: FakeClock) -> None:
    metrics = RecordingMetrics()
    queue = make_queue(clock=clock, metrics=metrics)
    assert queue.update_unfinished_work() == (0.0, 0.0)

    queue.add("slow")
    queue.add("fast")
    queue.get()
    clock.advance(3.0)
    queue.get()
    clock.advance(1.0)
    assert queue.update_unfinished_work() == pytest.approx((5.0, 4.0))
    queue.done("fast")
    assert queue.update_unfinished_work() == pytest.approx((4.0, 4.0))
    assert metrics.unfinished[-1] == pytest.approx((4.0, 4.0))
    assert len(metrics.unfinished) == 3
