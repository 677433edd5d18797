"""The trainers' right to patch pods follows the admission policy that narrows it, on the real API
server (controller/guards_watch.py, controller/planner/guards.py): the policy or its binding deleted
while a job runs takes the namespace's trainer RoleBinding away (the trainer account may patch no pod),
the job's ProgressReporting condition and an Event say why, the operator's log says it once, and
nothing more is written while it stays missing; applied again, the RoleBinding comes back. An operator
started without the policy starts (no exit), says so once, and runs jobs without the right until the
policy is installed. While the tenant-escalation policy is missing, a job asking for more than a
tenant's ordinary rights gets no pod and says why, an ordinary job runs, and the held job starts once
the policy is back.

The policies are cluster-wide: each test deletes one and applies its file from crd/ again when it ends,
whatever happened.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import pytest

from crd import contract
from testbed import Kubectl
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    condition,
    events_of,
    get_job,
    job_manifest,
    wait,
    wait_for_state,
    write_requests,
)
from tests.e2e.operator import OperatorProcess
from tests.e2e.reconcile_support import DEBUG

POLICY_FILES: Final = {
    contract.TRAINER_POLICY: REPO / "crd" / "trainer-progress-policy.yaml",
    contract.ESCALATION_POLICY: REPO / "crd" / "escalation-policy.yaml",
}
BINDING: Final = "validatingadmissionpolicybinding"
POLICY: Final = "validatingadmissionpolicy"
JsonDict = dict[str, Any]


@contextmanager
def without(cluster: Kubectl, kind: str, name: str = contract.TRAINER_POLICY) -> Iterator[None]:
    """A policy of crd/ (or its binding) deleted, and applied again as crd/ has it afterwards."""
    cluster.run("delete", f"{kind}/{name}", "--wait=true")
    try:
        yield
    finally:
        cluster.run("apply", "--server-side", "--force-conflicts", "-f", str(POLICY_FILES[name]))


def trainer_may_patch_pods(cluster: Kubectl, namespace: str) -> bool:
    trainer = f"system:serviceaccount:{namespace}:{contract.TRAINER_ACCOUNT}"
    result = cluster.attempt("auth", "can-i", "patch", "pods", "-n", namespace, f"--as={trainer}")
    return result.stdout.strip() == "yes"


def binding_of(cluster: Kubectl, namespace: str) -> JsonDict | None:
    return cluster.get_or_none("rolebinding", contract.TRAINER_ACCOUNT, "-n", namespace)


def reporting(kubectl: Kubectl, namespace: str, name: str, status: str) -> JsonDict:
    """Waits until the job's ProgressReporting condition is `status`; returns the condition."""

    def probe() -> JsonDict | None:
        found = condition(get_job(kubectl, namespace, name).get("status") or {}, "ProgressReporting")
        return found if found is not None and found.get("status") == status else None

    return wait(f"ProgressReporting {status}", probe, timeout=60)


def said(operator: OperatorProcess, action: str) -> list[str]:
    """The operator's log lines of `action` (the guard watch's: guard-missing, guard-installed)."""
    return [str(entry["message"]) for entry in operator.logs() if entry.get("action") == action]


def touch(kubectl: Kubectl, namespace: str, name: str, value: str) -> None:
    """A change of the job that makes the operator reconcile it (an annotation: no spec, no status)."""
    patch = json.dumps({"metadata": {"annotations": {"test.example.com/touch": value}}})
    kubectl.run("patch", "trainingjob", name, "-n", namespace, "--type=merge", "-p", patch)


@pytest.mark.parametrize("kind", [BINDING, POLICY], ids=["binding", "policy"])
def test_the_policy_deleted_while_a_job_runs_takes_the_right_back_until_it_returns(
    cluster: Kubectl, namespace: str, start_operator: StartOperator, kind: str
) -> None:
    operator = start_operator(DEBUG)
    cluster.apply(job_manifest("guarded"), "-n", namespace)
    wait_for_state(cluster, namespace, "guarded", "Running")
    assert binding_of(cluster, namespace) is not None
    assert trainer_may_patch_pods(cluster, namespace)
    missing = f"{'ValidatingAdmissionPolicyBinding' if kind == BINDING else 'ValidatingAdmissionPolicy'} "
    missing += f"{contract.TRAINER_POLICY} is not installed"

    with without(cluster, kind):
        wait("the trainers' RoleBinding removed", lambda: binding_of(cluster, namespace) is None)
        assert not trainer_may_patch_pods(cluster, namespace)
        taken = reporting(cluster, namespace, "guarded", "False")
        assert taken["reason"] == "AdmissionPolicyMissing"
        assert taken["message"].startswith(missing), taken["message"]
        events = wait(
            "the Event",
            lambda: [
                e for e in events_of(cluster, namespace, "guarded") if e["reason"] == "AdmissionPolicyMissing"
            ],
        )
        assert [(event["type"], event.get("count", 1)) for event in events] == [("Warning", 1)]
        lines = wait("the log line", lambda: said(operator, "guard-missing"))
        assert len(lines) == 1
        assert lines[0].startswith(missing), lines
        # No write loop: reconciles of the job while the policy stays missing write nothing.
        job = get_job(cluster, namespace, "guarded")
        assert job["status"]["state"] == "Running"
        writes = write_requests(operator)
        for value in ("1", "2", "3"):
            touch(cluster, namespace, "guarded", value)
            wait(
                f"a reconcile of touch {value}",
                lambda: (
                    get_job(cluster, namespace, "guarded")["metadata"]["resourceVersion"]
                    in [
                        entry.get("resourceVersion")
                        for entry in operator.logs()
                        if entry.get("action") == "reconciled"
                    ]
                ),
            )
        assert write_requests(operator) == writes, "nothing written while the policy stays missing"
        assert binding_of(cluster, namespace) is None
        assert condition(get_job(cluster, namespace, "guarded")["status"], "ProgressReporting") == taken
        assert len(said(operator, "guard-missing")) == 1

    back = wait("the trainers' RoleBinding again", lambda: binding_of(cluster, namespace))
    assert back["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": contract.TRAINER_CLUSTER_ROLE,
    }
    wait("the trainers' right back", lambda: trainer_may_patch_pods(cluster, namespace))
    restored = reporting(cluster, namespace, "guarded", "True")
    assert restored["reason"] == "AdmissionPolicyInstalled"
    assert wait("the log line", lambda: said(operator, "guard-installed")) == [
        f"the admission policy {contract.TRAINER_POLICY} is installed again: trainers get their rights back"
    ]
    job = get_job(cluster, namespace, "guarded")
    assert (job["status"]["state"], job["status"]["restartCount"]) == ("Running", 0)
    assert operator.alive()


def test_an_operator_started_without_the_policy_runs_jobs_without_the_right_until_it_is_installed(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    with without(cluster, POLICY):
        operator = start_operator(DEBUG)  # ready: it starts, where it used to exit
        lines = wait("the log line", lambda: said(operator, "guard-missing"))
        assert lines == [
            f"ValidatingAdmissionPolicy {contract.TRAINER_POLICY} is not installed: trainers get no right to "
            "patch pods until it is installed; apply crd/ (kubectl apply --server-side -k crd/), which make "
            "deploy and the Helm chart do"
        ]
        cluster.apply(job_manifest("unguarded"), "-n", namespace)
        wait_for_state(cluster, namespace, "unguarded", "Running")
        taken = reporting(cluster, namespace, "unguarded", "False")
        assert taken["reason"] == "AdmissionPolicyMissing"
        assert cluster.get_or_none("serviceaccount", contract.TRAINER_ACCOUNT, "-n", namespace) is not None
        assert binding_of(cluster, namespace) is None, "never granted"
        assert not trainer_may_patch_pods(cluster, namespace)
    wait("the trainers' RoleBinding", lambda: binding_of(cluster, namespace))
    assert reporting(cluster, namespace, "unguarded", "True")["reason"] == "AdmissionPolicyInstalled"
    assert trainer_may_patch_pods(cluster, namespace)


def test_a_job_asking_for_more_waits_while_the_escalation_policy_is_missing(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator(DEBUG)
    with without(cluster, BINDING, contract.ESCALATION_POLICY):
        host = job_manifest("host", podTemplate={"spec": {"hostNetwork": True}})
        cluster.apply(host, "-n", namespace)  # as an administrator: nothing at admission judges it now
        cluster.apply(job_manifest("plain"), "-n", namespace)
        wait_for_state(cluster, namespace, "plain", "Running")

        def held() -> JsonDict | None:
            found = condition(get_job(cluster, namespace, "host").get("status") or {}, "Created")
            return found if found is not None and found.get("reason") == "AdmissionPolicyMissing" else None

        created = wait("the held job's condition", held)
        assert created["status"] == "False"
        message = created["message"]
        assert message.startswith(
            f"ValidatingAdmissionPolicyBinding {contract.ESCALATION_POLICY} is not installed"
        )
        assert "spec.podTemplate.spec.hostNetwork=true" in message, message
        assert get_job(cluster, namespace, "host")["status"]["message"] == message
        assert cluster.items("pods", "-n", namespace, "-l", f"{contract.JOB_NAME_LABEL}=host") == []
        events = [e for e in events_of(cluster, namespace, "host") if e["reason"] == "AdmissionPolicyMissing"]
        assert [event["type"] for event in events] == ["Warning"]
        lines = [line for line in said(operator, "guard-missing") if contract.ESCALATION_POLICY in line]
        assert len(lines) == 1, lines
        # No write loop while it waits.
        writes = write_requests(operator)
        touch(cluster, namespace, "host", "1")
        wait(
            "a reconcile of the touch",
            lambda: (
                get_job(cluster, namespace, "host")["metadata"]["resourceVersion"]
                in [
                    entry.get("resourceVersion")
                    for entry in operator.logs()
                    if entry.get("action") == "reconciled"
                ]
            ),
        )
        assert write_requests(operator) == writes
    # Installed again: the held job starts.
    wait_for_state(cluster, namespace, "host", "Running")
    started = condition(get_job(cluster, namespace, "host")["status"], "Created")
    assert started is not None
    assert (started["status"], started["reason"]) == ("True", "PodsCreated")
