"""Queueing with Kueue, decided by controller.planner.plan (queueing.py, admission.py, workloads.py).

A job labelled kueue.x-k8s.io/queue-name is stepped through its life in the fake world of
tests/unit/kueue_world.py, which writes on its Workload what Kueue's controllers write. Every
decision of the queueing state machine is covered: Enqueue (each reason a job waits for), Admit
(first run, and after an eviction from the latest checkpoint), Evict (preemption, deactivation, the
Workload deleted, numWorkers changed), Dequeue; and every write to the Workload: created, patched
while it waits, released after an eviction once the pods are gone, replaced, marked finished,
deleted on suspension. Every resting state is checked to write nothing on a further reconcile.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from builders.workload import workload_name
from controller.planner import Plan
from controller.planner.model import Queueing
from crd import contract
from crd.spec import parse
from tests.unit.kueue_world import (
    CLUSTER_QUEUE,
    FLAVOR,
    FLAVOR_LABELS,
    FLAVOR_TOLERATION,
    PREEMPTED,
    QUEUE,
    QUOTA_MESSAGE,
    KueueWorld,
    flavor,
    kueue_world,
)
from tests.unit.lifecycle_world import JOB_UID, env_of

JsonDict = dict[str, Any]
GPU = contract.GPU_RESOURCE


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
    assert ("Normal", "Pending") in event_reasons(result)

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
    assert {
        key: workload["spec"][key] for key in ("priority", "priorityClassName", "priorityClassSource")
    } == {
        "priority": 900,
        "priorityClassName": "urgent",
        "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
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
    assert (workload["spec"]["priority"], workload["spec"]["priorityClassName"]) == (1000, "high")
    assert workload["spec"]["priorityClassSource"] == "scheduling.k8s.io/priorityclass"

    w = kueue_world()
    w.kueue = Queueing(flavors={FLAVOR: flavor()}, priority_classes=classes)
    (workload,) = workload_creates(w.step())
    assert (workload["spec"]["priority"], workload["spec"]["priorityClassName"]) == (10, "normal")

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


# -------------------------------------------------------------------------------------- eviction


def test_a_preempted_job_waits_again_without_a_restart_and_resumes_from_its_checkpoint() -> None:
    w = kueue_world({"spec.failurePolicy.backoffLimit": 0})
    running(w)
    w.job["status"]["checkpoint"] = {"latest": "/ckpt/epoch-3.pt", "count": 3}
    w.advance(100)
    w.evict()
    result = w.step()
    assert w.state == "Queued"
    assert reason(w) == "Preempted"
    assert w.status["message"].startswith(f"evicted by Kueue: {PREEMPTED}; waiting in LocalQueue team-a")
    assert sorted(d.name for d in result.deletes if d.kind == "Pod") == ["mnist-worker-0", "mnist-worker-1"]
    assert ("Warning", "Preempted") in event_reasons(result)
    assert (w.status["restartCount"], w.status.get("restarts", {})) == (0, {})
    assert w.status["queue"]["evictions"] == 1
    assert "clusterQueue" not in w.status["queue"]
    assert w.status["activeSeconds"] == 100
    assert "runningSince" not in w.status
    running_cond = w.condition("Running")
    assert running_cond is not None
    assert running_cond["status"] == "False"
    # The quota is held until the pods are gone: nothing written to the Workload yet.
    assert all(patch.kind != "Workload" for patch in result.patches)

    # Pods gone: the admission is released as Kueue's integrations release it.
    w.advance(5)
    version = w.workload["metadata"]["resourceVersion"]
    result = w.step()
    (release,) = [patch for patch in result.patches if patch.kind == "Workload"]
    assert release.subresource == "status"
    assert release.body["status"]["admission"] is None
    conditions = {c["type"]: c for c in release.body["status"]["conditions"]}
    assert (conditions["QuotaReserved"]["status"], conditions["QuotaReserved"]["reason"]) == (
        "False",
        "Pending",
    )
    assert (conditions["Admitted"]["status"], conditions["Admitted"]["reason"]) == ("False", "NoReservation")
    assert (conditions["Requeued"]["status"], conditions["Requeued"]["reason"]) == ("True", "Preempted")
    assert release.body["metadata"]["resourceVersion"] == version  # only onto the Workload as it was read
    assert "admission" not in w.workload["status"]
    w.pending(QUOTA_MESSAGE)
    w.step()
    assert reason(w) == "Preempted"  # while Kueue's Evicted condition holds, it says why the job waits
    assert (
        w.status["message"] == f"waiting in LocalQueue team-a: evicted by Kueue: {PREEMPTED}; {QUOTA_MESSAGE}"
    )
    assert_steady(w)

    # Admitted again: a new attempt, from the latest checkpoint, still no restart.
    w.advance(60)
    w.admit()
    result = w.step()
    assert w.state == "Pending"
    assert w.status["attempt"] == 1
    assert w.status["restartCount"] == 0
    assert w.status["queue"]["admissions"] == 2
    pods = pod_creates(result)
    assert [env_of(pod)["RESUME_FROM"] for pod in pods] == ["/ckpt/epoch-3.pt"] * 2
    assert all(pod["metadata"]["labels"][contract.ATTEMPT_LABEL] == "1" for pod in pods)
    w.start()
    w.step()
    assert w.state == "Running"
    assert w.status["activeSeconds"] == 100  # the deadline clock stood still while it waited


def test_an_elastic_job_admitted_again_replaces_no_worker_of_its_old_attempt() -> None:
    w = kueue_world()
    running(w)
    w.job["status"]["elastic"] = {"shrinks": 1, "replacing": [1]}
    w.evict()
    w.step()
    w.advance(5)
    w.step()
    w.admit()
    w.step()
    assert w.status["attempt"] == 1
    assert w.status["elastic"] == {"shrinks": 1}


def test_the_checkpoint_rank_0_reported_just_before_an_eviction_is_where_the_job_resumes() -> None:
    w = kueue_world()
    running(w)
    annotations = w.pod(0)["metadata"].setdefault("annotations", {})
    annotations[contract.PROGRESS_ANNOTATION] = json.dumps({"epoch": 3, "checkpoint": "/ckpt/epoch-3.pt"})
    w.step()
    assert w.status["checkpoint"]["latest"] == "/ckpt/epoch-3.pt"
    annotations[contract.PROGRESS_ANNOTATION] = json.dumps({"epoch": 4, "checkpoint": "/ckpt/epoch-4.pt"})
    w.evict()
    w.step(1)  # within --progress-interval of the last report: recorded all the same
    assert w.state == "Queued"
    assert w.status["checkpoint"]["latest"] == "/ckpt/epoch-4.pt"
    w.step()
    w.admit()
    pods = pod_creates(w.step())
    assert [env_of(pod)["RESUME_FROM"] for pod in pods] == ["/ckpt/epoch-4.pt"] * 2


def test_a_deactivated_workload_stops_the_job_until_it_is_active_again() -> None:
    w = kueue_world()
    running(w)
    w.deactivate()
    w.step()
    assert (w.state, reason(w)) == ("Queued", "Deactivated")
    result = w.step()
    (release,) = [patch for patch in result.patches if patch.kind == "Workload"]
    conditions = {c["type"]: c for c in release.body["status"]["conditions"]}
    # Kueue requeues a deactivated Workload itself, once it is active again.
    assert (conditions["Requeued"]["status"], conditions["Requeued"]["reason"]) == ("False", "Deactivated")
    assert (w.status["restartCount"], w.status["queue"]["evictions"]) == (0, 1)


def test_a_workload_deleted_while_the_job_runs_stops_it_and_it_queues_again() -> None:
    w = kueue_world()
    running(w)
    del w.owned[w.workload_key]
    result = w.step()
    assert (w.state, reason(w)) == ("Queued", "WorkloadDeleted")
    assert ("Warning", "WorkloadDeleted") in event_reasons(result)
    assert len([d for d in result.deletes if d.kind == "Pod"]) == 2
    assert workload_creates(result) == []  # not while the pods still hold their GPUs
    result = w.step()
    assert len(workload_creates(result)) == 1
    assert (w.status["restartCount"], w.status["queue"]["evictions"]) == (0, 1)


def test_a_workload_deleted_while_the_job_waits_is_made_again_with_a_warning() -> None:
    w = kueue_world()
    w.step()
    w.pending()
    w.step()
    del w.owned[w.workload_key]
    result = w.step()
    assert reason(w) == "WorkloadDeleted"
    assert "was deleted; queueing again in LocalQueue team-a" in w.status["message"]
    assert ("Warning", "WorkloadDeleted") in event_reasons(result)
    assert len(workload_creates(result)) == 1
    w.pending()
    w.step()
    assert reason(w) == "Pending"


def test_resizing_an_admitted_job_queues_it_again_with_a_new_workload() -> None:
    w = kueue_world()
    running(w)
    w.update_spec(numWorkers=3)
    result = w.step()
    assert (w.state, reason(w)) == ("Queued", "WorkloadChanged")
    assert "numWorkers changed from 2 to 3" in w.status["message"]
    assert "evictions" not in w.status["queue"]  # the job asked for it: not an eviction
    assert len([d for d in result.deletes if d.kind == "Pod"]) == 2
    result = w.step()  # pods gone: the old Workload goes
    assert [d.kind for d in result.deletes] == ["Workload"]
    (workload,) = workload_creates(w.step())
    assert workload["spec"]["podSets"][0]["count"] == 3
    w.admit()
    assert len(pod_creates(w.step())) == 3
    assert w.status["restartCount"] == 0


def test_what_a_waiting_workload_asks_for_is_patched_in_place() -> None:
    w = kueue_world()
    w.step()
    w.pending()
    w.step()
    w.update_spec(numWorkers=4)
    result = w.step()
    (patch,) = [p for p in result.patches if p.kind == "Workload"]
    assert patch.subresource is None
    assert patch.body["spec"]["podSets"][0]["count"] == 4
    assert set(patch.body["spec"]) == {"podSets"}
    w.job["metadata"]["labels"][contract.QUEUE_NAME_LABEL] = "team-b"
    (patch,) = [p for p in w.step().patches if p.kind == "Workload"]
    assert patch.body == {"spec": {"queueName": "team-b"}}
    assert w.status["queue"]["name"] == "team-b"


# --------------------------------------------------------------------------------- end of a job


def test_a_finished_job_marks_its_workload_finished() -> None:
    w = kueue_world()
    running(w)
    w.succeed()
    result = w.step()
    assert w.state == "Completed"
    (patch,) = [p for p in result.patches if p.kind == "Workload"]
    assert patch.subresource == "status"
    finished = {c["type"]: c for c in patch.body["status"]["conditions"]}["Finished"]
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")
    assert finished["message"] == "all 2 workers succeeded"
    assert_steady(w)

    w = kueue_world({"spec.failurePolicy.restartPolicy": "Never"})
    running(w)
    w.exit(1, 3)
    patches = [p for p in w.step().patches if p.kind == "Workload"]
    assert w.state == "Failed"
    finished = {c["type"]: c for c in patches[0].body["status"]["conditions"]}["Finished"]
    assert (finished["status"], finished["reason"]) == ("True", "Failed")


def test_a_failure_restart_keeps_the_admission() -> None:
    w = kueue_world()
    running(w)
    w.exit(1, 1)
    w.step()
    assert w.state == "Restarting"
    cond = admitted(w)
    assert cond is not None
    assert cond["status"] == "True"
    w.advance(60)
    result = w.step()
    assert len(pod_creates(result)) == 2
    assert all(pod["spec"]["nodeSelector"] == FLAVOR_LABELS for pod in pod_creates(result))
    assert not [p for p in result.patches if p.kind == "Workload"]


def test_suspending_releases_the_quota_once_the_pods_are_gone_and_resuming_queues_again() -> None:
    w = kueue_world()
    running(w)
    w.update_spec(suspend=True)
    result = w.step()
    assert w.state == "Suspended"
    assert not [d for d in result.deletes if d.kind == "Workload"]
    result = w.step()
    assert [(d.kind, d.reason) for d in result.deletes] == [
        ("Workload", "job suspended: its quota is released")
    ]
    assert_steady(w)
    w.update_spec(suspend=False)
    result = w.step()
    assert w.state == "Queued"
    assert len(workload_creates(result)) == 1


def test_removing_the_queue_label_lets_a_waiting_job_run_without_kueue() -> None:
    w = kueue_world()
    w.step()
    w.pending()
    w.step()
    del w.job["metadata"]["labels"][contract.QUEUE_NAME_LABEL]
    result = w.step()
    assert w.state == "Pending"
    assert admitted(w) is None
    assert "queue" not in w.status
    assert [d.kind for d in result.deletes] == ["Workload"]
    assert len(pod_creates(result)) == 2
    assert all("nodeSelector" not in pod["spec"] for pod in pod_creates(result))


def test_a_running_job_that_gets_the_queue_label_is_stopped_and_queued() -> None:
    w = kueue_world(queue=None)
    w.step()
    w.start()
    w.step()
    assert w.state == "Running"
    w.job["metadata"]["labels"][contract.QUEUE_NAME_LABEL] = QUEUE
    result = w.step()
    assert w.state == "Queued"
    assert len([d for d in result.deletes if d.kind == "Pod"]) == 2
    assert workload_creates(result) == []
    assert "once 2 pod(s) are gone" in w.status["message"]
    assert len(workload_creates(w.step())) == 1
