"""What a job says when its pods cannot be placed or cannot start, on the real API server and scheduler.

- The Scheduled condition: False with the scheduler's reason while a pod waits for a node (`kubectl
  wait --for=condition=Scheduled=false`), True once every pod of the attempt is bound.
- A private image whose pull Secret does not exist, a ConfigMap key that does not exist: the kubelet
  keeps the pod Pending with the trainer waiting (ErrImagePull, ImagePullBackOff,
  CreateContainerConfigError). No kubelet runs images here (kwok marks pods Running), so the test
  writes what a kubelet would into the pod's status, as tests/cluster.py's end_pod does for exits. The
  job names the pod, the container and the reason in its message and Running condition, records a
  Warning Event per reason, restarts nothing, and the job beside it runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from testbed import Kubectl, now_rfc3339, patch_pod_status
from tests.e2e.jobs import (
    PatientKubectl,
    assert_healthy,
    condition,
    events_of,
    get_job,
    job_manifest,
    pods_of,
    wait,
    wait_for_events,
    wait_for_state,
)
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]


@pytest.fixture
def kubectl(cluster: Kubectl) -> Kubectl:
    return PatientKubectl.of(cluster)


def scheduled(kubectl: Kubectl, namespace: str, name: str) -> JsonDict | None:
    return condition(get_job(kubectl, namespace, name).get("status") or {}, "Scheduled")


def test_the_scheduled_condition_says_whether_every_pod_is_bound(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    # No dev-cluster node has 16 GPUs; every one has 8.
    kubectl.apply(job_manifest("too-big", gpusPerWorker=16), "-n", namespace)
    kubectl.apply(job_manifest("fits", gpusPerWorker=1), "-n", namespace)

    waited = kubectl.attempt(
        "wait", "trainingjob/too-big", "-n", namespace, "--for=condition=Scheduled=false", "--timeout=60s"
    )
    assert waited.returncode == 0, waited.stderr

    def unschedulable() -> JsonDict | None:
        entry = scheduled(kubectl, namespace, "too-big")
        return entry if entry is not None and entry["reason"] == "Unschedulable" else None

    entry = wait("the scheduler's reason on too-big", unschedulable)
    assert entry["status"] == "False"
    assert entry["message"].startswith("2/2 pods unschedulable: 0/")
    assert "Insufficient nvidia.com/gpu" in entry["message"]

    waited = kubectl.attempt(
        "wait", "trainingjob/fits", "-n", namespace, "--for=condition=Scheduled", "--timeout=60s"
    )
    assert waited.returncode == 0, waited.stderr
    bound = scheduled(kubectl, namespace, "fits")
    assert bound is not None
    assert (bound["reason"], bound["message"]) == (
        "AllPodsScheduled",
        "2/2 pods of attempt 0 are bound to nodes",
    )
    assert all(pod["spec"].get("nodeName") for pod in pods_of(kubectl, namespace, "fits"))
    assert_healthy(operator)


def wait_in_kubelet(kubectl: Kubectl, namespace: str, pod: str, reason: str, message: str) -> None:
    """Reports the pod as a kubelet does when its trainer cannot start: Pending, not ready, waiting."""
    now = now_rfc3339()
    not_ready = {"status": "False", "reason": "ContainersNotReady", "lastTransitionTime": now}
    patch = {
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "Ready", **not_ready}, {"type": "ContainersReady", **not_ready}],
            "containerStatuses": [
                {
                    "name": "trainer",
                    "image": "myteam/trainer:1.0",
                    "imageID": "",
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "state": {"waiting": {"reason": reason, "message": message}},
                }
            ],
        }
    }
    patch_pod_status(kubectl, namespace, pod, patch)


@pytest.mark.parametrize(
    ("template", "waits"),
    [
        (
            {"spec": {"imagePullSecrets": [{"name": "absent-credentials"}]}},
            [
                ("ErrImagePull", 'failed to pull image "myteam/trainer:1.0": unauthorized'),
                ("ImagePullBackOff", 'Back-off pulling image "myteam/trainer:1.0"'),
            ],
        ),
        (
            {
                "spec": {
                    "containers": [
                        {
                            "name": "trainer",
                            "env": [
                                {
                                    "name": "SETTING",
                                    "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "absent"}},
                                }
                            ],
                        }
                    ]
                }
            },
            [("CreateContainerConfigError", "couldn't find key absent in ConfigMap {namespace}/settings")],
        ),
    ],
    ids=["image-pull-secret", "configmap-key"],
)
def test_a_trainer_that_cannot_start_is_named_and_nothing_restarts(
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    template: JsonDict,
    waits: list[tuple[str, str]],
) -> None:
    kubectl.apply(job_manifest("stuck", image="myteam/trainer:1.0", podTemplate=template), "-n", namespace)
    wait_for_state(kubectl, namespace, "stuck", "Running", timeout=120)  # kwok runs what cannot run
    uids = {pod["metadata"]["uid"] for pod in pods_of(kubectl, namespace, "stuck")}

    for reason, text in waits:
        message = text.format(namespace=namespace)
        wait_in_kubelet(kubectl, namespace, "stuck-worker-1", reason, message)
        expected = f"1/2 pods running; pod stuck-worker-1: container trainer is waiting: {reason}: {message}"

        def named(reason: str = reason, expected: str = expected) -> JsonDict | None:
            status = get_job(kubectl, namespace, "stuck").get("status") or {}
            running = condition(status, "Running") or {}
            return status if (running.get("reason"), status.get("message")) == (reason, expected) else None

        status = wait(f"the job to name {reason}", named)
        assert status["state"] == "Initializing"
        assert (condition(status, "Running") or {}).get("status") == "False"
        wait_for_events(kubectl, namespace, "stuck", {reason: [expected]})

    # Nothing was restarted, the other job runs, and each reason was announced once.
    kubectl.apply(job_manifest("neighbour"), "-n", namespace)
    wait_for_state(kubectl, namespace, "neighbour", "Running", timeout=120)
    status = get_job(kubectl, namespace, "stuck")["status"]
    assert status.get("restartCount", 0) == 0
    assert {pod["metadata"]["uid"] for pod in pods_of(kubectl, namespace, "stuck")} == uids
    warnings = [e for e in events_of(kubectl, namespace, "stuck") if e["type"] == "Warning"]
    assert sorted((e["reason"], e.get("count", 1)) for e in warnings) == sorted(
        (reason, 1) for reason, _ in waits
    )
    assert_healthy(operator)
