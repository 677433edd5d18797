"""controller.planner.gang: a job's pods seen as one gang (ranks, terminating, stale and extra pods,
failures) and the failure that broke it."""

from __future__ import annotations

from typing import Any

from builders.pods import build_pod
from controller.planner.gang import observe, root_cause
from crd import contract
from crd.spec import parse
from tests.unit.lifecycle_world import make_job, make_node

JsonDict = dict[str, Any]

NODES = {f"node-{i}": make_node(f"node-{i}") for i in range(8)}


def pod(
    index: int, phase: str = "Running", *, workers: int = 4, bound: bool = True, **extra: Any
) -> JsonDict:
    built = build_pod(parse(make_job(workers=workers)), index, attempt=0, resume_from=None)
    if bound:
        built["spec"]["nodeName"] = f"node-{index}"
    built["status"] = {"phase": phase, **extra}
    return built


def failed(index: int, code: int, finished_at: str) -> JsonDict:
    terminated = {"exitCode": code, "reason": "Error", "finishedAt": finished_at}
    return pod(index, "Failed", containerStatuses=[{"name": "trainer", "state": {"terminated": terminated}}])


def test_a_complete_running_gang() -> None:
    view = observe([pod(i) for i in range(4)], 4, NODES, True)
    assert sorted(view.ranks) == [0, 1, 2, 3]
    assert view.missing == []
    assert view.failures == []
    assert view.stale == []
    assert view.formed(0)
    assert view.workers() == {"pending": 0, "active": 4, "succeeded": 0, "failed": 0}
    assert len(view.live) == len(view.all_pods) == 4


def test_missing_ranks_and_a_gang_not_yet_formed() -> None:
    view = observe([pod(0, "Pending", bound=False), pod(2, "Pending")], 4, NODES, True)
    assert view.missing == [1, 3]
    assert not view.formed(0)
    assert [p["metadata"]["name"] for p in view.unscheduled] == ["mnist-worker-0"]
    assert view.workers()["pending"] == 2


def test_terminating_pods_are_not_ranks() -> None:
    going = pod(1)
    going["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    view = observe([pod(0), going], 2, NODES, True)
    assert view.missing == [1]
    assert view.terminating == [going]
    assert going not in view.live
    assert going in view.all_pods


def test_pods_beyond_the_world_size_or_without_an_index_are_extra() -> None:
    unlabeled = pod(0)
    unlabeled["metadata"]["name"] = "stray"
    del unlabeled["metadata"]["labels"][contract.REPLICA_INDEX_LABEL]
    view = observe([pod(0, workers=2), pod(1, workers=2), pod(5, workers=2), unlabeled], 2, NODES, True)
    assert sorted(view.ranks) == [0, 1]
    assert sorted(p["metadata"]["name"] for p in view.out_of_range) == ["mnist-worker-5", "stray"]


def test_never_two_pods_for_one_rank() -> None:
    twin = pod(1, workers=2)
    twin["metadata"]["name"] = "mnist-worker-1-b"
    view = observe([twin, pod(1, workers=2), pod(0, workers=2)], 2, NODES, True)
    assert view.ranks[1]["metadata"]["name"] == "mnist-worker-1"  # the first by name keeps the rank
    assert [p["metadata"]["name"] for p in view.out_of_range] == ["mnist-worker-1-b"]


def test_pods_built_for_another_world_size_are_stale() -> None:
    view = observe([pod(0, workers=4), pod(1, workers=4)], 2, NODES, True)
    assert len(view.stale) == 2
    view = observe([pod(0, workers=2), pod(1, workers=2)], 2, NODES, True)
    assert view.stale == []


def test_failures_are_collected_with_node_loss() -> None:
    nodes = {**NODES, "node-2": make_node("node-2", False)}
    view = observe(
        [pod(0), failed(1, 1, "2026-03-01T12:00:00Z"), pod(2), pod(3, "Succeeded")], 4, nodes, True
    )
    assert sorted((f.pod, f.reason, f.disruption) for f in view.failures) == [
        ("mnist-worker-1", "Error", False),
        ("mnist-worker-2", "NodeLost", True),
    ]
    assert view.workers() == {"pending": 0, "active": 2, "succeeded": 1, "failed": 1}
    assert observe([pod(2)], 4, nodes, False).failures == []


def test_a_preempted_pod_being_deleted_is_a_disruption_of_its_rank() -> None:
    preempted = pod(1)
    preempted["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:30Z"
    preempted["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler", "message": "x"}
    ]
    view = observe([pod(0), preempted], 2, NODES, True)
    assert view.missing == [1]
    assert [(f.pod, f.reason, f.disruption) for f in view.failures] == [
        ("mnist-worker-1", "PreemptionByScheduler", True)
    ]


def test_a_pod_deleted_without_a_disruption_condition_is_no_failure() -> None:
    deleted = pod(1)
    deleted["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:30Z"
    assert observe([pod(0), deleted], 2, NODES, True).failures == []


def test_the_root_cause_is_a_disruption_before_any_error() -> None:
    nodes = {**NODES, "node-3": make_node("node-3", None)}
    pods = [failed(0, 1, "2026-03-01T12:00:00Z"), pod(3)]
    view = observe(pods, 4, nodes, True)
    cause = root_cause(view.failures, {p["metadata"]["name"]: p for p in pods})
    assert (cause.pod, cause.reason) == ("mnist-worker-3", "NodeLost")


def test_the_root_cause_is_the_earliest_termination() -> None:
    pods = [
        failed(0, 1, "2026-03-01T12:00:09Z"),
        failed(1, 3, "2026-03-01T12:00:01Z"),
        failed(2, 1, "2026-03-01T12:00:05Z"),
        pod(3, "Failed", reason="UnexpectedAdmissionError"),
    ]
    view = observe(pods, 4, NODES, True)
    cause = root_cause(view.failures, {p["metadata"]["name"]: p for p in pods})
    assert (cause.pod, cause.exit_code) == ("mnist-worker-1", 3)


def test_equal_termination_times_break_ties_by_name() -> None:
    pods = [failed(2, 1, "2026-03-01T12:00:00Z"), failed(1, 1, "2026-03-01T12:00:00Z")]
    view = observe(pods, 4, NODES, True)
    assert root_cause(view.failures, {p["metadata"]["name"]: p for p in pods}).pod == "mnist-worker-1"
