"""Queueing TrainingJobs with the real Kueue (v0.17.0, built by hack/ and added to the session's cluster
by the `kueue` fixture): quotas, waiting, admission into a flavor, preemption, quota released.

Each test has its own capacity (two private 8-GPU nodes) and its own queues (tests/e2e/kueue_support.py):
a ResourceFlavor for those nodes, a ClusterQueue with a 16-GPU quota and a LocalQueue. The jobs say
nothing about where to run: that their pods land on the private nodes shows the admitted flavor's node
labels and tolerations were put on them. The operator runs with the rights deploy/ grants it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crd import contract
from testbed import Kubectl, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    condition,
    get_job,
    pods_of,
    reconciled_versions,
    status_of,
    wait_for_events,
    write_requests,
)
from tests.e2e.kueue_support import (
    LOCAL_QUEUE,
    finish,
    gpu_queue,
    is_true,
    pool_toleration,
    queued_job,
    waiting,
    workload_of,
    workload_priority_classes,
)
from tests.e2e.lifecycle_support import (
    POOL_KEY,
    env_value,
    node_pool,
    report_progress,
    running_pods,
    trainer_kubectl,
    wait_state,
    wait_status,
)
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]


def touch(kubectl: Kubectl, operator: OperatorProcess, namespace: str, name: str, value: str) -> str:
    """Changes a label of the job (nothing the operator acts on) and waits for the reconcile of the
    version that made; returns that resourceVersion."""
    patch = json.dumps({"metadata": {"labels": {"touched": value}}})
    out = kubectl.run(
        "patch", "trainingjob", name, "-n", namespace, "--type=merge", "-p", patch, "-o", "json"
    )
    version = str(json.loads(out)["metadata"]["resourceVersion"])
    wait_for(
        f"a reconcile of {name} at {version}",
        lambda: version in reconciled_versions(operator, namespace, name),
    )
    return version


def assert_no_writes_when_reconciled(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, name: str
) -> None:
    """Reconciled again (a label touched), the waiting job writes nothing: no status, no object."""
    touch(kubectl, operator, namespace, name, "1")
    writes = write_requests(operator)
    version = touch(kubectl, operator, namespace, name, "2")
    assert write_requests(operator) == writes
    assert get_job(kubectl, namespace, name)["metadata"]["resourceVersion"] == version


# ----------------------------------------------------------------------------------- the quota


def test_two_of_three_8_gpu_jobs_run_in_16_gpus_and_the_third_is_admitted_when_one_finishes(
    kueue: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    kubectl = kueue
    with node_pool(kubectl, namespace, 2), gpu_queue(kubectl, namespace, gpus=16) as queues:
        operator = start_operator()
        for name in ("one", "two"):
            kubectl.apply(queued_job(name), "-n", namespace)
            wait_state(kubectl, namespace, name, "Running")
        kubectl.apply(queued_job("three"), "-n", namespace)
        third = waiting(kubectl, namespace, "three", "Pending", "insufficient unused quota")
        table = kubectl.run("get", "trainingjobs", "-n", namespace, "-o", "wide")
        queued_for = operator.metric("trainingjob_queued_seconds", namespace=namespace, training_job="three")
        events = wait_for_events(
            kubectl, namespace, "three", {"Creating": ["Queued: queueing in LocalQueue team"]}
        )
        first_pods = pods_of(kubectl, namespace, "one")

        finish(kubectl, namespace, "one")
        wait_state(kubectl, namespace, "three", "Running")
        finished = wait_for(
            "one's Workload Finished", lambda: is_true(workload_of(kubectl, namespace, "one"), "Finished")
        )
        admitted = status_of(kubectl, namespace, "three")
        third_pods = running_pods(kubectl, namespace, "three", 0, 1)
        waits = operator.metric(
            "trainingjob_queue_wait_seconds_count", namespace=namespace, cluster_queue=queues.cluster_queue
        )

    # The third waits, and says where and why, in status, `kubectl get`, its condition and an Event.
    assert third["message"] == (
        f"waiting in LocalQueue {LOCAL_QUEUE}: couldn't assign flavors to pod set workers: insufficient "
        f"unused quota for nvidia.com/gpu in flavor {queues.flavor}, 8 more needed"
    )
    admitted_condition = condition(third, "Admitted")
    assert admitted_condition is not None
    assert admitted_condition["status"] == "False"
    assert third["queue"]["name"] == LOCAL_QUEUE
    assert third["workers"]["active"] == 0
    line = next(row for row in table.splitlines() if row.startswith("three "))
    assert " Queued " in line
    assert f" {LOCAL_QUEUE} " in line
    assert "waiting in LocalQueue team" in line
    assert [e["type"] for e in events if e["reason"] == "Creating"] == ["Normal"]
    assert queued_for is not None
    assert queued_for >= 0
    # Admitted: the flavor's node labels and tolerations put the pods on the pool (the job sets none).
    for pod in [*first_pods, *third_pods]:
        assert pod["spec"]["nodeSelector"] == {POOL_KEY: namespace}
        assert pool_toleration(namespace) in pod["spec"]["tolerations"]
        assert pod["spec"]["nodeName"]
    assert admitted["queue"]["clusterQueue"] == queues.cluster_queue
    assert admitted["queue"]["flavors"] == {contract.GPU_RESOURCE: queues.flavor}
    assert finished
    assert waits == 3


def test_a_high_priority_job_preempts_a_low_one_which_resumes_from_its_checkpoint(
    kueue: Kubectl, namespace: str, start_operator: StartOperator, tmp_path: Path
) -> None:
    kubectl = kueue
    checkpoint = "/checkpoints/epoch-2.pt"
    with (
        node_pool(kubectl, namespace, 2),
        gpu_queue(kubectl, namespace, gpus=16),
        workload_priority_classes(kubectl, low=10, high=1000) as classes,
    ):
        operator = start_operator()
        kubectl.apply(queued_job("low", priority=classes["low"], numWorkers=2), "-n", namespace)
        wait_state(kubectl, namespace, "low", "Running")
        trainer = trainer_kubectl(kubectl, namespace, "low", tmp_path)  # rank 0's own bound token
        report_progress(trainer, namespace, "low-worker-0", {"epoch": 2, "checkpoint": checkpoint})
        wait_status(
            kubectl,
            namespace,
            "low",
            "the checkpoint recorded",
            lambda s: (s.get("checkpoint") or {}).get("latest") == checkpoint,
        )
        before = {pod["metadata"]["uid"] for pod in pods_of(kubectl, namespace, "low")}

        kubectl.apply(queued_job("high", priority=classes["high"], numWorkers=2), "-n", namespace)
        preempted = waiting(
            kubectl, namespace, "low", "Preempted", "evicted by Kueue: Preempted to accommodate"
        )
        wait_state(kubectl, namespace, "high", "Running")
        workload = workload_of(kubectl, namespace, "high")
        warnings = wait_for_events(kubectl, namespace, "low", {"Preempted": ["Queued: evicted by Kueue"]})

        finish(kubectl, namespace, "high")
        resumed = wait_status(
            kubectl,
            namespace,
            "low",
            "attempt 1 Running",
            lambda s: (s.get("state"), s.get("attempt")) == ("Running", 1),
        )
        pods = running_pods(kubectl, namespace, "low", 1, 2)
        evictions = operator.metric("trainingjob_evictions_total", namespace=namespace, reason="Preempted")

    assert workload is not None
    assert workload["spec"]["priority"] == 1000
    group, kind = contract.WORKLOAD_PRIORITY_CLASS_REF
    assert workload["spec"]["priorityClassRef"] == {"group": group, "kind": kind, "name": classes["high"]}
    # Preempted: pods gone, waiting again; neither a restart nor a failure.
    assert preempted["restartCount"] == 0
    assert preempted.get("restarts", {}) == {}
    assert preempted["queue"]["evictions"] == 1
    assert [e["type"] for e in warnings if e["reason"] == "Preempted"] == ["Warning"]
    # Admitted again: a new attempt from the latest checkpoint, restartCount unchanged.
    assert resumed["restartCount"] == 0
    assert resumed["queue"]["admissions"] == 2
    assert resumed["checkpoint"]["latest"] == checkpoint
    assert not before & {pod["metadata"]["uid"] for pod in pods}
    assert [env_value(pod, "RESUME_FROM") for pod in pods] == [checkpoint, checkpoint]
    assert evictions == 1


def test_quota_is_released_when_a_job_is_suspended_or_deleted(
    kueue: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    kubectl = kueue
    with node_pool(kubectl, namespace, 2), gpu_queue(kubectl, namespace, gpus=16):
        start_operator()
        for name in ("a", "b"):
            kubectl.apply(queued_job(name), "-n", namespace)
            wait_state(kubectl, namespace, name, "Running")
        kubectl.apply(queued_job("c"), "-n", namespace)
        waiting(kubectl, namespace, "c", "Pending")

        kubectl.run(
            "patch", "trainingjob", "a", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
        )
        wait_state(kubectl, namespace, "c", "Running")
        suspended = wait_state(kubectl, namespace, "a", "Suspended")
        workload_gone = wait_for("a's Workload deleted", lambda: workload_of(kubectl, namespace, "a") is None)

        kubectl.apply(queued_job("d"), "-n", namespace)
        waiting(kubectl, namespace, "d", "Pending")
        kubectl.run("delete", "trainingjob", "b", "-n", namespace, "--wait=false")
        # The Workload goes with the job (garbage collection), and with it the quota.
        wait_state(kubectl, namespace, "d", "Running", timeout=180)

        kubectl.run(
            "patch", "trainingjob", "a", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
        )
        requeued = waiting(kubectl, namespace, "a", "Pending")

    assert workload_gone
    assert suspended["status"]["message"] == "suspended"
    assert requeued["queue"]["name"] == LOCAL_QUEUE


# ---------------------------------------------------------------------------------- bad input


def test_a_queue_that_does_not_exist_or_goes_away_is_said_and_waited_for_without_writes(
    kueue: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    kubectl = kueue
    with node_pool(kubectl, namespace, 1), gpu_queue(kubectl, namespace, gpus=8):
        operator = start_operator()
        kubectl.apply(queued_job("lost", queue="nope"), "-n", namespace)
        lost = waiting(kubectl, namespace, "lost", "Inadmissible", "LocalQueue nope doesn't exist")
        warnings = wait_for_events(
            kubectl, namespace, "lost", {"Inadmissible": ["LocalQueue nope doesn't exist"]}
        )
        assert_no_writes_when_reconciled(kubectl, operator, namespace, "lost")

        kubectl.apply(queued_job("first"), "-n", namespace)
        wait_state(kubectl, namespace, "first", "Running")
        kubectl.apply(queued_job("orphan"), "-n", namespace)
        waiting(kubectl, namespace, "orphan", "Pending")
        kubectl.run("delete", "localqueue", LOCAL_QUEUE, "-n", namespace)
        orphan = waiting(
            kubectl, namespace, "orphan", "Inadmissible", f"LocalQueue {LOCAL_QUEUE} doesn't exist"
        )
        first = status_of(kubectl, namespace, "first")

    assert lost["message"] == "waiting in LocalQueue nope: LocalQueue nope doesn't exist"
    assert [e["type"] for e in warnings if e["reason"] == "Inadmissible"] == ["Warning"]
    assert orphan["queue"]["name"] == LOCAL_QUEUE
    assert first["state"] == "Running"  # an admitted job runs on without its LocalQueue
    assert operator.alive()


def test_a_workload_deleted_by_hand_is_replaced_and_the_job_queued_again(
    kueue: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    kubectl = kueue
    with node_pool(kubectl, namespace, 1), gpu_queue(kubectl, namespace, gpus=8):
        start_operator()
        kubectl.apply(queued_job("solo"), "-n", namespace)
        wait_state(kubectl, namespace, "solo", "Running")
        old = workload_of(kubectl, namespace, "solo")
        assert old is not None
        kubectl.run("delete", "workload", old["metadata"]["name"], "-n", namespace)
        again = wait_status(
            kubectl,
            namespace,
            "solo",
            "attempt 1 Running",
            lambda s: (s.get("state"), s.get("attempt")) == ("Running", 1),
        )
        new = workload_of(kubectl, namespace, "solo")
        events = wait_for_events(
            kubectl, namespace, "solo", {"WorkloadDeleted": ["was deleted while the job ran"]}
        )

        kubectl.apply(queued_job("waiter"), "-n", namespace)
        waiting(kubectl, namespace, "waiter", "Pending")
        kubectl.run("delete", "workload", "-n", namespace, "-l", f"{contract.JOB_NAME_LABEL}=waiter")
        wait_for_events(kubectl, namespace, "waiter", {"WorkloadDeleted": ["was deleted; queueing again"]})
        waiting(kubectl, namespace, "waiter", "Pending")
        recreated = workload_of(kubectl, namespace, "waiter")

    assert new is not None
    assert new["metadata"]["name"] == old["metadata"]["name"]
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert (again["restartCount"], again["queue"]["evictions"]) == (0, 1)
    assert [e["type"] for e in events if e["reason"] == "WorkloadDeleted"] == ["Warning"]
    assert recreated is not None
