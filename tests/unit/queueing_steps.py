"""Steps and readings the queueing tests share (tests/unit/test_queueing.py,
tests/unit/test_queueing_eviction.py): a job run to Running, a state checked to write nothing
further, and what a plan creates and records.
"""

from __future__ import annotations

import copy

from controller.planner import Plan
from tests.unit.kueue_world import JsonDict, KueueWorld


def assert_steady(w: KueueWorld, seconds: float = 1.0) -> None:
    """A reconcile a little later, with nothing changed in the cluster, writes nothing at all."""
    before = copy.deepcopy(w.job["status"])
    w.advance(seconds)
    again = w.plan()
    assert again.status == before
    assert (again.creates, again.patches, again.deletes, again.events) == ([], [], [], [])


def admitted(w: KueueWorld) -> JsonDict | None:
    return w.condition("Admitted")


def reason(w: KueueWorld) -> str:
    found = admitted(w)
    assert found is not None, w.status
    return str(found["reason"])


def workload_creates(result: Plan) -> list[JsonDict]:
    return [obj for obj in result.creates if obj["kind"] == "Workload"]


def pod_creates(result: Plan) -> list[JsonDict]:
    return [obj for obj in result.creates if obj["kind"] == "Pod"]


def event_reasons(result: Plan) -> list[tuple[str, str]]:
    return [(event.type, event.reason) for event in result.events]


def running(w: KueueWorld) -> None:
    """The job's Workload admitted and its gang running."""
    w.step()
    w.admit()
    w.step()
    w.start()
    w.step()
    assert w.state == "Running", w.status
