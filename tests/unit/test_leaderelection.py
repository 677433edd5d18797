"""Leader election on a fake Lease API: acquisition, renewal, expiry on the local clock, races, release."""

from __future__ import annotations

import copy
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest

from controller.runtime.clock import FakeClock, RealClock
from controller.runtime.errors import AlreadyExists, ApiError, Conflict, KubeError, NotFound, ServerError
from controller.runtime.leaderelection import LeaderElectionRecord, LeaderElector, LeaseClient, LeaseLock

if TYPE_CHECKING:
    from controller.runtime.client import KubeClient

    def _kube_client_is_a_lease_client(client: KubeClient) -> LeaseClient:
        return client


NAMESPACE = "trainingjob-system"
LEASE_NAME = "trainingjob-operator"
DEADLINE_SECONDS = 10.0
START = datetime(2026, 1, 1, tzinfo=UTC)

JsonObject = dict[str, Any]


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


# --- records and the lock ------------------------------------------------------------------------


def test_record_to_lease_spec_uses_micro_time() -> None:
    record = LeaderElectionRecord(
        holder_identity="a",
        lease_duration_seconds=15,
        acquire_time=datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC),
        renew_time=datetime(2026, 3, 4, 5, 6, 8, 120, tzinfo=UTC),
        leader_transitions=3,
    )
    assert record.to_lease_spec() == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-03-04T05:06:07.000000Z",
        "renewTime": "2026-03-04T05:06:08.000120Z",
        "leaseTransitions": 3,
    }
    assert LeaderElectionRecord.from_lease({"spec": record.to_lease_spec()}) == record


def test_record_from_a_sparse_lease() -> None:
    assert LeaderElectionRecord.from_lease({"metadata": {"name": "x"}}) == LeaderElectionRecord(
        holder_identity="", lease_duration_seconds=0, acquire_time=None, renew_time=None, leader_transitions=0
    )
    assert "acquireTime" not in LeaderElectionRecord("", 1, None, None, 0).to_lease_spec()


def test_lease_lock_round_trip(api: FakeLeaseApi) -> None:
    lock = LeaseLock(api, NAMESPACE, LEASE_NAME)
    assert lock.get() is None
    record = LeaderElectionRecord("a", 15, START, START, 0)
    created_version = lock.create(record)
    got = lock.get()
    assert got is not None
    got_record, got_version, raw = got
    assert got_record == record
    assert got_version == created_version
    assert raw["kind"] == "Lease"
    assert raw["apiVersion"] == "coordination.k8s.io/v1"
    with pytest.raises(AlreadyExists):
        lock.create(record)


def test_lease_lock_update_is_conditional_on_the_version_read(api: FakeLeaseApi) -> None:
    lock = LeaseLock(api, NAMESPACE, LEASE_NAME)
    first_version = lock.create(LeaderElectionRecord("a", 15, START, START, 0))
    second_version = lock.update(LeaderElectionRecord("a", 15, START, START, 0), first_version)
    assert second_version != first_version
    with pytest.raises(Conflict):
        lock.update(LeaderElectionRecord("b", 15, START, START, 1), first_version)
    assert api.spec()["holderIdentity"] == "a"


def test_lease_lock_update_keeps_the_leases_metadata(api: FakeLeaseApi) -> None:
    api.leases[(NAMESPACE, LEASE_NAME)] = {
        "metadata": {
            "name": LEASE_NAME,
            "namespace": NAMESPACE,
            "resourceVersion": "7",
            "labels": {"k": "v"},
        },
        "spec": {},
    }
    lock = LeaseLock(api, NAMESPACE, LEASE_NAME)
    got = lock.get()
    assert got is not None
    lock.update(LeaderElectionRecord("a", 15, START, START, 1), got[1])
    assert api.leases[(NAMESPACE, LEASE_NAME)]["metadata"]["labels"] == {"k": "v"}


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timing", "message"),
    [
        ((10, 10, 2), "lease_duration must be greater than renew_deadline"),
        ((15, 2.4, 2), "renew_deadline must be greater than 1.2 * retry_period"),
        ((15, 10, 0), "retry_period must be positive"),
    ],
)
def test_invalid_timing_is_refused(
    api: FakeLeaseApi, clock: FakeClock, timing: tuple[float, float, float], message: str
) -> None:
    lease_duration, renew_deadline, retry_period = timing
    with pytest.raises(ValueError, match=re.escape(message)):
        LeaderElector(
            LeaseLock(api, NAMESPACE, LEASE_NAME),
            "a",
            clock,
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
        )


def test_identity_is_required(api: FakeLeaseApi, clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(LeaseLock(api, NAMESPACE, LEASE_NAME), "", clock)


# --- single steps on a fake clock ----------------------------------------------------------------


def test_acquires_a_missing_lease(api: FakeLeaseApi, clock: FakeClock) -> None:
    callbacks = Callbacks()
    leader = make_elector(api, "a", clock, callbacks)
    assert not leader.is_leader()
    assert leader.try_acquire_or_renew()
    assert leader.is_leader()
    assert api.spec() == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T00:00:00.000000Z",
        "renewTime": "2026-01-01T00:00:00.000000Z",
        "leaseTransitions": 0,
    }
    assert callbacks.events == ["leader=a"]


def test_acquires_an_empty_lease(api: FakeLeaseApi, clock: FakeClock) -> None:
    api.put_spec(holderIdentity="", leaseDurationSeconds=1, leaseTransitions=4)
    leader = make_elector(api, "a", clock)
    assert leader.try_acquire_or_renew()
    assert api.spec()["holderIdentity"] == "a"
    assert api.spec()["leaseTransitions"] == 5


def test_renew_keeps_acquire_time_and_moves_renew_time(api: FakeLeaseApi, clock: FakeClock) -> None:
    leader = make_elector(api, "a", clock)
    assert leader.try_acquire_or_renew()
    clock.advance(2.5)
    assert leader.try_acquire_or_renew()
    assert api.spec()["acquireTime"] == "2026-01-01T00:00:00.000000Z"
    assert api.spec()["renewTime"] == "2026-01-01T00:00:02.500000Z"
    assert api.spec()["leaseTransitions"] == 0
    assert api.writes == ["a", "a"]


def test_renew_after_someone_else_wrote_the_lease_falls_back_to_reading(
    api: FakeLeaseApi, clock: FakeClock
) -> None:
    leader = make_elector(api, "a", clock)
    assert leader.try_acquire_or_renew()
    # An unrelated write (say, a label change) bumps the resourceVersion; the optimistic PUT fails.
    lease = api.leases[(NAMESPACE, LEASE_NAME)]
    api.version += 1
    lease["metadata"]["resourceVersion"] = str(api.version)
    clock.advance(2)
    assert leader.try_acquire_or_renew()
    assert leader.is_leader()
    assert api.spec()["renewTime"] == "2026-01-01T00:00:02.000000Z"
    assert api.spec()["leaseTransitions"] == 0


def test_standby_waits_a_full_lease_from_its_first_observation(api: FakeLeaseApi, clock: FakeClock) -> None:
    leader = make_elector(api, "a", clock)
    standby_callbacks = Callbacks()
    standby = make_elector(api, "b", clock, standby_callbacks)
    assert leader.try_acquire_or_renew()
    writes_before = list(api.writes)

    clock.advance(10)  # the standby starts late: its countdown starts when it first sees the record
    assert not standby.try_acquire_or_renew()
    clock.advance(14.999)
    assert not standby.try_acquire_or_renew()
    assert api.writes == writes_before, "a standby must not write while the lease is valid"
    assert not standby.is_leader()

    clock.advance(0.001)
    assert standby.try_acquire_or_renew()
    assert standby.is_leader()
    assert api.spec()["holderIdentity"] == "b"
    assert api.spec()["leaseTransitions"] == 1
    assert api.spec()["acquireTime"] == "2026-01-01T00:00:25.000000Z"
    assert standby_callbacks.events == ["leader=a", "leader=b"]


def test_every_observed_change_restarts_the_standbys_countdown(api: FakeLeaseApi, clock: FakeClock) -> None:
    leader = make_elector(api, "a", clock)
    standby = make_elector(api, "b", clock)
    assert leader.try_acquire_or_renew()
    assert not standby.try_acquire_or_renew()  # observed at t=0

    clock.advance(10)
    assert leader.try_acquire_or_renew()  # renewed at t=10, after which the leader dies
    clock.advance(4)
    assert not standby.try_acquire_or_renew()  # sees the renewal at t=14: valid until t=29

    clock.advance(14.9)
    assert not standby.try_acquire_or_renew()
    clock.advance(0.1)
    assert standby.try_acquire_or_renew()


def test_lease_timestamps_are_ignored(api: FakeLeaseApi, clock: FakeClock) -> None:
    # The holder's wall clock is an hour behind, so its renewTime looks long expired: still respected.
    api.put_spec(
        holderIdentity="skewed",
        leaseDurationSeconds=15,
        acquireTime="2025-12-31T23:00:00.000000Z",
        renewTime="2025-12-31T23:00:00.000000Z",
        leaseTransitions=2,
    )
    standby = make_elector(api, "b", clock)
    assert not standby.try_acquire_or_renew()
    clock.advance(14)
    assert not standby.try_acquire_or_renew()

    # A renewTime far in the future does not keep the lease alive once the record stops changing.
    api.put_spec(
        holderIdentity="skewed",
        leaseDurationSeconds=15,
        acquireTime="2030-01-01T00:00:00.000000Z",
        renewTime="2030-01-01T00:00:00.000000Z",
        leaseTransitions=2,
    )
    assert not standby.try_acquire_or_renew()
    clock.advance(15)
    assert standby.try_acquire_or_renew()
    assert api.spec()["leaseTransitions"] == 3


def test_the_lease_duration_in_the_record_decides_expiry(api: FakeLeaseApi, clock: FakeClock) -> None:
    api.put_spec(holderIdentity="short", leaseDurationSeconds=3, leaseTransitions=0)
    standby = make_elector(api, "b", clock)
    assert not standby.try_acquire_or_renew()
    clock.advance(3)
    assert standby.try_acquire_or_renew()


def test_a_lost_race_ends_cleanly(api: FakeLeaseApi, clock: FakeClock) -> None:
    old = make_elector(api, "old", clock)
    first = make_elector(api, "first", clock)
    second = make_elector(api, "second", clock)
    assert old.try_acquire_or_renew()
    assert not first.try_acquire_or_renew()
    assert not second.try_acquire_or_renew()
    clock.advance(15)

    # `first` reads the expired lease and, just before its PUT lands, `second` takes the lease.
    def rival_takes_over() -> None:
        assert second.try_acquire_or_renew()

    api.before_replace = rival_takes_over
    assert not first.try_acquire_or_renew()
    assert second.is_leader()
    assert not first.is_leader()
    assert api.spec()["holderIdentity"] == "second"
    assert api.spec()["leaseTransitions"] == 1
    assert "first" not in api.writes

    # Next round, `first` sees a fresh lease held by `second` and stays a standby.
    assert not first.try_acquire_or_renew()
    assert "first" not in api.writes


def test_create_race_is_lost_cleanly(api: FakeLeaseApi, clock: FakeClock) -> None:
    first = make_elector(api, "first", clock)
    second = make_elector(api, "second", clock)

    def rival_creates_first() -> None:
        assert second.try_acquire_or_renew()

    api.before_create = rival_creates_first
    assert not first.try_acquire_or_renew()
    assert not first.is_leader()
    assert api.spec()["holderIdentity"] == "second"


def test_transient_errors_do_not_end_leadership_by_themselves(api: FakeLeaseApi, clock: FakeClock) -> None:
    leader = make_elector(api, "a", clock)
    assert leader.try_acquire_or_renew()
    api.failure = ServerError(503, "ServiceUnavailable", "etcd is sad")
    clock.advance(2)
    assert not leader.try_acquire_or_renew()
    assert leader.is_leader(), "only the renew deadline ends leadership"
    api.failure = None
    clock.advance(2)
    assert leader.try_acquire_or_renew()
    assert api.spec()["renewTime"] == "2026-01-01T00:00:04.000000Z"


def test_leader_that_sees_a_new_holder_is_no_longer_leader(api: FakeLeaseApi, clock: FakeClock) -> None:
    leader = make_elector(api, "a", clock)
    assert leader.try_acquire_or_renew()
    api.put_spec(holderIdentity="intruder", leaseDurationSeconds=15, leaseTransitions=1)
    clock.advance(2)
    assert not leader.try_acquire_or_renew()
    assert not leader.is_leader()


def test_release_lets_a_standby_acquire_at_once(api: FakeLeaseApi, clock: FakeClock) -> None:
    leader = make_elector(api, "a", clock)
    standby = make_elector(api, "b", clock)
    assert leader.try_acquire_or_renew()
    clock.advance(10)
    assert leader.try_acquire_or_renew()
    assert not standby.try_acquire_or_renew()

    clock.advance(1)
    assert leader.release()
    assert not leader.is_leader()
    assert api.spec() == {
        "holderIdentity": "",
        "leaseDurationSeconds": 1,
        "acquireTime": "2026-01-01T00:00:11.000000Z",
        "renewTime": "2026-01-01T00:00:11.000000Z",
        "leaseTransitions": 0,
    }

    assert standby.try_acquire_or_renew()
    assert api.spec()["holderIdentity"] == "b"
    assert api.spec()["leaseTransitions"] == 1


def test_release_without_holding_the_lease_writes_nothing(api: FakeLeaseApi, clock: FakeClock) -> None:
    leader = make_elector(api, "a", clock)
    standby = make_elector(api, "b", clock)
    assert standby.release()
    assert leader.try_acquire_or_renew()
    assert not standby.try_acquire_or_renew()
    writes = list(api.writes)
    assert standby.release()
    assert api.writes == writes


def test_failed_release_reports_false(api: FakeLeaseApi, clock: FakeClock) -> None:
    leader = make_elector(api, "a", clock)
    assert leader.try_acquire_or_renew()
    api.failure = ServerError(500, "InternalError", "boom")
    assert not leader.release()
    assert not leader.is_leader()


@pytest.mark.parametrize("error", [ApiError(403, "Forbidden", "no"), ServerError(500, "InternalError", "x")])
def test_api_errors_while_acquiring_are_a_failed_attempt(
    api: FakeLeaseApi, clock: FakeClock, error: ApiError
) -> None:
    api.failure = error
    elector = make_elector(api, "a", clock)
    assert not elector.try_acquire_or_renew()
    assert not elector.is_leader()


# --- the loops, on threads -----------------------------------------------------------------------


def start_run(elector: LeaderElector) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(stop,), daemon=True)
    thread.start()
    return thread, stop


def finished(thread: threading.Thread) -> bool:
    thread.join(DEADLINE_SECONDS)
    return not thread.is_alive()


def test_run_leads_until_stopped_then_releases(api: FakeLeaseApi, clock: FakeClock) -> None:
    callbacks = Callbacks()
    elector = make_elector(api, "a", clock, callbacks, retry_period=0.005)
    thread, stop = start_run(elector)
    assert callbacks.started.wait(DEADLINE_SECONDS)
    assert elector.is_leader()
    clock.advance(1)
    wait_until(lambda: api.spec()["renewTime"] == "2026-01-01T00:00:01.000000Z")

    stop.set()
    assert finished(thread)
    assert callbacks.events == ["leader=a", "started", "stopped"]
    assert not elector.is_leader()
    assert api.spec()["holderIdentity"] == ""
    assert api.spec()["leaseDurationSeconds"] == 1


def test_run_gives_up_after_the_renew_deadline(api: FakeLeaseApi, clock: FakeClock) -> None:
    callbacks = Callbacks()
    elector = make_elector(api, "a", clock, callbacks, retry_period=0.005)
    thread, _ = start_run(elector)
    assert callbacks.started.wait(DEADLINE_SECONDS)

    api.failure = ServerError(503, "ServiceUnavailable", "apiserver down")
    clock.advance(9.9)
    refused = api.refused
    wait_until(lambda: api.refused >= refused + 3)  # several renewals failed inside the deadline
    assert not callbacks.stopped.is_set()
    assert elector.is_leader()
    clock.advance(0.1)
    assert finished(thread)
    assert callbacks.events == ["leader=a", "started", "stopped"]
    assert not elector.is_leader()


def test_run_as_standby_takes_over_when_the_leader_stops_renewing(
    api: FakeLeaseApi, clock: FakeClock
) -> None:
    leader = make_elector(api, "a", clock)
    assert leader.try_acquire_or_renew()
    callbacks = Callbacks()
    standby = make_elector(api, "b", clock, callbacks, retry_period=0.005)
    thread, stop = start_run(standby)
    wait_until(lambda: "leader=a" in callbacks.events)
    assert not callbacks.started.is_set()
    assert api.writes == ["a"]

    clock.advance(15)
    assert callbacks.started.wait(DEADLINE_SECONDS)
    assert api.spec()["holderIdentity"] == "b"
    stop.set()
    assert finished(thread)


def test_run_stopped_before_acquiring_calls_nothing(api: FakeLeaseApi, clock: FakeClock) -> None:
    leader = make_elector(api, "a", clock)
    assert leader.try_acquire_or_renew()
    callbacks = Callbacks()
    standby = make_elector(api, "b", clock, callbacks, retry_period=0.005)
    thread, stop = start_run(standby)
    wait_until(lambda: "leader=a" in callbacks.events)
    stop.set()
    assert finished(thread)
    assert callbacks.events == ["leader=a"]
    assert api.spec()["holderIdentity"] == "a"
