"""Expectations: pending creates and deletes per job, lowered once per object, expiring after the TTL."""

from __future__ import annotations

import threading

import pytest

from controller.runtime.clock import FakeClock
from controller.runtime.expectations import Expectations, PendingExpectations, Seen

JOB = "ml/mnist"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def expectations(clock: FakeClock) -> Expectations:
    return Expectations(clock)


def test_a_job_without_a_record_is_satisfied(expectations: Expectations) -> None:
    assert expectations.satisfied(JOB)
    assert expectations.pending(JOB) is None


def test_creates_are_satisfied_when_every_name_was_observed(expectations: Expectations) -> None:
    expectations.expect_creates(JOB, ["mnist-master", "mnist-worker-0"])
    assert not expectations.satisfied(JOB)
    assert expectations.created(JOB, "mnist-master")
    assert not expectations.satisfied(JOB)
    assert expectations.created(JOB, "mnist-worker-0")
    assert expectations.satisfied(JOB)


def test_observing_the_same_create_twice_counts_once(expectations: Expectations) -> None:
    # The informer's add event and a 409 AlreadyExists may both report the same Pod.
    expectations.expect_creates(JOB, ["mnist-master", "mnist-worker-0"])
    assert expectations.created(JOB, "mnist-master")
    assert not expectations.created(JOB, "mnist-master")
    assert not expectations.satisfied(JOB)


def test_unexpected_observations_change_nothing(expectations: Expectations) -> None:
    expectations.expect_creates(JOB, ["mnist-master"])
    assert not expectations.created(JOB, "someone-elses-pod")
    assert not expectations.created("ml/other", "mnist-master")
    assert not expectations.deleted(JOB, "uid-never-deleted")
    assert not expectations.satisfied(JOB)


def test_deletes_are_tracked_by_uid(expectations: Expectations) -> None:
    expectations.expect_deletes(JOB, ["uid-1", "uid-2"])
    assert not expectations.satisfied(JOB)
    assert expectations.deleted(JOB, "uid-1")
    assert not expectations.deleted(JOB, "uid-1")
    # A replacement Pod with the same name has a new UID: its deletion is not the one we wait for.
    assert not expectations.deleted(JOB, "uid-of-replacement")
    assert not expectations.satisfied(JOB)
    assert expectations.deleted(JOB, "uid-2")
    assert expectations.satisfied(JOB)


def test_creates_and_deletes_in_one_reconcile_are_both_kept(expectations: Expectations) -> None:
    expectations.expect_deletes(JOB, ["uid-old"])
    expectations.expect_creates(JOB, ["mnist-worker-0"])
    expectations.created(JOB, "mnist-worker-0")
    assert not expectations.satisfied(JOB), "the delete is still pending"
    expectations.deleted(JOB, "uid-old")
    assert expectations.satisfied(JOB)


def test_expectations_expire_after_the_ttl(expectations: Expectations, clock: FakeClock) -> None:
    expectations.expect_creates(JOB, ["mnist-master"])
    clock.advance(300.0)
    assert not expectations.satisfied(JOB), "exactly the TTL is not yet expired"
    clock.advance(0.001)
    assert expectations.satisfied(JOB)
    pending = expectations.pending(JOB)
    assert pending is not None
    assert pending.expired
    assert pending.creates == frozenset({"mnist-master"})


def test_a_new_expectation_on_an_expired_record_starts_fresh(
    expectations: Expectations, clock: FakeClock
) -> None:
    expectations.expect_creates(JOB, ["lost-event"])
    clock.advance(301.0)
    expectations.expect_creates(JOB, ["mnist-worker-1"])
    assert expectations.pending(JOB) == PendingExpectations(
        creates=frozenset({"mnist-worker-1"}), deletes=frozenset(), age_seconds=0.0, expired=False
    )
    expectations.created(JOB, "mnist-worker-1")
    assert expectations.satisfied(JOB)


def test_a_new_expectation_refreshes_a_live_record(expectations: Expectations, clock: FakeClock) -> None:
    expectations.expect_creates(JOB, ["a"])
    clock.advance(200.0)
    expectations.expect_deletes(JOB, ["uid-b"])
    clock.advance(200.0)
    assert not expectations.satisfied(JOB), "the record was refreshed 200 s ago"
    pending = expectations.pending(JOB)
    assert pending is not None
    assert pending.creates == frozenset({"a"})
    assert pending.deletes == frozenset({"uid-b"})
    assert pending.age_seconds == pytest.approx(200.0)


def test_custom_ttl(clock: FakeClock) -> None:
    expectations = Expectations(clock, ttl=5.0)
    expectations.expect_deletes(JOB, ["uid-1"])
    clock.advance(5.5)
    assert expectations.satisfied(JOB)


def test_forget_drops_the_record(expectations: Expectations) -> None:
    expectations.expect_creates(JOB, ["mnist-master"])
    expectations.expect_deletes(JOB, ["uid-1"])
    expectations.forget(JOB)
    assert expectations.satisfied(JOB)
    assert expectations.pending(JOB) is None
    assert not expectations.created(JOB, "mnist-master")
    expectations.forget("ml/never-seen")


def test_fulfilled_records_are_not_kept(expectations: Expectations) -> None:
    expectations.expect_creates(JOB, [])
    assert expectations.pending(JOB) is None
    expectations.expect_creates(JOB, ["a"])
    expectations.created(JOB, "a")
    assert expectations.pending(JOB) is None


def test_jobs_are_independent(expectations: Expectations) -> None:
    expectations.expect_creates(JOB, ["mnist-master"])
    expectations.expect_creates("ml/bert", ["bert-master"])
    expectations.created(JOB, "mnist-master")
    assert expectations.satisfied(JOB)
    assert not expectations.satisfied("ml/bert")


def test_concurrent_observations(expectations: Expectations) -> None:
    names = [f"pod-{index}" for index in range(400)]
    expectations.expect_creates(JOB, names)
    lowered: list[Seen] = []
    lowered_lock = threading.Lock()

    def observe() -> None:
        results = [expectations.created(JOB, name) for name in names]
        with lowered_lock:
            lowered.extend(results)

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    assert len([seen for seen in lowered if seen]) == len(names), (
        "each name lowers the expectation exactly once"
    )
    assert expectations.satisfied(JOB)
