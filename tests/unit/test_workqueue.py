"""Work queue guarantees, ported from client-go's queue, delaying-queue and rate-limiting-queue tests."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator

import pytest

from controller.runtime.clock import Clock, FakeClock, RealClock
from controller.runtime.ratelimit import ItemExponentialFailureRateLimiter, RateLimiter
from controller.runtime.workqueue import NoopQueueMetrics, QueueMetrics, WorkQueue

DEADLINE_SECONDS = 10.0


def wait_until(condition: Callable[[], bool], timeout: float = DEADLINE_SECONDS) -> None:
    """Polls `condition` until it holds; fails the test at the deadline."""
    clock = RealClock()
    deadline = clock.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if clock.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        pause.wait(0.001)


class Worker(threading.Thread):
    """A daemon thread that keeps the exception its body raised, so the test can re-raise it."""

    def __init__(self, body: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self._body = body
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._body()
        except BaseException as exc:  # re-raised in join_all
            self.error = exc


def run_in_thread(body: Callable[[], object]) -> Worker:
    worker = Worker(body)
    worker.start()
    return worker


def join_all(workers: list[Worker]) -> None:
    for worker in workers:
        worker.join(DEADLINE_SECONDS)
        assert not worker.is_alive(), "thread did not finish before the deadline"
        if worker.error is not None:
            raise worker.error


@pytest.fixture
def make_queue() -> Iterator[Callable[..., WorkQueue]]:
    created: list[WorkQueue] = []

    def factory(
        clock: Clock | None = None,
        metrics: QueueMetrics | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> WorkQueue:
        queue = WorkQueue("test", clock=clock, metrics=metrics, rate_limiter=rate_limiter)
        created.append(queue)
        return queue

    yield factory
    for queue in created:
        queue.shut_down()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


SHUTDOWNS = [
    pytest.param(WorkQueue.shut_down, id="shut_down"),
    pytest.param(WorkQueue.shut_down_with_drain, id="drain"),
]


# --- queue_test.go -------------------------------------------------------------------------------


@pytest.mark.parametrize("shut_down", SHUTDOWNS)
def test_basic(make_queue: Callable[..., WorkQueue], shut_down: Callable[[WorkQueue], None]) -> None:
    queue = make_queue()
    late_key = "added after shutdown!"
    got_late_key = threading.Event()

    def produce(index: int) -> None:
        for _ in range(50):
            queue.add(str(index))

    def consume() -> None:
        while True:
            key, shutting_down = queue.get()
            if key == late_key:
                got_late_key.set()
            if shutting_down:
                return
            assert key is not None
            queue.done(key)

    producers = [run_in_thread(functools.partial(produce, index)) for index in range(50)]
    consumers = [run_in_thread(consume) for _ in range(10)]
    join_all(producers)
    shut_down(queue)
    queue.add(late_key)
    join_all(consumers)
    assert queue.len() == 0
    assert not got_late_key.is_set()


@pytest.mark.parametrize("shut_down", SHUTDOWNS)
def test_add_while_processing(
    make_queue: Callable[..., WorkQueue], shut_down: Callable[[WorkQueue], None]
) -> None:
    queue = make_queue()
    processed: dict[str, int] = {}
    processed_lock = threading.Lock()

    def consume() -> None:
        seen_here: dict[str, int] = {}
        while True:
            key, shutting_down = queue.get()
            if shutting_down:
                return
            assert key is not None
            seen_here[key] = seen_here.get(key, 0) + 1
            with processed_lock:
                processed[key] = processed.get(key, 0) + 1
            if seen_here[key] < 2:
                queue.add(key)  # dirty while processing: must come back after done
            queue.done(key)

    producers = [run_in_thread(functools.partial(queue.add, str(index))) for index in range(50)]
    consumers = [run_in_thread(consume) for _ in range(10)]
    join_all(producers)
    wait_until(lambda: all(processed.get(str(index), 0) >= 2 for index in range(50)))
    shut_down(queue)
    join_all(consumers)
    assert queue.len() == 0


def test_len(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    queue.add("foo")
    assert queue.len() == 1
    queue.add("bar")
    assert queue.len() == 2
    queue.add("foo")  # already pending: no growth
    assert queue.len() == 2
    assert len(queue) == 2


def test_fifo_order(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    for key in ["c", "a", "b", "a"]:
        queue.add(key)
    assert [queue.get()[0] for _ in range(3)] == ["c", "a", "b"]


def test_reinsert(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    queue.add("foo")
    key, _ = queue.get()
    assert key == "foo"
    queue.add("foo")
    assert queue.len() == 0, "a key being processed must not be handed to a second worker"
    queue.done("foo")
    key, _ = queue.get()
    assert key == "foo"
    queue.done("foo")
    assert queue.len() == 0


def test_higher_priority_first_and_fifo_within_a_priority(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    queue.add("new-1")
    queue.add("running-1", priority=1)
    queue.add("new-2")
    queue.add("resync", priority=-1)
    queue.add("running-2", priority=1)
    assert [queue.get()[0] for _ in range(5)] == ["running-1", "running-2", "new-1", "new-2", "resync"]
    assert queue.len() == 0


def test_a_waiting_key_moves_up_but_never_down(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    for key in ["a", "b", "c"]:
        queue.add(key)
    queue.add("c", priority=1)  # news about c: ahead of a and b, still queued once
    queue.add("a", priority=-1)  # a lower priority does not demote a
    assert queue.len() == 3
    assert [queue.get()[0] for _ in range(3)] == ["c", "a", "b"]


def test_a_key_added_while_processing_is_requeued_with_its_highest_priority(
    make_queue: Callable[..., WorkQueue],
) -> None:
    queue = make_queue()
    queue.add("busy")
    assert queue.get() == ("busy", False)
    queue.add("waiting")
    queue.add("busy", priority=-1)
    queue.add("busy", priority=1)
    assert queue.len() == 1, "the key in flight is not queued before done"
    queue.done("busy")
    assert [queue.get()[0] for _ in range(2)] == ["busy", "waiting"]


def test_done_without_readd_does_not_requeue(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    queue.add("foo")
    queue.get()
    queue.done("foo")
    assert queue.len() == 0


def test_a_key_never_runs_on_two_workers_at_once(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    active: set[str] = set()
    overlaps: list[str] = []
    lock = threading.Lock()
    handled = [0]

    def work() -> None:
        while True:
            key, shutting_down = queue.get()
            if shutting_down:
                return
            assert key is not None
            with lock:
                if key in active:
                    overlaps.append(key)
                active.add(key)
            if handled[0] < 2000:
                queue.add(key)  # arrives while this worker holds the key
            with lock:
                active.discard(key)
                handled[0] += 1
            queue.done(key)

    for index in range(5):
        queue.add(f"key-{index}")
    workers = [run_in_thread(work) for _ in range(8)]
    wait_until(lambda: handled[0] >= 2000)
    queue.shut_down()
    join_all(workers)
    assert overlaps == []


def test_queue_drainage_using_shut_down_with_drain(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    queue.add("foo")
    queue.add("bar")
    first, _ = queue.get()
    second, _ = queue.get()
    assert first is not None
    assert second is not None
    drainer = run_in_thread(queue.shut_down_with_drain)
    wait_until(queue.shutting_down)
    assert queue.get() == (None, True)
    assert drainer.is_alive(), "the drain must wait for both in-flight keys"
    queue.done(first)
    assert drainer.is_alive(), "one key is still in flight"
    queue.done(second)
    join_all([drainer])


def test_no_queue_drainage_using_shut_down(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    queue.add("foo")
    queue.add("bar")
    queue.get()
    queue.get()
    join_all([run_in_thread(queue.shut_down)])


def test_force_queue_shutdown_using_shut_down(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    queue.add("foo")
    queue.add("bar")
    queue.get()
    queue.get()
    drainer = run_in_thread(queue.shut_down_with_drain)
    wait_until(queue.shutting_down)
    assert queue.get() == (None, True)
    queue.shut_down()  # a second signal gives up on the drain
    join_all([drainer])


def test_queue_drainage_with_dirty_item(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    queue.add("foo")
    gotten, _ = queue.get()
    assert gotten == "foo"
    queue.add("foo")
    drainer = run_in_thread(queue.shut_down_with_drain)
    wait_until(queue.shutting_down)
    assert queue.get() == (None, True)
    queue.done("foo")
    # done put the dirty key back, so the queue hands it out even though it is shutting down.
    assert queue.get() == ("foo", False)
    queue.done("foo")
    assert queue.get() == (None, True)
    join_all([drainer])


def test_keys_queued_at_shutdown_are_still_handed_out(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    queue.add("a")
    queue.add("b")
    queue.shut_down()
    queue.add("c")
    assert queue.get() == ("a", False)
    assert queue.get() == ("b", False)
    assert queue.get() == (None, True)


def test_shut_down_wakes_blocked_workers(make_queue: Callable[..., WorkQueue]) -> None:
    queue = make_queue()
    results: list[tuple[str | None, bool]] = []
    workers = [run_in_thread(lambda: results.append(queue.get())) for _ in range(3)]
    queue.shut_down()
    join_all(workers)
    assert results == [(None, True)] * 3


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
