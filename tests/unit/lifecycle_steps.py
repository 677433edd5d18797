"""Steps and checks the lifecycle tests (tests/unit/test_lifecycle_*.py) share: the pods a plan
creates, a gang failed and restarted, and that a resting state writes nothing."""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

from controller.planner import Plan
from controller.runtime.clock import parse_time
from tests.unit.lifecycle_world import (
    World,
)

W0 = "mnist-worker-0"


W1 = "mnist-worker-1"


def assert_steady(w: World, seconds: float = 1.0) -> Plan:
    """A reconcile a little later, with nothing changed in the cluster, writes nothing at all."""
    before = copy.deepcopy(w.job["status"])
    w.advance(seconds)
    again = w.plan()
    assert again.status == before
    assert again.creates == []
    assert again.patches == []
    assert again.deletes == []
    assert again.events == []
    assert not again.delete_job
    return again


def pod_creates(result: Plan) -> list[dict[str, Any]]:
    return [obj for obj in result.creates if obj["kind"] == "Pod"]


def created_pod_names(result: Plan) -> list[str]:
    return sorted(obj["metadata"]["name"] for obj in pod_creates(result))


def restart_delay_of(w: World, failed_at: datetime) -> float:
    return (parse_time(w.status["restartAt"]) - failed_at).total_seconds()


def fail_and_restart(w: World, index: int = 1, code: int = 1, **kwargs: Any) -> Plan:
    """Rank `index` exits with `code`; the next reconcile reacts."""
    w.exit(index, code, **kwargs)
    return w.step()


def until_restarted(w: World) -> Plan:
    """Steps to restartAt (the old pods already gone) and returns the plan that recreates the gang."""
    restart_at = parse_time(w.status["restartAt"])
    w.advance((restart_at - w.now).total_seconds())
    result = w.step()
    assert created_pod_names(result), w.status
    return result
