"""What the operator hands out follows the admission policies that bound it (controller/planner/guards.py),
through whole job lives in the fake cluster of tests.unit.lifecycle_world.

The trainers' rights: the trainer-progress policy (or its binding) deleted while a job runs takes the
namespace's trainer RoleBinding away, once, says so in the job's ProgressReporting condition and an
Event, and writes nothing more while it stays missing; restored, the RoleBinding comes back and the
condition says so; never known, nothing is granted or taken back. A RoleBinding of an earlier version
(it bound a Role) is replaced. Stalls wait while no report can arrive.

The tenant-escalation policy: a job asking for more than a tenant's ordinary rights gets no pod while
it is missing (or not known), says why, and starts once it is back; an ordinary job is not concerned.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from builders.shared import build_role_binding
from controller.planner import Delete, Plan
from controller.planner.guards import Rights, trainer_rights
from controller.planner.model import Guards
from controller.runtime.clock import rfc3339
from crd import contract
from crd.spec import parse
from tests.unit.lifecycle_steps import assert_steady
from tests.unit.lifecycle_world import World, world

BINDING = ("RoleBinding", contract.TRAINER_ACCOUNT)
POLICY_GONE = Guards(
    {contract.TRAINER_POLICY: f"ValidatingAdmissionPolicy {contract.TRAINER_POLICY} is not installed"}
)
BINDING_GONE = Guards(
    {contract.TRAINER_POLICY: f"ValidatingAdmissionPolicyBinding {contract.TRAINER_POLICY} is not installed"}
)


def reasons(result: Plan) -> list[tuple[str, str]]:
    return [(event.type, event.reason) for event in result.events]


def binding_creates(result: Plan) -> list[dict[str, Any]]:
    return [obj for obj in result.creates if (obj["kind"], obj["metadata"]["name"]) == BINDING]


def running(changes: dict[str, Any] | None = None) -> World:
    w = world(changes)
    w.run_to_running()
    assert BINDING in w.owned
    return w


@pytest.mark.parametrize(
    ("guards", "rights"),
    [
        (Guards(), Rights.GRANT),
        (POLICY_GONE, Rights.REVOKE),
        (BINDING_GONE, Rights.REVOKE),
        (Guards({"some-other-policy": "missing"}), Rights.GRANT),
        (Guards(known=False), Rights.WITHHOLD),
    ],
)
def test_the_trainers_rights_follow_the_policy(guards: Guards, rights: Rights) -> None:
    assert trainer_rights(guards) is rights


@pytest.mark.parametrize("gone", [POLICY_GONE, BINDING_GONE], ids=["policy", "binding"])
def test_a_policy_deleted_while_the_job_runs_takes_the_right_back_once(gone: Guards) -> None:
    w = running()
    uid = w.owned[BINDING]["metadata"]["uid"]
    w.guards = gone
    result = w.step(5)
    assert result.deletes == [
        Delete(
            "RoleBinding",
            contract.TRAINER_ACCOUNT,
            uid,
            f"{gone.missing[contract.TRAINER_POLICY]}: the trainers' right to patch pods is taken back",
        )
    ]
    assert BINDING not in w.owned
    condition = w.condition("ProgressReporting")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", "AdmissionPolicyMissing")
    assert gone.missing[contract.TRAINER_POLICY] in condition["message"]
    assert "kubectl apply --server-side -k crd/" in condition["message"]
    assert reasons(result) == [("Warning", "AdmissionPolicyMissing")]
    assert w.state == "Running", "the job runs on; only its reports are refused"
    # No write loop: later reconciles create nothing, delete nothing, write no status, say nothing.
    assert_steady(w, 30)
    assert_steady(w, 3600)


def test_restored_the_right_comes_back_and_the_condition_says_so() -> None:
    w = running()
    w.guards = POLICY_GONE
    w.step(5)
    w.guards = Guards()
    result = w.step(5)
    assert [obj["roleRef"] for obj in binding_creates(result)] == [
        {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": contract.TRAINER_CLUSTER_ROLE,
        }
    ]
    assert result.deletes == []
    condition = w.condition("ProgressReporting")
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "AdmissionPolicyInstalled")
    assert condition["lastTransitionTime"] == rfc3339(w.now)
    assert reasons(result) == [("Normal", "AdmissionPolicyInstalled")]
    assert_steady(w, 30)


def test_a_job_that_never_lost_the_right_has_no_such_condition() -> None:
    w = running()
    assert w.condition("ProgressReporting") is None
    assert_steady(w, 30)


def test_missing_at_start_up_a_new_job_runs_without_the_right_and_says_why() -> None:
    w = world()
    w.guards = POLICY_GONE
    w.run_to_running()
    assert BINDING not in w.owned
    assert ("ServiceAccount", contract.TRAINER_ACCOUNT) in w.owned, "its pods still need the account"
    condition = w.condition("ProgressReporting")
    assert condition is not None
    assert condition["status"] == "False"
    assert sum(1 for event in w.events if event.reason == "AdmissionPolicyMissing") == 1
    assert_steady(w, 60)


def test_while_the_operator_cannot_tell_nothing_is_granted_or_taken_back() -> None:
    fresh = world()
    fresh.guards = Guards(known=False)
    fresh.run_to_running()
    assert BINDING not in fresh.owned
    assert fresh.condition("ProgressReporting") is None

    w = running()
    w.guards = Guards(known=False)
    result = w.step(5)
    assert result.deletes == []
    assert BINDING in w.owned
    assert w.condition("ProgressReporting") is None


def test_a_job_with_its_own_account_says_nothing_but_the_namespaces_binding_still_goes() -> None:
    w = world({"spec.serviceAccountName": "mine"})
    w.run_to_running()
    # The namespace's RoleBinding, made for the other jobs there, is in this job's view too.
    shared = build_role_binding(parse(w.job))
    w.create(shared)
    w.guards = POLICY_GONE
    result = w.step(5)
    assert [(delete.kind, delete.name) for delete in result.deletes] == [BINDING]
    assert w.condition("ProgressReporting") is None
    assert reasons(result) == []


def test_a_finished_job_takes_the_right_back_too_without_a_condition() -> None:
    w = running()
    w.succeed()
    w.settle()
    assert w.state == "Completed"
    if BINDING not in w.owned:  # a finished job no longer asks for it; another job made it
        w.create(build_role_binding(parse(w.job)))
    w.guards = POLICY_GONE
    result = w.step(5)
    assert [(delete.kind, delete.name) for delete in result.deletes] == [BINDING]
    assert w.condition("ProgressReporting") is None


def test_a_role_binding_of_an_earlier_version_is_replaced() -> None:
    """Upgrade: the earlier version bound the Role trainingjob-trainer; roleRef cannot change, so the
    RoleBinding is deleted and the next reconcile binds the ClusterRole. Idempotent: once replaced,
    nothing more happens."""
    w = running()
    old = w.owned[BINDING]
    old["roleRef"] = {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": contract.TRAINER_ACCOUNT,
    }
    result = w.step(5)
    assert [(delete.kind, delete.name, delete.uid) for delete in result.deletes] == [
        (*BINDING, old["metadata"]["uid"])
    ]
    assert "Role trainingjob-trainer" in result.deletes[0].reason
    assert binding_creates(result) == [], "not while the old one still holds the name"
    result = w.step(1)
    assert [obj["roleRef"]["kind"] for obj in binding_creates(result)] == ["ClusterRole"]
    assert w.condition("ProgressReporting") is None
    assert_steady(w, 30)


def test_a_binding_being_deleted_is_not_deleted_again() -> None:
    w = running()
    w.owned[BINDING]["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    w.guards = POLICY_GONE
    assert w.plan().deletes == []


def test_no_stall_while_reports_cannot_arrive_and_the_deadline_counts_from_their_return() -> None:
    w = running({"spec.monitoring.progressDeadlineSeconds": 600, "spec.monitoring.restartOnStall": True})
    w.report(epoch=1)
    w.step(10)
    w.guards = POLICY_GONE
    w.step(5)
    result = w.step(3600)
    assert w.state == "Running"
    assert w.condition("Stalled") is None
    assert result.deletes == []
    assert result.requeue_after is None or result.requeue_after > 0
    steady = assert_steady(w, 7200)
    assert steady.requeue_after is None or steady.requeue_after >= 1
    w.guards = Guards()
    result = w.step(5)
    assert w.state == "Running", "an hour without reports while they were refused is not a stall"
    assert result.requeue_after == pytest.approx(600)
    result = w.step(600)
    assert w.state == "Restarting", "counted from when the right came back"
    assert w.status["restarts"] == {"stall": 1}


def test_the_condition_is_kept_across_a_restart_of_the_gang() -> None:
    w = running()
    w.guards = POLICY_GONE
    w.step(5)
    before = copy.deepcopy(w.condition("ProgressReporting"))
    w.exit(0, 1)
    w.settle()
    assert w.condition("ProgressReporting") == before


# ----------------------------------------------------------------- the tenant-escalation policy

ESCALATION_GONE = Guards(
    {contract.ESCALATION_POLICY: f"ValidatingAdmissionPolicy {contract.ESCALATION_POLICY} is not installed"}
)
HOST_NETWORK = {"spec.podTemplate": {"spec": {"hostNetwork": True}}}


def pod_creates(result: Plan) -> list[str]:
    return [obj["metadata"]["name"] for obj in result.creates if obj["kind"] == "Pod"]


@pytest.mark.parametrize(
    "changes",
    [HOST_NETWORK, {"spec.serviceAccountName": "powerful"}],
    ids=["host-network", "another-account"],
)
def test_a_job_asking_for_more_is_not_started_while_the_escalation_policy_is_missing(
    changes: dict[str, Any],
) -> None:
    w = world(changes)
    w.guards = ESCALATION_GONE
    w.settle()
    assert not w.pods, "no pod while the policy that would have judged the job is missing"
    assert w.state == "Pending"
    created = w.condition("Created")
    assert created is not None
    assert (created["status"], created["reason"]) == ("False", "AdmissionPolicyMissing")
    finding = (
        "spec.podTemplate.spec.hostNetwork=true" if changes is HOST_NETWORK else "spec.serviceAccountName"
    )
    assert finding in created["message"]
    assert ESCALATION_GONE.missing[contract.ESCALATION_POLICY] in created["message"]
    assert w.status["message"] == created["message"]
    assert [event.reason for event in w.events].count("AdmissionPolicyMissing") == 1
    assert_steady(w, 60)

    w.guards = Guards()
    result = w.step(5)
    assert pod_creates(result) == ["mnist-worker-0", "mnist-worker-1"], "started once the policy is back"


def test_an_ordinary_job_is_not_concerned_by_the_escalation_policy() -> None:
    w = world()
    w.guards = ESCALATION_GONE
    w.run_to_running()
    created = w.condition("Created")
    assert created is not None
    assert (created["status"], created["reason"]) == ("True", "PodsCreated")


def test_a_running_job_keeps_its_pods_but_gets_no_new_ones() -> None:
    w = world({**HOST_NETWORK, "spec.failurePolicy.backoffLimit": 3})
    w.run_to_running()
    w.guards = ESCALATION_GONE
    result = w.step(5)
    assert result.deletes == []
    assert w.state == "Running"
    w.exit(1, 1)
    w.settle()
    w.step(3600)  # past any backoff
    w.settle()
    assert not w.live_pods(), "the gang restarted and no new pod was created"
    created = w.condition("Created")
    assert created is not None
    assert created["reason"] == "AdmissionPolicyMissing"


def test_not_known_yet_an_escalating_job_waits_too() -> None:
    w = world(HOST_NETWORK)
    w.guards = Guards(known=False)
    w.settle()
    assert not w.pods
