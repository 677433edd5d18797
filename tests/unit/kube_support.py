"""What the KubeClient tests share (tests/unit/test_kube.py, tests/unit/test_kube_watch.py): a clock that
records sleeps, metrics that count, a pod, and the fixtures of a fake API server, that clock, those
metrics and a client of them, which each test module binds to its own names.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controller.runtime.client import KubeClient
from controller.runtime.clock import FakeClock
from tests.unit.fakeapi import FakeApi, running

DEADLINE_SECONDS = 10.0


POD_PATH = "/api/v1/namespaces/ns/pods/p"


class RecordingClock(FakeClock):
    """A fake clock that remembers every non-zero sleep (retry waits and rate-limit waits)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.sleeps.append(seconds)
        super().sleep(seconds)


class CountingMetrics:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def request(self, code: str, method: str, host: str) -> None:
        self.calls.append((code, method, host))


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as server:
        yield server


@pytest.fixture
def clock() -> RecordingClock:
    return RecordingClock()


@pytest.fixture
def metrics() -> CountingMetrics:
    return CountingMetrics()


@pytest.fixture
def client(api: FakeApi, clock: RecordingClock, metrics: CountingMetrics) -> KubeClient:
    return KubeClient(api.api_client(), qps=0, burst=0, metrics=metrics, clock=clock, backoff_initial=0.01)


def pod(name: str = "p", rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
    }
