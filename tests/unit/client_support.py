"""What the TrainingJobClient tests share (tests/unit/test_client.py, tests/unit/test_client_waiting.py):
a client of a fake API server on a given clock, the watches it opened, and the fixtures of that
server and a client, which each test module binds to its own names. The fake objects are in
tests/unit/clientfakes.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from controller.runtime.client import KubeClient
from controller.runtime.clock import FakeClock
from tests.unit.clientfakes import (
    JOBS,
    NAMESPACE,
)
from tests.unit.fakeapi import FakeApi, running
from trainingjob_client import (
    TrainingJobClient,
)

MNIST = f"{JOBS}/mnist"


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as server:
        yield server


def client_for(api: FakeApi, clock: FakeClock | None = None) -> TrainingJobClient:
    kube = KubeClient(api.api_client(), qps=0, burst=0, max_attempts=2, backoff_initial=0.01)
    return TrainingJobClient(NAMESPACE, kube=kube, clock=clock)


@pytest.fixture
def client(api: FakeApi) -> TrainingJobClient:
    return client_for(api)


def watches(api: FakeApi) -> list[dict[str, str]]:
    return [request.query for request in api.requests("GET", JOBS) if request.is_watch]
