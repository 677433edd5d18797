"""A job MultiKueue runs (spec.managedBy), decided by controller.planner.plan (planner/multikueue.py),
and its copy on the worker cluster, which runs in the Workload MultiKueue made there (workloads.py).

On the manager the operator makes the job's Workload and nothing else (no pod, Service or other
object), and writes status only while no worker's copy exists: the status MultiKueue mirrors from the
copy is never written over, so the two never fight. On the worker the copy carries the
prebuilt-workload label: the operator runs it in that Workload, adopts it, and creates none.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from builders.workload import workload_name
from controller.kueue_watches import cluster_essentials
from crd import contract
from crd.spec import parse
from tests.unit.kueue_world import CLUSTER_QUEUE, QUEUE, KueueWorld, kueue_world
from tests.unit.lifecycle_world import JOB_UID
from tests.unit.queueing_steps import assert_steady, pod_creates, workload_creates

JsonDict = dict[str, Any]
MULTIKUEUE = contract.MULTIKUEUE_CONTROLLER
CHECK = "multikueue"


def manager_world(**kwargs: Any) -> KueueWorld:
    return kueue_world({"spec.managedBy": MULTIKUEUE}, **kwargs)


def check(w: KueueWorld, state: str, message: str) -> None:
    """MultiKueue's admission check on the manager's Workload."""
    w.workload.setdefault("status", {})["admissionChecks"] = [
        {"name": CHECK, "state": state, "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]
    w.workload["metadata"]["resourceVersion"] = f"{w.workload['metadata'].get('resourceVersion')}c"


def reserve(w: KueueWorld) -> None:
    """Quota reserved on the manager, MultiKueue's check still pending."""
    w.admit()
    w._conditions(("Admitted", "False", "NoChecks", "The workload has not all checks ready"))
    check(w, "Pending", 'The workload got reservation on "worker1"')


def mirror(w: KueueWorld, status: JsonDict) -> None:
    """MultiKueue copies the worker's copy's whole status onto the manager's job."""
    w.job["status"] = copy.deepcopy(status)


def admitted_reason(w: KueueWorld) -> str:
    found = w.condition("Admitted")
    assert found is not None, w.status
    return str(found["reason"])


def assert_nothing_written(w: KueueWorld) -> None:
    before = copy.deepcopy(w.job.get("status") or {})
    planned = w.plan()
    assert planned.status == before
    assert (planned.creates, planned.patches, planned.deletes, planned.events) == ([], [], [], [])


def test_the_operator_names_itself_and_multikueue_as_the_managers_it_knows() -> None:
    assert contract.CONTROLLER_NAME == "ml.example.com/trainingjob-operator"
    assert contract.MANAGED_BY_VALUES == (contract.CONTROLLER_NAME, "kueue.x-k8s.io/multikueue")
    assert parse(kueue_world({"spec.managedBy": contract.CONTROLLER_NAME}).job).managed_elsewhere is None
    assert parse(manager_world().job).managed_elsewhere == MULTIKUEUE


def test_a_job_managed_by_the_operator_by_name_runs_as_one_without_the_field() -> None:
    named = kueue_world({"spec.managedBy": contract.CONTROLLER_NAME})
    plain = kueue_world()
    assert named.plan().creates == plain.plan().creates


def test_on_the_manager_a_multikueue_job_gets_its_workload_and_no_pod() -> None:
    w = manager_world()
    result = w.step()
    (workload,) = workload_creates(result)
    assert workload["metadata"]["ownerReferences"][0]["uid"] == JOB_UID
    assert workload["spec"]["queueName"] == QUEUE
    assert [obj["kind"] for obj in result.creates] == ["Workload"]
    assert w.state == "Queued"
    assert f"waiting in LocalQueue {QUEUE} for dispatch" in w.status["message"]
    assert admitted_reason(w) == "WaitingForDispatch"
    w.step()
    assert w.status["queue"] == {"name": QUEUE, "workload": workload["metadata"]["name"]}
    assert_steady(w)


def test_while_multikueue_dispatches_the_manager_says_so_then_leaves_the_status_to_the_mirror() -> None:
    w = manager_world()
    w.step()
    reserve(w)
    w.step()
    assert w.state == "Queued"
    assert 'multikueue (Pending): The workload got reservation on "worker1"' in w.status["message"]
    assert_steady(w)
    # The worker's copy runs; MultiKueue marks the check Ready and mirrors the copy's status.
    check(w, "Ready", 'The workload got reservation on "worker1"')
    w._conditions(("Admitted", "True", "Admitted", "The workload is admitted"))
    running = {"state": "Running", "message": "2/2 workers running", "workers": 2, "conditions": []}
    mirror(w, running)
    assert_nothing_written(w)
    mirror(w, {**running, "state": "Completed", "message": "all workers succeeded"})
    assert_nothing_written(w)
    assert pod_creates(w.plan()) == []


def test_a_mirrored_status_that_races_the_workloads_admission_is_not_written_over() -> None:
    w = manager_world()
    w.step()
    reserve(w)
    w.step()
    mirror(w, {"state": "Pending", "message": "creating 2 pod(s)"})  # the check not yet seen Ready
    assert_nothing_written(w)


def test_a_finished_workload_keeps_the_mirrored_end_even_if_the_job_shows_it_late() -> None:
    w = manager_world()
    w.step()
    reserve(w)
    mirror(w, {"state": "Running", "message": "2/2 workers running"})
    w._conditions(
        ("Finished", "True", "Succeeded", "all workers succeeded"),
        ("QuotaReserved", "False", "Finished", "finished"),
    )
    assert_nothing_written(w)


def test_the_copy_removed_by_multikueue_shows_why_on_the_manager_once_the_quota_is_released() -> None:
    w = manager_world()
    w.step()
    reserve(w)
    check(w, "Ready", 'The workload got reservation on "worker1"')
    mirror(w, {"state": "Running", "message": "2/2 workers running"})
    assert_nothing_written(w)
    # The worker was lost for longer than MultiKueue waits: the check goes Retry, Kueue evicts the
    # Workload and MultiKueue deletes the copy; the operator releases the quota (as after any eviction).
    check(w, "Retry", "Reserving remote lost")
    w.evict("AdmissionCheck", "At least one admission check is false")
    result = w.step()
    assert [patch.subresource for patch in result.patches] == ["status"]
    assert w.workload["status"].get("admission") is None
    w.step()
    assert w.state == "Queued"
    assert w.status["message"].startswith("At least one admission check is false; waiting in LocalQueue")
    assert admitted_reason(w) == "AdmissionCheck"
    assert ("Normal", "AdmissionCheck") in [(e.type, e.reason) for e in w.events]
    assert_steady(w)


def test_a_multikueue_job_without_a_queue_or_without_kueue_says_what_is_missing() -> None:
    no_queue = manager_world(queue=None)
    no_queue.step()
    assert no_queue.state == "Queued"
    assert admitted_reason(no_queue) == "NoQueueName"
    assert contract.QUEUE_NAME_LABEL in no_queue.status["message"]
    assert ("Warning", "NoQueueName") in [(e.type, e.reason) for e in no_queue.events]
    assert_steady(no_queue)
    no_kueue = manager_world(installed=False)
    no_kueue.step()
    assert admitted_reason(no_kueue) == "KueueNotInstalled"
    assert no_kueue.plan().creates == []
    assert_steady(no_kueue)


def test_a_job_another_controller_manages_is_left_alone() -> None:
    w = kueue_world({"spec.managedBy": "example.com/someone-else"})
    assert_nothing_written(w)
    assert w.job.get("status") is None


# ----------------------------------------------------------------------------------- the worker


def worker_world() -> KueueWorld:
    """The copy MultiKueue made on the worker: no managedBy, the prebuilt-workload label, and the
    Workload MultiKueue made before it, already admitted by the worker's Kueue and owned by nobody."""
    w = kueue_world(labels={contract.PREBUILT_WORKLOAD_LABEL: "trainingjob-mnist-0abcd"})
    manager = kueue_world()
    manager.step()
    (workload,) = [obj for key, obj in manager.owned.items() if key[0] == "Workload"]
    clone = copy.deepcopy(workload)
    clone["metadata"]["name"] = "trainingjob-mnist-0abcd"
    clone["metadata"]["ownerReferences"] = []
    clone["metadata"]["uid"] = "workload-uid"
    clone["metadata"]["resourceVersion"] = "1"
    w.owned[("Workload", "trainingjob-mnist-0abcd")] = clone
    return w


def test_on_the_worker_the_copy_runs_in_the_workload_multikueue_made_and_adopts_it() -> None:
    w = worker_world()
    assert workload_name(parse(w.job)) == "trainingjob-mnist-0abcd"
    w.admit(CLUSTER_QUEUE)
    result = w.step()
    assert workload_creates(result) == []
    (adopt,) = [patch for patch in result.patches if patch.kind == "Workload"]
    owners = adopt.body["metadata"]["ownerReferences"]
    assert [(o["kind"], o["uid"], o["controller"]) for o in owners] == [("TrainingJob", JOB_UID, True)]
    assert len(pod_creates(result)) == 2
    w.step()
    assert [patch for patch in w.plan().patches if patch.kind == "Workload"] == []


def test_on_the_worker_a_copy_whose_workload_is_not_cached_yet_waits_and_looks_again() -> None:
    w = worker_world()
    del w.owned[("Workload", "trainingjob-mnist-0abcd")]
    result = w.step()
    assert [obj["kind"] for obj in result.creates if obj["kind"] in ("Workload", "Pod")] == []
    assert result.requeue_after is not None
    assert result.requeue_after <= 1.0


# ------------------------------------------------------------------------------ a lost worker


def multikueue_cluster(active: bool, message: str = "Connected") -> JsonDict:
    reason = "Active" if active else "ClientConnectionFailed"
    condition = {"type": "Active", "status": str(active), "reason": reason, "message": message}
    return {"metadata": {"name": "worker1"}, "status": {"conditions": [condition]}}


def dispatched(w: KueueWorld) -> None:
    """Running on worker1: the check Ready, the Workload admitted there, the copy's status mirrored."""
    w.step()
    reserve(w)
    check(w, "Ready", 'The workload got reservation on "worker1"')
    w._conditions(("Admitted", "True", "Admitted", "The workload is admitted"))
    w.workload["status"]["clusterName"] = "worker1"
    mirror(w, {"state": "Running", "message": "2/2 workers running", "conditions": []})


def with_cluster(w: KueueWorld, cluster: JsonDict) -> None:
    assert w.kueue is not None
    w.kueue = replace(w.kueue, multikueue_clusters={"worker1": cluster})


def test_a_worker_lost_mid_run_turns_worker_reachable_false_with_an_event_once() -> None:
    w = manager_world()
    dispatched(w)
    with_cluster(w, multikueue_cluster(True))
    assert_nothing_written(w)
    refused = "dial tcp 127.0.0.1:6443: connect: connection refused"
    with_cluster(w, multikueue_cluster(False, refused))
    result = w.step()
    reachable = w.condition("WorkerReachable")
    assert reachable is not None
    assert (reachable["status"], reachable["reason"]) == ("False", "WorkerClusterUnreachable")
    assert "worker cluster worker1 is unreachable (ClientConnectionFailed: dial tcp" in reachable["message"]
    assert [(e.type, e.reason) for e in result.events] == [("Warning", "WorkerClusterUnreachable")]
    assert w.state == "Running"  # the worker's last word stands
    assert (result.creates, result.patches, result.deletes) == ([], [], [])
    assert_steady(w)
    # Back: MultiKueue's next copy of the status drops the condition, and the operator writes nothing.
    with_cluster(w, multikueue_cluster(True))
    mirror(w, {"state": "Running", "message": "2/2 workers running", "conditions": []})
    assert_nothing_written(w)


def test_a_worker_back_before_multikueue_copies_the_status_again_turns_worker_reachable_true() -> None:
    w = manager_world()
    dispatched(w)
    with_cluster(w, multikueue_cluster(False, "refused"))
    w.step()
    with_cluster(w, multikueue_cluster(True))
    result = w.step()
    reachable = w.condition("WorkerReachable")
    assert reachable is not None
    assert reachable["status"] == "True"
    assert result.events == []
    assert_steady(w)


def test_what_the_operator_keeps_of_a_multikueue_cluster_is_its_active_condition() -> None:
    cached = cluster_essentials(
        {
            "apiVersion": contract.KUEUE_API_VERSION,
            "kind": "MultiKueueCluster",
            "metadata": {"name": "worker1", "resourceVersion": "7", "uid": "u"},
            "spec": {"clusterSource": {"kubeConfig": {"location": "worker1-kubeconfig"}}},
            "status": {"conditions": [{**multikueue_cluster(True)["status"]["conditions"][0], "x": 1}]},
        }
    )
    assert cached["metadata"] == {"name": "worker1", "resourceVersion": "7"}
    assert "spec" not in cached
    assert cached["status"]["conditions"] == multikueue_cluster(True)["status"]["conditions"]
