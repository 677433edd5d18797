"""Leader election on a fake Lease API: acquisition, renewal, expiry on the local clock, races, release."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import pytest

from controller.runtime.clock import FakeClock
from controller.runtime.errors import AlreadyExists, Conflict
from controller.runtime.leaderelection import LeaderElectionRecord, LeaderElector, LeaseClient, LeaseLock
from tests.unit import leaderelection_support
from tests.unit.leaderelection_support import (
    LEASE_NAME,
    NAMESPACE,
    START,
    FakeLeaseApi,
)

# The shared fixtures, bound here so that pytest finds them for this module's tests.
api = leaderelection_support.api
clock = leaderelection_support.clock

if TYPE_CHECKING:
    from controller.runtime.client import KubeClient

    def _kube_client_is_a_lease_client(client: KubeClient) -> LeaseClient:
        return client


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
