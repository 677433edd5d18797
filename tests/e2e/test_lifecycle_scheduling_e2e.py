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

import pytest

from crd import contract
from testbed import Kubectl, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    PodWatch,
    condition,
    events_of,
    job_manifest,
    pods_of,
    wait_for_events,
)
from tests.e2e.lifecycle_support import (
    assert_replaced_as_a_gang,
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
from tests.e2e.scheduling_support import (
    BACKOFF,
    JsonDict,
    wait_unschedulable,
)

GPU = contract.GPU_RESOURCE


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
