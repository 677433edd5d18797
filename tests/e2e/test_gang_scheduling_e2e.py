"""Gang scheduling end to end: a PodGroup the coscheduling scheduler binds whole or not at all, a
cluster without a gang scheduler (the CRD taken away for the test), a gang that cannot fit released
after its schedule timeout, and two gangs that cannot both fit running one after the other.

They run on the real scheduler-plugins scheduler with its coscheduling plugin and its PodGroup CRD
(the `coscheduling` fixture adds them to the session's cluster) and bring their own tainted nodes
(`node_pool`), as tests/e2e/test_lifecycle_scheduling_e2e.py (schedule timeout, node loss,
preemption) explains; split out of it.
"""

from __future__ import annotations

import pytest

from crd import contract
from testbed import Kubectl, end_pod, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    PodWatch,
    event_messages,
    job_manifest,
    pods_of,
    status_of,
    wait_for_events,
)
from tests.e2e.lifecycle_support import (
    TIMEOUT,
    WatchEvents,
    assert_replaced_as_a_gang,
    attempt_of,
    node_pool,
    pool_scheduling,
    running_pods,
    wait_state,
)
from tests.e2e.scheduling_support import (
    BACKOFF,
    POD_GROUP_CRD,
    pod_group_api_withdrawn,
    scheduled_by,
    wait_unschedulable,
)

# --------------------------------------------------------------------------------- gang scheduling


def test_gang_scheduling_creates_a_pod_group_that_the_coscheduling_scheduler_binds(
    coscheduling: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """The operator sees the real PodGroup CRD at start, creates a PodGroup the CRD's schema accepts,
    and hands the pods to the second scheduler, which binds the whole gang. The job's Volcano queue
    means nothing to it, which one Warning Event says."""
    kubectl = coscheduling
    with node_pool(kubectl, namespace, 2):
        start_operator()
        scheduling = pool_scheduling(namespace, gangScheduling=True, queue="research")
        kubectl.apply(
            job_manifest("gang", numWorkers=3, gpusPerWorker=4, scheduling=scheduling), "-n", namespace
        )
        group = wait_for("PodGroup gang", lambda: kubectl.get_or_none(POD_GROUP_CRD, "gang", "-n", namespace))
        job = kubectl.get_json("trainingjob", "gang", "-n", namespace)
        status = wait_state(kubectl, namespace, "gang", "Running")["status"]
        pods = running_pods(kubectl, namespace, "gang", 0, 3)
        binders = wait_for("three Scheduled events", lambda: scheduled_by(kubectl, namespace, 3))
        events = wait_for_events(
            kubectl, namespace, "gang", {"SchedulingQueueIgnored": ["spec.scheduling.queue (research)"]}
        )

    assert group["spec"]["minMember"] == 3
    owners = group["metadata"].get("ownerReferences") or []
    assert [(o["kind"], o["name"], o["uid"], o.get("controller")) for o in owners] == [
        (contract.KIND, "gang", job["metadata"]["uid"], True)
    ]
    for pod in pods:
        assert pod["metadata"]["labels"][contract.COSCHEDULING_POD_GROUP_LABEL] == "gang"
        assert pod["spec"]["schedulerName"] == contract.COSCHEDULING_SCHEDULER_NAME
    assert binders == {pod["metadata"]["name"]: contract.COSCHEDULING_SCHEDULER_NAME for pod in pods}
    assert status["workers"]["active"] == 3
    assert not event_messages(events, "GangSchedulingUnavailable")
    ignored = [e for e in events if e["reason"] == "SchedulingQueueIgnored"]
    assert [(e["type"], e.get("count", 1)) for e in ignored] == [("Warning", 1)]
    assert "scheduler-plugins' coscheduling" in ignored[0]["message"]
    assert "queue" not in group["spec"]


def test_without_a_gang_scheduler_the_job_is_scheduled_normally_with_a_warning(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    with pod_group_api_withdrawn(kubectl):
        start_operator()
        kubectl.apply(
            job_manifest("solo", numWorkers=2, scheduling={"gangScheduling": True}), "-n", namespace
        )
        wait_state(kubectl, namespace, "solo", "Running")
        events = wait_for_events(
            kubectl, namespace, "solo", {"GangSchedulingUnavailable": ["scheduling pods individually"]}
        )
        pods = pods_of(kubectl, namespace, "solo")
        status = status_of(kubectl, namespace, "solo")

    warnings = [e for e in events if e["reason"] == "GangSchedulingUnavailable"]
    assert [e["type"] for e in warnings] == ["Warning"]
    assert warnings[0].get("count", 1) == 1
    for pod in pods:
        assert contract.COSCHEDULING_POD_GROUP_LABEL not in pod["metadata"]["labels"]
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert pod["spec"]["nodeName"]
    assert status["workers"]["active"] == 2


@pytest.mark.slow
def test_a_gang_that_cannot_fit_binds_no_pod_and_is_released_after_its_schedule_timeout(
    coscheduling: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """3 workers x 8 GPUs on 2 nodes of 8, gang-scheduled: two would fit, but the coscheduling
    scheduler binds none. After scheduleTimeoutSeconds the operator releases the gang and tries again,
    as without a gang scheduler (test_a_gang_that_cannot_be_scheduled_in_time_is_released_and_retried)."""
    kubectl = coscheduling
    timeout = 3
    with node_pool(kubectl, namespace, 2):
        start_operator()
        scheduling = pool_scheduling(namespace, gangScheduling=True, scheduleTimeoutSeconds=timeout)
        manifest = job_manifest(
            "toobig",
            numWorkers=3,
            gpusPerWorker=8,
            scheduling=scheduling,
            failurePolicy={"backoffLimit": 0, "restartBackoff": BACKOFF},
        )
        watch = PodWatch(kubectl, namespace, "toobig")
        try:
            kubectl.apply(manifest, "-n", namespace)
            pending = wait_unschedulable(kubectl, namespace, "toobig", "3/3")
            again = wait_unschedulable(kubectl, namespace, "toobig", "3/3", attempt=1)
        finally:
            events = watch.stop()

    # All three unschedulable (without a gang scheduler two are bound and one is): none was bound.
    assert pending["state"] == "Pending"
    assert again["restarts"] == {"scheduling": 1}
    assert again["lastRestartReason"] == "ScheduleTimeout"
    assert not [pod for _, pod in events if pod["spec"].get("nodeName")], "a pod of the gang was bound"
    first = {str(pod["metadata"]["uid"]) for _, pod in events if attempt_of(pod) == "0"}
    assert len(first) == 3
    assert len(assert_replaced_as_a_gang(events, first)) >= 3  # a whole new gang, after the old one


def holders_over_time(events: WatchEvents) -> list[set[str]]:
    """Replays a pod watch: after each event, the jobs that hold a node with a pod (bound and not yet
    Succeeded or Failed, deleted pods included until they are gone)."""
    holding: dict[str, str] = {}  # pod uid -> job
    samples = []
    for kind, pod in events:
        uid = str(pod["metadata"]["uid"])
        ended = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if kind == "DELETED" or ended or not pod["spec"].get("nodeName"):
            holding.pop(uid, None)
        else:
            holding[uid] = pod["metadata"]["labels"][contract.JOB_NAME_LABEL]
        samples.append(set(holding.values()))
    return samples


def running_whole(kubectl: Kubectl, namespace: str, names: tuple[str, ...]) -> str | None:
    """The one job of `names` that is Running, if one is."""
    running = [name for name in names if status_of(kubectl, namespace, name).get("state") == "Running"]
    assert len(running) <= 1, f"both jobs Running at once: {running}"
    return running[0] if running else None


@pytest.mark.slow
def test_two_gangs_that_cannot_both_fit_run_one_after_the_other(
    coscheduling: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """Two jobs that each need 75% of the pool's GPUs (3 workers x 8 GPUs of 4 nodes x 8). Scheduled
    pod by pod they could each get part of the pool and wait for each other for ever. With the
    coscheduling scheduler, at no moment a pod watch saw do both jobs hold a node: one runs whole,
    and the other starts, whole, once the first has finished."""
    kubectl = coscheduling
    names = ("left", "right")
    with node_pool(kubectl, namespace, 4):
        start_operator()
        watch = PodWatch(kubectl, namespace)
        try:
            for name in names:
                manifest = job_manifest(
                    name,
                    numWorkers=3,
                    gpusPerWorker=8,
                    scheduling=pool_scheduling(namespace, gangScheduling=True),
                )
                kubectl.apply(manifest, "-n", namespace)
            first = wait_for(
                "one job Running", lambda: running_whole(kubectl, namespace, names), timeout=TIMEOUT
            )
            second = next(name for name in names if name != first)
            waiting = wait_unschedulable(kubectl, namespace, second, "3/3")
            for pod in running_pods(kubectl, namespace, first, 0, 3):
                end_pod(kubectl, namespace, pod["metadata"]["name"])
            wait_state(kubectl, namespace, first, "Completed")
            wait_state(kubectl, namespace, second, "Running")
            running_pods(kubectl, namespace, second, 0, 3)
        finally:
            events = watch.stop()

    samples = holders_over_time(events)
    assert all(len(holders) <= 1 for holders in samples), [sorted(h) for h in samples if len(h) > 1][:3]
    # Both held nodes, one after the other: the first, then (after it let go) the second.
    order = [next(iter(holders)) for holders in samples if holders]
    assert order[0] == first
    assert order[-1] == second
    assert order.index(second) > len(order) - 1 - order[::-1].index(first)
    assert waiting["state"] == "Pending"
