"""What the leader election tests share (tests/unit/test_leaderelection*.py): an in-memory Lease API that
keeps resourceVersions, the callbacks an elector calls, an elector with short timings, and the
fixtures of that API and a fake clock, which each test module binds to its own names.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from controller.runtime.clock import FakeClock, RealClock
from controller.runtime.errors import AlreadyExists, Conflict, KubeError, NotFound
from controller.runtime.leaderelection import LeaderElector, LeaseLock

JsonObject = dict[str, Any]
NAMESPACE = "trainingjob-system"


LEASE_NAME = "trainingjob-operator"


DEADLINE_SECONDS = 10.0


START = datetime(2026, 1, 1, tzinfo=UTC)


class FakeLeaseApi:
    """An in-memory Lease endpoint with the API server's create and resourceVersion rules."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.leases: dict[tuple[str, str], JsonObject] = {}
        self.version = 0
        self.writes: list[str] = []  # holderIdentity of each successful write
        self.failure: KubeError | None = None
        self.refused = 0  # calls answered with `failure`
        self.before_create: Callable[[], None] | None = None
        self.before_replace: Callable[[], None] | None = None

    def _check(self, res: object) -> None:
        assert getattr(res, "group", None) == "coordination.k8s.io"
        assert getattr(res, "plural", None) == "leases"
        if self.failure is not None:
            self.refused += 1
            raise self.failure

    def _store(self, ns: str | None, body: JsonObject) -> JsonObject:
        assert ns is not None
        self.version += 1
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(self.version)
        stored["metadata"]["managedFields"] = [{"manager": "fake"}]
        self.leases[(ns, stored["metadata"]["name"])] = stored
        self.writes.append(stored["spec"]["holderIdentity"])
        return copy.deepcopy(stored)

    def get(self, res: object, ns: str | None, name: str) -> JsonObject:
        with self._lock:
            self._check(res)
            assert ns is not None
            if (ns, name) not in self.leases:
                raise NotFound(404, "NotFound", f"leases {name!r} not found")
            return copy.deepcopy(self.leases[(ns, name)])

    def create(self, res: object, ns: str | None, body: JsonObject) -> JsonObject:
        with self._lock:
            if self.before_create is not None:
                hook, self.before_create = self.before_create, None
                hook()
            self._check(res)
            assert ns is not None
            if (ns, body["metadata"]["name"]) in self.leases:
                raise AlreadyExists(409, "AlreadyExists", "lease exists")
            assert "resourceVersion" not in body["metadata"]
            return self._store(ns, body)

    def replace(self, res: object, ns: str | None, name: str, body: JsonObject) -> JsonObject:
        with self._lock:
            if self.before_replace is not None:
                hook, self.before_replace = self.before_replace, None
                hook()
            self._check(res)
            assert ns is not None
            current = self.leases.get((ns, name))
            if current is None:
                raise NotFound(404, "NotFound", f"leases {name!r} not found")
            if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                raise Conflict(409, "Conflict", "the object has been modified")
            assert "managedFields" not in body["metadata"]
            return self._store(ns, body)

    def spec(self) -> JsonObject:
        spec: JsonObject = self.leases[(NAMESPACE, LEASE_NAME)]["spec"]
        return spec

    def put_spec(self, **fields: Any) -> None:
        """Writes a lease as another process would (e.g. a leader with a skewed wall clock)."""
        with self._lock:
            body = {"metadata": {"name": LEASE_NAME, "namespace": NAMESPACE}, "spec": fields}
            self._store(NAMESPACE, body)


@pytest.fixture
def api() -> FakeLeaseApi:
    return FakeLeaseApi()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


class Callbacks:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.started = threading.Event()
        self.stopped = threading.Event()

    def on_started_leading(self) -> None:
        self.events.append("started")
        self.started.set()

    def on_stopped_leading(self) -> None:
        self.events.append("stopped")
        self.stopped.set()

    def on_new_leader(self, identity: str) -> None:
        self.events.append(f"leader={identity}")


def make_elector(
    api: FakeLeaseApi,
    identity: str,
    clock: FakeClock,
    callbacks: Callbacks | None = None,
    retry_period: float = 2.0,
) -> LeaderElector:
    callbacks = callbacks or Callbacks()
    return LeaderElector(
        LeaseLock(api, NAMESPACE, LEASE_NAME),
        identity,
        clock,
        lease_duration=15,
        renew_deadline=10,
        retry_period=retry_period,
        on_started_leading=callbacks.on_started_leading,
        on_stopped_leading=callbacks.on_stopped_leading,
        on_new_leader=callbacks.on_new_leader,
        jitter=lambda: 0.5,
    )


def wait_until(condition: Callable[[], bool]) -> None:
    clock = RealClock()
    deadline = clock.monotonic() + DEADLINE_SECONDS
    pause = threading.Event()
    while not condition():
        if clock.monotonic() > deadline:
            pytest.fail(f"condition not met within {DEADLINE_SECONDS} s")
        pause.wait(0.001)
