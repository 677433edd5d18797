"""Faults on the real node, and how the operator classifies them: what a real kubelet and cgroup report.

Why: classification (docs/accounting.md, failurePolicy in docs/api.md) decides whether a job spends its
backoffLimit, and until the real node it was only ever shown with statuses written by tests. Here the
kubelet, containerd and the kernel produce them: an OOM kill by the container's memory cgroup (exit
137, OOMKilled), an exit 1, an eviction through the Eviction API and a `kubectl drain` (the kubelet's
SIGTERM with the pod's grace period), an image the node does not have, containerd restarted under
running containers, the kubelet stopped mid-training (the node goes NotReady), and a job asking for
more GPUs than the node has. Each: a clear condition or message, nothing counted wrongly, no restart
loop.
"""

from __future__ import annotations

from typing import Any

import pytest

from testbed import Kubectl, wait_for
from tests.cluster import dev_cluster
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import events_of, job_manifest, pods_of, status_of, wait, wait_for_state
from tests.e2e.realnode import NODE, evict, job_on_node

JsonDict = dict[str, Any]

pytestmark = pytest.mark.slow

# A few short epochs of the reference trainer with real torch: long enough to disturb it mid-training.
PACE = {"TRAIN_STEPS_PER_EPOCH": "4", "TRAIN_STEP_SECONDS": "0.5", "TRAIN_PROGRESS_INTERVAL": "0"}
HOG = "x = bytearray(600 * 1024 * 1024)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\n"


def training(name: str, epochs: int, **spec: Any) -> JsonDict:
    """The reference trainer on the real node: two workers, checkpoints every epoch on a claim."""
    job = job_manifest(
        name,
        hyperparameters={"epochs": epochs},
        checkpoint={
            "enabled": True,
            "storage": {"type": "pvc", "pvc": {"create": {"whenDeleted": "Delete"}}},
        },
        env=[{"name": key, "value": value} for key, value in PACE.items()],
        **spec,
    )
    return job_on_node(job)


def restarts(status: JsonDict) -> JsonDict:
    return dict(status.get("restarts") or {})


def wait_epoch(kubectl: Kubectl, namespace: str, name: str, epoch: int, timeout: float = 300) -> JsonDict:
    def probe() -> JsonDict | None:
        status = status_of(kubectl, namespace, name)
        return (
            status
            if status.get("state") == "Running" and int(status.get("currentEpoch") or 0) >= epoch
            else None
        )

    return wait(f"{name} past epoch {epoch}", probe, timeout=timeout)


def test_an_oom_kill_is_retried_and_an_exit_1_fails_the_job_under_exit_code_rules(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    policy = {"restartPolicy": "ExitCode", "backoffLimit": 1, "restartBackoff": {"initialDelaySeconds": 0}}
    hog = job_on_node(
        job_manifest("hog", numWorkers=1, image="python:3.11-slim", command=["python3", "-c", HOG]),
        memory="128Mi",
    )
    hog["spec"]["failurePolicy"] = policy
    fails = job_on_node(
        job_manifest(
            "fails", numWorkers=1, image="python:3.11-slim", command=["python3", "-c", "raise SystemExit(1)"]
        ),
        memory="64Mi",
    )
    fails["spec"]["failurePolicy"] = policy
    real_node.apply(hog, "-n", namespace)
    real_node.apply(fails, "-n", namespace)

    # Exit 1 is the application's verdict: the job fails at once, no restart.
    failed = wait_for_state(real_node, namespace, "fails", "Failed", timeout=180)["status"]
    assert failed["restartCount"] == 0
    assert "exit code 1" in failed["message"], failed["message"]
    # The cgroup's OOM kill (137, OOMKilled) is retried: one restart, then the backoff limit.
    oom = wait_for_state(real_node, namespace, "hog", "Failed", timeout=300)["status"]
    assert restarts(oom) == {"failure": 1}
    assert oom["failureReason"] == "BackoffLimitExceeded"
    assert "exit code 137, reason OOMKilled" in oom["message"], oom["message"]


def test_an_eviction_and_a_drain_are_disruptions_that_spend_no_backoff_limit(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    job = training("evicted", epochs=12, failurePolicy={"backoffLimit": 0})
    real_node.apply(job, "-n", namespace)
    wait_epoch(real_node, namespace, "evicted", 1)

    evict(real_node, namespace, "evicted-worker-1")

    def disruptions(count: int) -> JsonDict | None:
        status = status_of(real_node, namespace, "evicted")
        return status if restarts(status).get("disruption", 0) >= count else None

    status = wait("a disruption restart after the eviction", lambda: disruptions(1), timeout=240)
    assert restarts(status) == {"disruption": 1}
    assert status["lastRestartReason"] == "EvictionByEvictionAPI"

    wait_epoch(real_node, namespace, "evicted", int(status.get("currentEpoch") or 0) + 1)
    drained = real_node.attempt(
        "drain", NODE, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s"
    )
    try:
        assert drained.returncode == 0, drained.stderr
        waiting = wait("a second disruption restart after the drain", lambda: disruptions(2), timeout=180)
        assert waiting["lastRestartReason"] == "EvictionByEvictionAPI"
    finally:
        real_node.run("uncordon", NODE)
    done = wait_for_state(real_node, namespace, "evicted", "Completed", timeout=600)["status"]
    assert restarts(done) == {"disruption": 2}
    assert done["currentEpoch"] == 12


def test_a_missing_image_says_so_and_does_not_restart(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    job = job_on_node(
        job_manifest("imageless", numWorkers=2, image="trainingjob-dev/not-built-here:1"), memory="64Mi"
    )
    real_node.apply(job, "-n", namespace)

    def stuck() -> JsonDict | None:
        status = status_of(real_node, namespace, "imageless")
        return status if "ImagePullBackOff" in str(status.get("message")) else None

    status = wait("the kubelet's back-off in the job's message", stuck, timeout=180)
    assert status["state"] == "Initializing"
    assert "imageless-worker-" in status["message"]
    first = {
        pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods_of(real_node, namespace, "imageless")
    }
    # The kubelet keeps retrying on its own back-off; the operator neither restarts nor fails the job.
    wait_for(
        "another pull attempt by the kubelet",
        lambda: any(
            e.get("reason") == "Failed" and int(e.get("count") or 1) >= 2
            for e in real_node.items("events", "-n", namespace, "--field-selector", "involvedObject.kind=Pod")
        ),
        timeout=120,
    )
    later = status_of(real_node, namespace, "imageless")
    assert (later["state"], later.get("restartCount", 0)) == ("Initializing", 0)
    assert {
        pod["metadata"]["name"]: pod["metadata"]["uid"] for pod in pods_of(real_node, namespace, "imageless")
    } == first
    reasons = [e["reason"] for e in events_of(real_node, namespace, "imageless") if e["type"] == "Warning"]
    assert reasons.count("ImagePullBackOff") <= 1, reasons
    condition = {c["type"]: c for c in later["conditions"]}
    assert (
        "ImagePullBackOff" in condition["Running"]["message"]
        or "ErrImagePull" in condition["Running"]["message"]
    )


def test_more_gpus_than_the_node_has_is_the_schedulers_message(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    job = job_on_node(
        job_manifest("greedy", numWorkers=1, gpusPerWorker=16, image="python:3.11-slim"), memory="64Mi"
    )
    real_node.apply(job, "-n", namespace)

    def unschedulable() -> JsonDict | None:
        status = status_of(real_node, namespace, "greedy")
        return status if "Insufficient nvidia.com/gpu" in str(status.get("message")) else None

    status = wait("the scheduler's message in the job's status", unschedulable, timeout=120)
    assert status.get("restartCount", 0) == 0
    [pod] = pods_of(real_node, namespace, "greedy")
    assert pod["status"]["phase"] == "Pending"


def test_containerd_restarted_under_running_trainers_loses_nothing(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    real_node.apply(training("steady", epochs=10), "-n", namespace)
    wait_epoch(real_node, namespace, "steady", 1)
    before = {
        p["metadata"]["name"]: p["status"]["containerStatuses"][0]["containerID"]
        for p in pods_of(real_node, namespace, "steady")
    }
    dev_cluster("restart", "containerd")
    done = wait_for_state(real_node, namespace, "steady", "Completed", timeout=600)["status"]
    assert (done["currentEpoch"], done.get("restartCount", 0)) == (10, 0)
    after = {
        p["metadata"]["name"]: p["status"]["containerStatuses"][0]["containerID"]
        for p in pods_of(real_node, namespace, "steady")
    }
    assert after == before


def test_the_kubelet_stopped_mid_training_is_a_lost_node_and_a_disruption(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    # The node is lost once it has been NotReady for --node-lost-after; the controller manager marks it
    # NotReady after its grace period (2 minutes on the dev cluster).
    start_operator("--progress-interval=0", "--node-lost-after=10s", "--force-delete-after=10s")
    real_node.apply(training("orphaned", epochs=6), "-n", namespace)
    wait_epoch(real_node, namespace, "orphaned", 1)
    dev_cluster("stop", "kubelet")
    try:

        def lost() -> JsonDict | None:
            status = status_of(real_node, namespace, "orphaned")
            return status if restarts(status).get("disruption") else None

        status = wait("the gang restarted as a disruption", lost, timeout=420)
        assert restarts(status) == {"disruption": 1}
        assert status["lastRestartReason"] == "NodeLost"
    finally:
        dev_cluster("start", "kubelet")
    done = wait_for_state(real_node, namespace, "orphaned", "Completed", timeout=600)["status"]
    assert restarts(done) == {"disruption": 1}
    assert done["currentEpoch"] == 6
