"""`make deploy` and `make undeploy` against a real cluster, including the failures a user meets first.

Runs on a throwaway control plane of its own (TJ_DEV_DIR in a temporary directory), because deploying
and undeploying installs and removes cluster-wide objects that other tests share.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from crd import contract
from testbed import Kubectl, throwaway_cluster, wait_for
from tests.cluster import REPO
from tests.e2e.operator_identity import OPERATOR_POLICIES

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

POLICY_KINDS = ("validatingadmissionpolicy", "validatingadmissionpolicybinding")


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubectl]:
    with throwaway_cluster(tmp_path_factory.mktemp("deploy-cluster")) as kubectl:
        yield kubectl


def make(target: str, kubeconfig: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    args = ["make", "--no-print-directory", target, *(f"{key}={value}" for key, value in variables.items())]
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_deploy_installs_everything_and_undeploy_keeps_the_crd(own_cluster: Kubectl) -> None:
    result = make("deploy", own_cluster.kubeconfig, IMAGE="team/trainingjob-operator:1.2")
    assert result.returncode == 0, result.stdout + result.stderr
    deployment = own_cluster.get_json("deployment", "trainingjob-operator", "-n", "trainingjob-system")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "team/trainingjob-operator:1.2"
    own_cluster.run(
        "rollout", "status", "deployment/trainingjob-operator", "-n", "trainingjob-system", "--timeout=120s"
    )
    assert own_cluster.get_or_none("clusterrole", "trainingjob-operator") is not None
    assert own_cluster.get_or_none("crd", "trainingjobs.ml.example.com") is not None
    assert own_cluster.get_or_none("clusterrole", contract.TRAINER_CLUSTER_ROLE) is not None

    result = make("undeploy", own_cluster.kubeconfig)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the TrainingJob CRD, the admission policies and the jobs remain" in result.stdout
    assert own_cluster.get_or_none("clusterrole", "trainingjob-operator") is None
    for name in OPERATOR_POLICIES:  # the policies on the operator's own writes go with it
        assert own_cluster.get_or_none("validatingadmissionpolicy", name) is None, name
    # crd/'s objects stay: the CRD, the trainers' ClusterRole, and the policies that guard the jobs it keeps.
    assert own_cluster.get_or_none("crd", "trainingjobs.ml.example.com") is not None
    assert own_cluster.get_or_none("clusterrole", contract.TRAINER_CLUSTER_ROLE) is not None
    for kind in POLICY_KINDS:
        for name in contract.CRD_POLICIES:
            assert own_cluster.get_or_none(kind, name) is not None, (kind, name)

    result = make("undeploy", own_cluster.kubeconfig, DELETE_CRD="1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert own_cluster.get_or_none("crd", "trainingjobs.ml.example.com") is None
    for kind in POLICY_KINDS:
        for name in contract.CRD_POLICIES:
            assert own_cluster.get_or_none(kind, name) is None, (kind, name)


def earlier_role(namespace: str, labels: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": contract.TRAINER_ACCOUNT, "namespace": namespace, "labels": labels},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}],
    }


def test_deploy_removes_the_trainer_roles_an_earlier_version_made(own_cluster: Kubectl) -> None:
    """An earlier operator made a Role trainingjob-trainer, labelled as the namespace's shared objects, in
    each namespace its jobs ran in; this one binds a ClusterRole and has no rights on Roles, so `make
    deploy` removes them: those only, and a second run finds none."""
    shared = {
        contract.MANAGED_BY_LABEL: contract.MANAGED_BY_VALUE,
        contract.APP_NAME_LABEL: contract.APP_NAME_VALUE,
        contract.COMPONENT_LABEL: contract.SHARED_COMPONENT,
    }
    for namespace in ("team-a", "team-b"):
        own_cluster.run("create", "namespace", namespace)
    try:
        own_cluster.apply(earlier_role("team-a", shared))
        own_cluster.apply(earlier_role("team-b", {"team": "b"}))  # not the operator's
        for attempt in ("upgrade", "again"):
            result = make("deploy", own_cluster.kubeconfig)
            assert result.returncode == 0, (attempt, result.stdout + result.stderr)
            assert own_cluster.get_or_none("role", contract.TRAINER_ACCOUNT, "-n", "team-a") is None, attempt
            assert own_cluster.get_or_none("role", contract.TRAINER_ACCOUNT, "-n", "team-b") is not None, (
                attempt
            )
    finally:
        make("undeploy", own_cluster.kubeconfig)
        for namespace in ("team-a", "team-b"):
            own_cluster.run("delete", "namespace", namespace, "--ignore-not-found", "--wait=false")


def test_refused_install_leaves_nothing_behind(own_cluster: Kubectl) -> None:
    own_cluster.run("create", "namespace", "trainingjob-system")
    own_cluster.run("create", "quota", "no-services", "--hard=services=0", "-n", "trainingjob-system")
    try:
        result = make("deploy", own_cluster.kubeconfig)
        assert result.returncode != 0
        assert "nothing was applied" in result.stderr
        assert "services" in result.stdout + result.stderr
        assert own_cluster.get_or_none("clusterrole", "trainingjob-operator") is None
        assert (
            own_cluster.get_or_none("serviceaccount", "trainingjob-operator", "-n", "trainingjob-system")
            is None
        )
    finally:
        own_cluster.run("delete", "namespace", "trainingjob-system", "--wait=true", "--timeout=120s")


DENY_OPERATOR_POLICY = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicy",
    "metadata": {"name": "test-deny-operator-deployment"},
    "spec": {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": ["apps"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["deployments"],
                }
            ]
        },
        "validations": [
            {
                "expression": "object.metadata.name != 'trainingjob-operator'",
                "message": "the test's policy refuses the operator's Deployment",
            }
        ],
    },
}
DENY_OPERATOR_BINDING = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "ValidatingAdmissionPolicyBinding",
    "metadata": {"name": "test-deny-operator-deployment"},
    "spec": {"policyName": "test-deny-operator-deployment", "validationActions": ["Deny"]},
}


def test_namespace_created_for_a_refused_install_is_removed_again(own_cluster: Kubectl) -> None:
    own_cluster.apply(DENY_OPERATOR_POLICY)
    own_cluster.apply(DENY_OPERATOR_BINDING)
    try:

        def refused() -> subprocess.CompletedProcess[str] | None:
            result = make("deploy", own_cluster.kubeconfig)
            # The policy takes effect once the API server has loaded it; until then deploy succeeds, and
            # if it takes effect between the dry run and the apply, the apply fails part-way. Either
            # way: undo, and try again until the dry run is what refuses.
            if result.returncode == 0 or "nothing was applied" not in result.stderr:
                make("undeploy", own_cluster.kubeconfig)
                own_cluster.run(
                    "delete", "namespace", "trainingjob-system", "--ignore-not-found", "--wait=true",
                    "--timeout=120s",
                )  # fmt: skip
                return None
            return result

        result = wait_for("the admission policy to refuse the Deployment", refused, timeout=60, interval=1)
        assert "refuses the operator's Deployment" in result.stderr + result.stdout
        assert "nothing was applied" in result.stderr
        assert own_cluster.get_or_none("clusterrole", "trainingjob-operator") is None
        namespace = own_cluster.get_or_none("namespace", "trainingjob-system")
        assert namespace is None or namespace["metadata"].get("deletionTimestamp")
    finally:
        own_cluster.run(
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            "test-deny-operator-deployment",
            "--ignore-not-found",
        )
        own_cluster.run(
            "delete", "namespace", "trainingjob-system", "--ignore-not-found", "--wait=true", "--timeout=120s"
        )


def test_unreachable_cluster_and_unknown_overlay_fail_clearly(own_cluster: Kubectl, tmp_path: Path) -> None:
    result = make("deploy", tmp_path / "missing-kubeconfig")
    assert result.returncode != 0
    assert "no reachable cluster" in result.stderr
    assert "make dev-cluster" in result.stderr

    result = make("deploy", own_cluster.kubeconfig, OVERLAY="nope")
    assert result.returncode != 0
    assert "no overlay 'nope'" in result.stderr
    assert own_cluster.get_or_none("namespace", "trainingjob-system") is None
