"""Scheduling and infrastructure end to end: schedule timeout, node loss, gang scheduling.

These tests touch capacity and nodes, which the dev cluster shares with every other test running at
the same time, so they bring their own: `node_pool` adds tainted kwok nodes that only the test's jobs
tolerate (and removes them afterwards), so filling their GPUs or losing one of them disturbs nobody.
The gang-scheduling tests run on the real scheduler-plugins scheduler with its coscheduling plugin
and its PodGroup CRD (the `coscheduling` fixture adds them to the session's cluster); the operator
looks for the PodGroup API at start-up. The test of a cluster without a gang scheduler takes that
CRD away for its duration.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from crd import contract
from tests.cluster import Kubectl, end_pod, optional_api_withdrawn, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    PodWatch,
    condition,
    event_messages,
    events_of,
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
    lost_node,
    node_pool,
    pool_scheduling,
    retried,
    running_pods,
    uids,
    wait_state,
    wait_status,
    when,
)

JsonDict = dict[str, Any]
BACKOFF = {"initialDelaySeconds": 1, "maxDelaySeconds": 2}
GPU = contract.GPU_RESOURCE


def wait_unschedulable(
    kubectl: Kubectl, namespace: str, name: str, pods: str, *, attempt: int | None = None
) -> JsonDict:
    """Waits until the job says `<pods> pods unschedulable: <the scheduler's reason>` (pods: "1/3"),
    in attempt `attempt` if given; returns the status."""
    prefix = f"{pods} pods unschedulable: "
    return wait_status(
        kubectl,
        namespace,
        name,
        prefix + (f"(attempt {attempt})" if attempt is not None else ""),
        lambda s: (
            str(s.get("message", "")).startswith(prefix) and (attempt is None or s.get("attempt") == attempt)
        ),
    )


# ------------------------------------------------------------------------------ scheduling timeout


@pytest.mark.slow
def test_a_gang_that_cannot_be_scheduled_in_time_is_released_and_retried(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """3 workers x 8 GPUs on 2 nodes of 8: one worker never fits. After scheduleTimeoutSeconds all
    pods are deleted (the two scheduled ones free their GPUs), and the job backs off and tries again;
    backoffLimit 0 shows a scheduling timeout is not counted as a failure."""
    timeout = 3
    with node_pool(kubectl, namespace, 2):
        start_operator()
        manifest = job_manifest(
            "toobig",
            numWorkers=3,
            gpusPerWorker=8,
            scheduling=pool_scheduling(namespace, scheduleTimeoutSeconds=timeout),
            failurePolicy={"backoffLimit": 0, "restartBackoff": BACKOFF},
        )
        watch = PodWatch(kubectl, namespace, "toobig")
        try:
            kubectl.apply(manifest, "-n", namespace)
            pending = wait_unschedulable(kubectl, namespace, "toobig", "1/3")
            first = pods_of(kubectl, namespace, "toobig")
            during = wait_status(
                kubectl, namespace, "toobig", "Restarting", lambda s: s.get("state") == "Restarting"
            )
            again = wait_unschedulable(kubectl, namespace, "toobig", "1/3", attempt=1)
        finally:
            events = watch.stop()

        # Before the timeout: the scheduler's reason on the job.
        assert pending["state"] == "Pending"
        assert "Insufficient nvidia.com/gpu" in pending["message"], pending["message"]
        running = condition(pending, "Running")
        assert running is not None
        assert (running["status"], running["reason"]) == ("False", "PodsUnschedulable")

        # The timeout: every pod released, counted under scheduling, the reason in status.
        assert during["restarts"] == {"scheduling": 1}
        assert during["lastRestartReason"] == "ScheduleTimeout"
        cond = condition(during, "Restarting")
        assert cond is not None
        assert (cond["status"], cond["reason"]) == ("True", "ScheduleTimeout")
        for fragment in (
            "1/3 pods unschedulable: ",
            "Insufficient nvidia.com/gpu",
            f"(scheduling.scheduleTimeoutSeconds {timeout}); releasing all pods",
        ):
            assert fragment in cond["message"], cond["message"]
        waited = (when(cond["lastTransitionTime"]) - when(during["attemptStartTime"])).total_seconds()
        assert waited >= timeout
        wait_for_events(
            kubectl, namespace, "toobig", {"ScheduleTimeout": ["Restarting: 1/3 pods unschedulable"]}
        )

        # The retry: a whole new gang, created only after the old one was gone; still not a failure.
        assert len(first) == 3
        created = assert_replaced_as_a_gang(events, uids(first))
        assert len(created) == 3
        assert min(created) >= when(during["restartAt"])  # after the backoff
        assert again["state"] == "Pending"
        assert again["restarts"].get("failure", 0) == 0
        assert "failureReason" not in again
        status = wait_status(
            kubectl,
            namespace,
            "toobig",
            "a second scheduling restart",
            lambda s: s.get("restarts", {}).get("scheduling", 0) >= 2,
        )
        assert status["state"] in ("Restarting", "Pending")
        assert set(status["restarts"]) == {"scheduling"}


# ---------------------------------------------------------------------------------------- node loss


@pytest.mark.slow
def test_a_lost_node_restarts_the_gang_as_a_disruption_and_its_stuck_pod_is_force_deleted(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    force_after = 5
    with node_pool(kubectl, namespace, 3) as nodes:
        start_operator(f"--force-delete-after={force_after}", "--node-lost-after=2")
        manifest = job_manifest(
            "nodeloss",
            numWorkers=2,
            gpusPerWorker=8,
            scheduling=pool_scheduling(namespace),
            failurePolicy={"backoffLimit": 0, "restartBackoff": BACKOFF},
        )
        kubectl.apply(manifest, "-n", namespace)
        wait_state(kubectl, namespace, "nodeloss", "Running")
        old = running_pods(kubectl, namespace, "nodeloss", 0, 2)
        victim = old[1]["spec"]["nodeName"]
        assert victim in nodes

        with lost_node(kubectl, victim):
            during = wait_status(
                kubectl, namespace, "nodeloss", "Restarting", lambda s: s.get("state") == "Restarting"
            )
            # The pod on the lost node cannot finish terminating: no kubelet confirms it.
            stuck = wait_for(
                "nodeloss-worker-1 terminating",
                lambda: next(
                    (
                        pod
                        for pod in pods_of(kubectl, namespace, "nodeloss")
                        if pod["metadata"]["uid"] == old[1]["metadata"]["uid"]
                        and pod["metadata"].get("deletionTimestamp")
                    ),
                    None,
                ),
            )
            status = wait_status(
                kubectl,
                namespace,
                "nodeloss",
                "attempt 1 Running",
                lambda s: (s.get("state"), s.get("attempt")) == ("Running", 1),
            )
            new = running_pods(kubectl, namespace, "nodeloss", 1, 2)

        assert during["restarts"] == {"disruption": 1}
        assert during["lastRestartReason"] == "NodeLost"
        cond = condition(during, "Restarting")
        assert cond is not None
        assert (cond["status"], cond["reason"]) == ("True", "NodeLost")
        assert f"pod nodeloss-worker-1, reason NodeLost: node {victim} is not ready" in cond["message"]
        assert stuck["spec"]["nodeName"] == victim

        # Force-deleted, and not before --force-delete-after (Event times have whole seconds).
        forced = [
            event
            for event in events_of(kubectl, namespace, "nodeloss")
            if event["reason"] == "SuccessfulDelete" and event["message"].startswith("Force-deleted pod: ")
        ]
        assert [event["message"] for event in forced] == [
            f"Force-deleted pod: nodeloss-worker-1 (stuck terminating on lost node {victim})"
        ]
        assert (
            when(forced[0]["firstTimestamp"]) - when(cond["lastTransitionTime"])
        ).total_seconds() >= force_after - 1

        # The new gang runs on the nodes that are left; a disruption, not a failure (backoffLimit 0).
        assert status["restartCount"] == 1
        assert status["restarts"] == {"disruption": 1}
        assert not uids(old) & uids(new)
        assert victim not in {pod["spec"]["nodeName"] for pod in new}


# ---------------------------------------------------------------------------------------- preemption


@contextlib.contextmanager
def preempting_priority_class(kubectl: Kubectl, name: str) -> Iterator[str]:
    """A PriorityClass that may preempt, deleted afterwards. Only pods of the test's node pool use it,
    and only the test's jobs run there, so it can preempt nothing of anyone else."""
    manifest = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/created-by": "trainingjob-e2e"}},
        "value": 1000000,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": "created by the trainingjob-operator end-to-end tests",
    }
    kubectl.run("create", "-f", "-", stdin=json.dumps(manifest))
    try:
        yield name
    finally:
        retried(
            f"PriorityClass {name} deleted",
            functools.partial(
                kubectl.run, "delete", "priorityclass", name, "--ignore-not-found", "--wait=false"
            ),
        )


def gpu_pod(name: str, namespace: str, priority_class: str, gpus: int) -> JsonDict:
    scheduling = pool_scheduling(namespace)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "priorityClassName": priority_class,
            "nodeSelector": scheduling["nodeSelector"],
            "tolerations": scheduling["tolerations"],
            "containers": [
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}},
                }
            ],
        },
    }


@pytest.mark.slow
def test_preemption_by_the_scheduler_restarts_the_gang_as_a_disruption(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """A higher-priority pod needs a node of the job's: the real scheduler preempts one worker
    (DisruptionTarget PreemptionByScheduler), and the job restarts the gang without using its
    backoffLimit (0). The new gang waits for GPUs until the preemptor goes."""
    with (
        node_pool(kubectl, namespace, 2),
        preempting_priority_class(kubectl, f"tj-e2e-preempt-{namespace[-6:]}") as priority,
    ):
        start_operator()
        manifest = job_manifest(
            "victim",
            numWorkers=2,
            gpusPerWorker=8,
            scheduling=pool_scheduling(namespace),
            failurePolicy={"backoffLimit": 0, "restartBackoff": BACKOFF},
        )
        kubectl.apply(manifest, "-n", namespace)
        wait_state(kubectl, namespace, "victim", "Running")
        old = running_pods(kubectl, namespace, "victim", 0, 2)

        kubectl.run("create", "-f", "-", stdin=json.dumps(gpu_pod("preemptor", namespace, priority, 8)))
        during = wait_status(
            kubectl, namespace, "victim", "Restarting", lambda s: s.get("state") == "Restarting"
        )
        wait_for(
            "the preemptor running",
            lambda: (
                (kubectl.get_json("pod", "preemptor", "-n", namespace).get("status") or {}).get("phase")
                == "Running"
            ),
        )
        waiting = wait_unschedulable(kubectl, namespace, "victim", "1/2", attempt=1)
        kubectl.run("delete", "pod", "preemptor", "-n", namespace, "--wait=false")
        status = wait_status(
            kubectl,
            namespace,
            "victim",
            "attempt 1 Running",
            lambda s: (s.get("state"), s.get("attempt")) == ("Running", 1),
        )
        new = running_pods(kubectl, namespace, "victim", 1, 2)

    assert during["restarts"] == {"disruption": 1}
    assert during["lastRestartReason"] == "PreemptionByScheduler"
    cond = condition(during, "Restarting")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "PreemptionByScheduler")
    assert "Insufficient nvidia.com/gpu" in waiting["message"]
    assert (status["restartCount"], status["restarts"]) == (1, {"disruption": 1})
    assert not uids(old) & uids(new)


# --------------------------------------------------------------------------------- gang scheduling

POD_GROUP_CRD = "podgroups.scheduling.x-k8s.io"


@contextlib.contextmanager
def pod_group_api_withdrawn(kubectl: Kubectl) -> Iterator[None]:
    """No PodGroup API served for the block, as on a cluster without a gang scheduler.

    When the session's cluster runs the coscheduling component (an earlier test asked for it), its
    PodGroup CRD is deleted for the block (with every PodGroup in the cluster: tests run one at a
    time) and put back afterwards, and the second scheduler restarted so that its PodGroup informer
    starts afresh instead of sitting out its relist backoff."""
    with optional_api_withdrawn(
        kubectl,
        "coscheduling",
        POD_GROUP_CRD,
        contract.COSCHEDULING_GROUP_VERSION,
        {"podgroups"},
        restart=True,
    ):
        yield


def scheduled_by(kubectl: Kubectl, namespace: str, count: int) -> dict[str, str] | None:
    """Once `count` pods were bound: pod name -> the scheduler that reported binding it (the Scheduled
    events' reporting component)."""
    found = {
        event["involvedObject"]["name"]: event.get("reportingComponent", "")
        for event in kubectl.items("events", "-n", namespace)
        if event["reason"] == "Scheduled"
    }
    return found if len(found) == count else None


def test_gang_scheduling_creates_a_pod_group_that_the_coscheduling_scheduler_binds(
    coscheduling: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """The operator sees the real PodGroup CRD at start, creates a PodGroup the CRD's schema accepts,
    and hands the pods to the second scheduler, which binds the whole gang."""
    kubectl = coscheduling
    with node_pool(kubectl, namespace, 2):
        start_operator()
        scheduling = pool_scheduling(namespace, gangScheduling=True)
        kubectl.apply(
            job_manifest("gang", numWorkers=3, gpusPerWorker=4, scheduling=scheduling), "-n", namespace
        )
        group = wait_for("PodGroup gang", lambda: kubectl.get_or_none(POD_GROUP_CRD, "gang", "-n", namespace))
        job = kubectl.get_json("trainingjob", "gang", "-n", namespace)
        status = wait_state(kubectl, namespace, "gang", "Running")["status"]
        pods = running_pods(kubectl, namespace, "gang", 0, 3)
        binders = wait_for("three Scheduled events", lambda: scheduled_by(kubectl, namespace, 3))
        events = events_of(kubectl, namespace, "gang")

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
