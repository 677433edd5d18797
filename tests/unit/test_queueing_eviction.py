"""Queueing with Kueue after admission: eviction (preemption, deactivation, the Workload deleted,
numWorkers changed) and where the job resumes, and the end of a job (finished, a failure restart,
suspension, the queue label removed or added), stepped through the fake world of
tests/unit/kueue_world.py.

Split out of tests/unit/test_queueing.py (waiting and admission).
"""

from __future__ import annotations

import json

from crd import contract
from tests.unit.kueue_world import (
    FLAVOR_LABELS,
    PREEMPTED,
    QUEUE,
    QUOTA_MESSAGE,
    kueue_world,
)
from tests.unit.lifecycle_world import env_of
from tests.unit.queueing_steps import (
    admitted,
    assert_steady,
    event_reasons,
    pod_creates,
    reason,
    running,
    workload_creates,
)

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
