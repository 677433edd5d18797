"""What the work queue tests share (tests/unit/test_workqueue.py, tests/unit/test_workqueue_delays.py):
waiting with a deadline, and the fixtures of a queue factory (every queue shut down after the test)
and a fake clock, which each test module binds to its own names so pytest finds them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from controller.runtime.clock import Clock, FakeClock, RealClock
from controller.runtime.ratelimit import RateLimiter
from controller.runtime.workqueue import QueueMetrics, WorkQueue

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
