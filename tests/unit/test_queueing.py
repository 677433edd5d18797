"""Queueing with Kueue, decided by controller.planner.plan (queueing.py, admission.py, workloads.py).

A job labelled kueue.x-k8s.io/queue-name is stepped through its life in the fake world of
tests/unit/kueue_world.py, which writes on its Workload what Kueue's controllers write. Every
decision of the queueing state machine is covered: Enqueue (each reason a job waits for), Admit
(first run, and after an eviction from the latest checkpoint), Evict (preemption, deactivation, the
Workload deleted, numWorkers changed), Dequeue; and every write to the Workload: created, patched
while it waits, released after an eviction once the pods are gone, replaced, marked finished,
deleted on suspension. Every resting state is checked to write nothing on a further reconcile.
Waiting and admission are here; eviction and the end of a job in tests/unit/test_queueing_eviction.py.
"""

from __future__ import annotations

from typing import Any

from builders.workload import workload_name
from controller.planner.model import Queueing
from crd import contract
from crd.spec import parse
from tests.unit.kueue_world import (
    CLUSTER_QUEUE,
    FLAVOR,
    FLAVOR_LABELS,
    FLAVOR_TOLERATION,
    QUEUE,
    QUOTA_MESSAGE,
    flavor,
    kueue_world,
)
from tests.unit.lifecycle_world import JOB_UID
from tests.unit.queueing_steps import (
    admitted,
    assert_steady,
    event_reasons,
    pod_creates,
    reason,
    workload_creates,
)

JsonDict = dict[str, Any]
GPU = contract.GPU_RESOURCE


# ------------------------------------------------------------------------------------- waiting


def test_a_queued_job_waits_in_its_queue_behind_a_workload_it_owns() -> None:
    w = kueue_world()
    result = w.step()
    assert w.state == "Queued"
    assert pod_creates(result) == []
    (workload,) = workload_creates(result)
    job = parse(w.job)
    assert (
        workload["metadata"]["name"] == workload_name(job) == f"trainingjob-mnist-{workload_name(job)[-5:]}"
    )
    owners = workload["metadata"]["ownerReferences"]
    assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [("TrainingJob", JOB_UID, True)]
    assert workload["metadata"]["labels"][contract.KUEUE_JOB_UID_LABEL] == JOB_UID
    assert workload["metadata"]["labels"][contract.MANAGED_BY_LABEL] == contract.MANAGED_BY_VALUE
    spec = workload["spec"]
    assert spec["queueName"] == QUEUE
    assert spec["priority"] == 0
    assert "priorityClassName" not in spec
    (pod_set,) = spec["podSets"]
    assert (pod_set["name"], pod_set["count"]) == ("workers", 2)
    (container,) = pod_set["template"]["spec"]["containers"]
    assert container["resources"]["requests"][GPU] == "1"
    assert set(container) <= {"name", "image", "resources", "restartPolicy"}
    assert (
        "finalizers" not in workload["metadata"]
    )  # deleting the job (or the Workload) releases quota at once
    # The supporting objects are made while it waits, so an admitted job starts at once.
    assert {obj["kind"] for obj in result.creates} >= {"ConfigMap", "Service", "ServiceAccount"}

    cond = admitted(w)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "Creating")
    assert w.status["queue"] == {"name": QUEUE}
    assert event_reasons(result) == [("Normal", "Creating")]  # Queued: the first state it is seen in

    w.pending()
    result = w.step()
    assert w.state == "Queued"
    assert w.status["message"] == f"waiting in LocalQueue {QUEUE}: {QUOTA_MESSAGE}"
    assert reason(w) == "Pending"
    assert w.status["queue"] == {"name": QUEUE, "workload": workload_name(job)}
    assert ("Normal", "Pending") in event_reasons(result)
    assert "startTime" not in w.status
    assert "runningSince" not in w.status
    assert_steady(w, 3600)  # no timer runs while queued: nothing to write an hour later


def test_a_job_waits_for_kueue_when_it_is_not_installed_and_queues_once_it_is() -> None:
    w = kueue_world(installed=False)
    result = w.step()
    assert w.state == "Queued"
    assert reason(w) == "KueueNotInstalled"
    assert "kueue.x-k8s.io/queue-name=team-a asks for Kueue" in w.status["message"]
    assert ("Warning", "KueueNotInstalled") in event_reasons(result)
    assert pod_creates(result) == []
    assert workload_creates(result) == []
    assert_steady(w)

    w.install()
    result = w.step()
    assert len(workload_creates(result)) == 1
    assert reason(w) == "Creating"


def test_a_queue_that_does_not_exist_is_said_once_in_a_warning_and_the_job_waits() -> None:
    w = kueue_world()
    w.step()
    w.pending("LocalQueue team-a doesn't exist", reason="Inadmissible")
    result = w.step()
    assert w.state == "Queued"
    assert reason(w) == "Inadmissible"
    assert w.status["message"] == "waiting in LocalQueue team-a: LocalQueue team-a doesn't exist"
    assert event_reasons(result) == [("Warning", "Inadmissible")]
    assert_steady(w)
    # The LocalQueue appears: Kueue says the job waits for quota now.
    w.pending()
    result = w.step()
    assert reason(w) == "Pending"
    assert event_reasons(result) == [("Normal", "Pending")]


def test_a_missing_workload_priority_class_is_reported_and_no_workload_is_made_until_it_exists() -> None:
    w = kueue_world(labels={contract.WORKLOAD_PRIORITY_CLASS_LABEL: "urgent"})
    result = w.step()
    assert reason(w) == "PriorityClassNotFound"
    assert (
        "WorkloadPriorityClass urgent (label kueue.x-k8s.io/priority-class) not found" in w.status["message"]
    )
    assert workload_creates(result) == []
    assert ("Warning", "PriorityClassNotFound") in event_reasons(result)
    assert_steady(w)

    assert w.kueue is not None
    w.kueue = Queueing(
        flavors=w.kueue.flavors,
        workload_priority_classes={"urgent": {"metadata": {"name": "urgent"}, "value": 900}},
    )
    (workload,) = workload_creates(w.step())
    assert {key: workload["spec"][key] for key in ("priority", "priorityClassRef")} == {
        "priority": 900,
        "priorityClassRef": {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "urgent"},
    }


def test_the_priority_comes_from_the_pods_priority_class_else_the_cluster_default() -> None:
    classes = {
        "high": {"metadata": {"name": "high"}, "value": 1000},
        "normal": {"metadata": {"name": "normal"}, "value": 10, "globalDefault": True},
    }
    w = kueue_world({"spec.scheduling.priority": "high"})
    assert w.kueue is not None
    w.kueue = Queueing(flavors=w.kueue.flavors, priority_classes=classes)
    (workload,) = workload_creates(w.step())
    assert workload["spec"]["priority"] == 1000
    assert workload["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io",
        "kind": "PriorityClass",
        "name": "high",
    }

    w = kueue_world()
    w.kueue = Queueing(flavors={FLAVOR: flavor()}, priority_classes=classes)
    (workload,) = workload_creates(w.step())
    assert (workload["spec"]["priority"], workload["spec"]["priorityClassRef"]["name"]) == (10, "normal")

    w = kueue_world({"spec.scheduling.priority": "missing"})
    w.step()
    assert reason(w) == "PriorityClassNotFound"
    assert "PriorityClass missing (spec.scheduling.priority) not found" in w.status["message"]


def test_quota_reserved_but_admission_checks_pending_keeps_the_job_waiting() -> None:
    w = kueue_world()
    w.step()
    w.admit()
    w.workload["status"]["admissionChecks"] = [
        {
            "name": "provisioning",
            "state": "Pending",
            "message": "waiting for capacity",
            "lastTransitionTime": "x",
        }
    ]
    w._conditions(("Admitted", "False", "UnsatisfiedChecks", "The workload has not all checks ready"))
    result = w.step()
    assert w.state == "Queued"
    assert reason(w) == "AdmissionChecksPending"
    assert "admission checks: provisioning (Pending): waiting for capacity" in w.status["message"]
    assert pod_creates(result) == []


# -------------------------------------------------------------------------------------- admitted


def test_an_admitted_job_starts_with_the_flavors_node_labels_and_tolerations() -> None:
    w = kueue_world()
    w.step()
    w.admit()
    result = w.step()
    assert w.state == "Pending"
    cond = admitted(w)
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "Admitted")
    assert cond["message"] == f"admitted by ClusterQueue {CLUSTER_QUEUE} ({FLAVOR} for {GPU})"
    assert w.status["queue"] == {
        "name": QUEUE,
        "workload": workload_name(parse(w.job)),
        "clusterQueue": CLUSTER_QUEUE,
        "flavors": {GPU: FLAVOR},
        "admissions": 1,
    }
    pods = pod_creates(result)
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeSelector"] == FLAVOR_LABELS
        assert FLAVOR_TOLERATION in pod["spec"]["tolerations"]
    assert ("Normal", "Admitted") in event_reasons(result)
    w.start()
    w.step()
    assert w.state == "Running"
    assert_steady(w)


def test_admission_check_updates_and_the_jobs_own_node_selector_reach_the_pods() -> None:
    w = kueue_world({"spec.scheduling.nodeSelector": {"zone": "a"}})
    w.step()
    w.admit()
    w.workload["status"]["admissionChecks"] = [
        {
            "name": "check",
            "state": "Ready",
            "message": "",
            "lastTransitionTime": "x",
            "podSetUpdates": [
                {"name": "workers", "labels": {"reservation": "r1"}, "nodeSelector": {"pool": "reserved"}}
            ],
        }
    ]
    pods = pod_creates(w.step())
    for pod in pods:
        assert pod["spec"]["nodeSelector"] == {"zone": "a", **FLAVOR_LABELS, "pool": "reserved"}
        assert pod["metadata"]["labels"]["reservation"] == "r1"
        assert pod["metadata"]["labels"][contract.JOB_NAME_LABEL] == "mnist"


def test_an_assigned_flavor_not_in_the_cache_is_waited_for() -> None:
    w = kueue_world()
    w.step()
    w.admit(flavor_name="h100")
    result = w.step()
    assert w.state == "Queued"
    assert reason(w) == "FlavorNotFound"
    assert pod_creates(result) == []
    assert w.kueue is not None
    w.kueue = Queueing(flavors={**w.kueue.flavors, "h100": flavor("h100")})
    assert len(pod_creates(w.step())) == 2
