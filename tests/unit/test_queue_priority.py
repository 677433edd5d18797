"""Which news jumps the work queue: the pure rule (podstate.changes_the_gang), and the signals that
what a turned-away reconcile waited for arrived (StatusWrites for our status write, Expectations for
our creates and deletes). The queue's ordering itself is in test_workqueue.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from controller.planner.podstate import changes_the_gang
from controller.planner.supporting import desired_objects
from controller.runtime.clock import FakeClock
from controller.runtime.expectations import Expectations, Seen
from controller.runtime.trackers import StatusWrites
from crd.spec import parse
from tests.unit.fakeapi import FakeApi, Reply, Stream, event, items_list, running
from tests.unit.lifecycle_world import NAMESPACE, make_job
from tests.unit.shell_scene import manager_for, stored

JsonDict = dict[str, Any]


def pod(name: str, phase: str, terminating: bool = False) -> JsonDict:
    metadata: JsonDict = {"name": name}
    if terminating:
        metadata["deletionTimestamp"] = "2026-11-25T00:00:00Z"
    return {"metadata": metadata, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("old", "new", "others", "urgent"),
    [
        pytest.param("Pending", "Running", ["Running", "Running"], True, id="the-last-to-run"),
        pytest.param("Pending", "Running", ["Running", "Pending"], False, id="one-of-several-starting"),
        pytest.param("Pending", "Running", ["Succeeded"], True, id="the-rest-already-done"),
        pytest.param("Running", "Failed", ["Running"], True, id="ended-badly"),
        pytest.param("Running", "Succeeded", ["Running"], True, id="ended-well"),
        pytest.param("Pending", "Pending", ["Running"], False, id="bound-or-other-field"),
        pytest.param("Running", "Running", ["Running"], False, id="unchanged-phase"),
    ],
)
def test_a_pod_update_is_urgent_when_it_may_move_the_job(
    old: str, new: str, others: list[str], urgent: bool
) -> None:
    updated = pod("w-0", new)
    siblings = [updated, *(pod(f"w-{i + 1}", phase) for i, phase in enumerate(others))]
    assert changes_the_gang(pod("w-0", old), updated, siblings) is urgent


def test_a_pod_starting_to_terminate_is_urgent() -> None:
    before, after = pod("w-0", "Running"), pod("w-0", "Running", terminating=True)
    assert changes_the_gang(before, after, [after])
    assert not changes_the_gang(after, after, [after]), "only the moment it starts terminating"


def test_status_writes_say_when_a_turned_away_reconcile_can_go_on() -> None:
    writes = StatusWrites(FakeClock())
    assert writes.observed("ns/job", "1") is False, "nothing was written"
    writes.wrote("ns/job", "5")
    assert writes.observed("ns/job", "5") is False, "our write arrived before any reconcile waited"
    writes.wrote("ns/job", "7")
    assert not writes.settled("ns/job")  # a reconcile is turned away
    assert writes.observed("ns/job", "6") is False
    assert writes.observed("ns/job", "7") is True
    assert writes.settled("ns/job")
    assert writes.observed("ns/job", "7") is False, "already settled"


def test_expectations_say_when_a_turned_away_reconcile_can_go_on() -> None:
    expectations = Expectations(FakeClock())
    assert expectations.created("ns/job", "w-0") is Seen.UNEXPECTED
    expectations.expect_creates("ns/job", ["w-0", "w-1"])
    assert expectations.created("ns/job", "w-0") is Seen.EXPECTED
    assert expectations.created("ns/job", "w-1") is Seen.EXPECTED, "no reconcile waited for it"
    expectations.expect_creates("ns/job", ["w-0", "w-1"])
    expectations.expect_deletes("ns/job", ["uid-2"])
    assert not expectations.satisfied("ns/job")  # a reconcile is turned away
    assert expectations.created("ns/job", "w-0") is Seen.EXPECTED, "w-1 and uid-2 are still pending"
    assert expectations.created("ns/job", "w-1") is Seen.EXPECTED
    assert expectations.deleted("ns/job", "uid-2") is Seen.AWAITED
    assert expectations.satisfied("ns/job")
    assert expectations.deleted("ns/job", "uid-2") is Seen.UNEXPECTED, "already lowered"


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as fake:
        yield fake


@pytest.mark.parametrize("turned_away", [True, False], ids=["a-reconcile-waits", "nothing-waits"])
def test_the_service_a_reconcile_waits_for_is_taken_before_other_work(
    api: FakeApi, turned_away: bool
) -> None:
    # A job's Services are created after its pods and expected like them; the urgent news that its
    # pods run may find the Services not in the cache yet. Their arrival must then not wait behind the
    # first reconciles of every newer job.
    manager = manager_for(api)
    job = make_job()
    key = f"{NAMESPACE}/mnist"
    manager.watches.caches.jobs.add(job)
    service = next(obj for obj in desired_objects(parse(job), None) if obj["kind"] == "Service")
    manager.expectations.expect_creates(key, [service["metadata"]["name"]])
    if turned_away:
        assert manager.reconciler.reconcile(key).requeue_after, "the reconcile waits for the Service"
    assert api.requests() == []
    manager.queue.add(f"{NAMESPACE}/newer-job")

    api.script(
        "GET",
        "/api/v1/services",
        Reply(200, items_list([], "10")),
        Stream((event("ADDED", stored(service, 11)),), stall=True),
    )
    api.default("GET", "/api/v1/services", Stream(stall=True))
    services = next(informer for informer in manager.watches.informers if informer.resource.kind == "Service")
    stop = threading.Event()
    thread = threading.Thread(target=services.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10.0
        while (
            manager.watches.caches.owned["Service"].get(f"{NAMESPACE}/{service['metadata']['name']}") is None
        ):
            assert time.monotonic() < deadline, "the Service informer did not deliver the Service"
            time.sleep(0.01)
    finally:
        stop.set()
        services.stop()
        thread.join(10.0)

    assert manager.expectations.satisfied(key)
    first, _ = manager.queue.get()
    assert first == (key if turned_away else f"{NAMESPACE}/newer-job")
