"""Work queue guarantees, ported from client-go's queue, delaying-queue and rate-limiting-queue tests."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import pytest

from controller.runtime.workqueue import WorkQueue
from tests.unit import workqueue_support
from tests.unit.workqueue_support import DEADLINE_SECONDS, wait_until

# The shared fixtures, bound here so that pytest finds them for this module's tests.
make_queue = workqueue_support.make_queue
clock = workqueue_support.clock


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
