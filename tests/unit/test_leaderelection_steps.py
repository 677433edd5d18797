"""The leader elector's behaviour, step by step on a fake clock (acquire, renew, observe, expire, lose a
race, release, API errors) and in its loops on threads (lead until stopped, give up after the renew
deadline, take over as standby), against an in-memory Lease API.

Split out of tests/unit/test_leaderelection.py (records, the lock, configuration).
"""

from __future__ import annotations

import threading

import pytest

from controller.runtime.clock import FakeClock
from controller.runtime.errors import ApiError, ServerError
from controller.runtime.leaderelection import LeaderElector
from tests.unit import leaderelection_support
from tests.unit.leaderelection_support import (
    DEADLINE_SECONDS,
    LEASE_NAME,
    NAMESPACE,
    Callbacks,
    FakeLeaseApi,
    make_elector,
    wait_until,
)

# The shared fixtures, bound here so that pytest finds them for this module's tests.
api = leaderelection_support.api
clock = leaderelection_support.clock


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
