"""The operator's identity as deployed, checked by the API server's own authorizer and admission: the
operator's ServiceAccount may do each of its API calls (the list tests/unit/test_manifests_rbac.py
keeps the RBAC equal to), asked with `kubectl auth can-i ... --as=system:serviceaccount:<ns>:<sa>`, and
nothing else it is asked (Roles, Secrets, other names, binding any other ClusterRole, other
namespaces), for the cluster-wide install and for the single-namespace one; its kubeconfig
authenticates as that account; real requests with its token do what the operator does and are refused
what the admission policies on its writes refuse (deploy/base/operator-writes-policy.yaml).

Split out of tests/e2e/test_deploy.py (server-side dry runs of deploy/, the chart, the examples).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Final

import pytest
import yaml

from builders import configmap, shared
from crd import contract
from crd.defaults import with_defaults
from crd.spec import parse
from testbed import Kubectl, wait_for
from tests.cluster import REPO
from tests.e2e import deploy_support
from tests.e2e.deploy_support import Manifest, as_list
from tests.e2e.identity_support import (
    LEASE,
    NS,
    RBAC,
    check,
    lease_calls,
    operator_calls,
    refused_anywhere,
)
from tests.e2e.operator_identity import (
    NAMESPACE,
    OPERATOR_POLICIES,
    SERVICE_ACCOUNT,
    USERNAME,
    identity_objects,
    render,
)

# The shared fixtures, bound here so that pytest finds them for this module's tests.
identity = deploy_support.identity
operator = deploy_support.operator


# ------------------------------------------------------------------------ the cluster-wide install


@pytest.mark.usefixtures("identity")
def test_the_operator_may_do_each_of_its_calls_everywhere_and_nothing_else(cluster: Kubectl) -> None:
    calls = operator_calls(NS)
    allowed = [*calls, *(replace(access, namespace="") for access in calls), *lease_calls(LEASE)]
    check(cluster, USERNAME, allowed, refused_anywhere(NS, LEASE))


# ------------------------------------------------------------------------ the single-namespace install

SINGLE: Final = "trainingjob-single"  # the names of the single-namespace install's identity objects


def single_namespace_identity(watched: str) -> list[Manifest]:
    """The single-namespace overlay's identity objects, aimed at `watched` and renamed (SINGLE) so that
    they stand beside the cluster-wide install's, which the session's other tests use."""
    objects = identity_objects(render(REPO / "deploy" / "overlays" / "single-namespace"))

    def renamed(name: str) -> str:
        prefix = "trainingjob-operator"
        return SINGLE + name.removeprefix(prefix) if name.startswith(prefix) else name

    result = []
    for obj in copy.deepcopy(objects):
        meta = obj["metadata"]
        if (
            obj["kind"] == "Namespace"
            or meta["name"] in OPERATOR_POLICIES
            or renamed(meta["name"]) == meta["name"]
        ):
            continue  # its namespace, the policies on the default install's writes, the trainers' role
        meta["name"] = renamed(meta["name"])
        if obj["kind"] in ("Role", "RoleBinding") and meta.get("namespace") != NAMESPACE:
            meta["namespace"] = watched
        if "roleRef" in obj:
            obj["roleRef"]["name"] = renamed(obj["roleRef"]["name"])
        for subject in obj.get("subjects") or []:
            subject["name"] = renamed(subject["name"])
        result.append(obj)
    return result


@pytest.fixture
def single_namespace(cluster: Kubectl, namespace: str) -> Iterator[str]:
    """The single-namespace install's identity, watching the test's namespace; its user name."""
    objects = single_namespace_identity(namespace)
    cluster.run("apply", "-f", "-", stdin=as_list(objects))
    try:
        yield f"system:serviceaccount:{NAMESPACE}:{SINGLE}"
    finally:
        cluster.run(
            "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=as_list(objects), check=False
        )


@pytest.mark.usefixtures("identity")
def test_the_single_namespace_install_may_do_its_calls_in_its_namespace_only(
    cluster: Kubectl, namespace: str, single_namespace: str
) -> None:
    calls = operator_calls(namespace)
    namespaced = [access for access in calls if access.namespace]
    elsewhere = [replace(access, namespace=other) for access in namespaced for other in (NS, "kube-system")]
    everywhere = [replace(access, namespace="") for access in namespaced]
    check(
        cluster,
        single_namespace,
        [*calls, *lease_calls(LEASE)],
        [*elsewhere, *everywhere, *refused_anywhere(namespace, LEASE)],
    )


# ------------------------------------------------------------------------------- real requests


def can_i(kubectl: Kubectl, *args: str) -> bool:
    """`kubectl auth can-i ...` as the user of `kubectl`."""
    result = kubectl.attempt("auth", "can-i", *args)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {' '.join(args)}: {result.stdout} {result.stderr}"
    return answer == "yes"


def test_kubectl_auth_can_i_with_the_operator_kubeconfig(operator: Kubectl) -> None:
    assert can_i(operator, "create", "pods", "--all-namespaces")
    assert can_i(operator, "update", "leases/trainingjob-operator", "-n", NAMESPACE)
    assert can_i(operator, "bind", f"clusterroles/{contract.TRAINER_CLUSTER_ROLE}", "-n", NS)
    assert not can_i(operator, "bind", "clusterroles/admin", "-n", NS)
    assert not can_i(operator, "create", "roles", "-n", NS)
    assert not can_i(operator, "get", "secrets", "--all-namespaces")
    assert not can_i(operator, "list", "secrets", "--all-namespaces")
    assert not can_i(operator, "create", "clusterroles")
    assert not can_i(operator, "update", "leases/some-other-lease", "-n", NAMESPACE)
    assert not can_i(operator, "delete", "nodes")


def test_operator_kubeconfig_authenticates_as_the_service_account(operator: Kubectl) -> None:
    review = json.loads(operator.run("auth", "whoami", "-o", "json"))
    assert review["status"]["userInfo"]["username"] == USERNAME
    assert f"system:serviceaccounts:{NAMESPACE}" in review["status"]["userInfo"]["groups"]
    config = json.loads(operator.kubeconfig.read_text(encoding="utf-8"))
    assert [set(user["user"]) for user in config["users"]] == [{"token"}], "a bearer token, nothing else"
    assert operator.kubeconfig.stat().st_mode & 0o077 == 0, "the token file is private"


def labelled(kind: str, name: str, api_version: str = "v1", **fields: object) -> Manifest:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "labels": {contract.MANAGED_BY_LABEL: contract.MANAGED_BY_VALUE}},
        **fields,
    }


def refused(kubectl: Kubectl, *args: str, stdin: str | None = None) -> str:
    """The refusal of a request (its stderr), failing the test if it went through."""
    result = kubectl.attempt(*args, stdin=stdin)
    assert result.returncode != 0, f"{args} went through: {result.stdout}"
    assert "forbidden" in result.stderr.lower(), result.stderr
    return result.stderr


def test_operator_can_do_what_the_operator_does(cluster: Kubectl, operator: Kubectl, namespace: str) -> None:
    """Real requests with the operator's token: the namespace's trainer account and its RoleBinding to
    the trainers' ClusterRole (which it may bind, holding none of the rights it grants) and the
    trainer sources, the status subresource, deleting the shared objects again; and the refusals
    (Secrets, spec, Roles, granting another ClusterRole)."""
    manifest = yaml.safe_load((REPO / "examples" / "trainingjob-simple.yaml").read_text(encoding="utf-8"))
    manifest["metadata"]["namespace"] = namespace
    created = json.loads(cluster.run("create", "-f", "-", "-o", "json", stdin=json.dumps(manifest)))
    job = with_defaults(created)

    operator.run("create", "-f", "-", stdin=as_list(shared.build_shared(parse(job))))
    name = job["metadata"]["name"]
    operator.run(
        "patch", "trainingjob", name, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"message": "patched by the operator's identity"}}),
    )  # fmt: skip
    assert wait_for(
        "status written",
        lambda: cluster.get_json("trainingjob", name, "-n", namespace).get("status", {}).get("message"),
        timeout=30,
    )
    for kind in ("rolebinding", "serviceaccount"):
        operator.run("delete", kind, contract.TRAINER_ACCOUNT, "-n", namespace)
    operator.run("delete", "configmap", configmap.TRAINER_SOURCES_NAME, "-n", namespace)

    refused(
        operator,
        "patch",
        "trainingjob",
        name,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec": {"numWorkers": 3}}',
    )
    refused(operator, "get", "secrets", "-n", namespace)
    greedy_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "reads-secrets", "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    refused(operator, "create", "-f", "-", stdin=json.dumps(greedy_role))
    admin_binding = {
        **shared.build_role_binding(parse(job)),
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "admin"},
    }
    message = refused(operator, "create", "-f", "-", stdin=json.dumps(admin_binding))
    assert "bind" in message or "escalat" in message, message


@pytest.mark.usefixtures("identity")
def test_the_operator_writes_only_what_it_labels_and_never_in_the_system_namespaces(
    cluster: Kubectl, operator: Kubectl, namespace: str
) -> None:
    """What RBAC cannot refuse, the admission policies on the operator's writes do (real requests with
    its token, server-side dry runs where the write would go through)."""
    cluster.run("create", "configmap", "tenants-own", "-n", namespace, "--from-literal=a=b")
    cluster.run("create", "serviceaccount", "powerful", "-n", namespace)
    policy = OPERATOR_POLICIES[0]

    def writes_refused() -> bool:
        result = operator.attempt("delete", "configmap", "tenants-own", "-n", namespace, "--dry-run=server")
        return result.returncode != 0 and policy in result.stderr

    wait_for("the policy on the operator's writes in force", writes_refused, timeout=30)
    dry = ("--dry-run=server", "-f", "-")
    unlabelled_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    cases = {
        "delete a tenant's ConfigMap": (
            ("delete", "configmap", "tenants-own", "-n", namespace, "--dry-run=server"),
            None,
        ),
        "relabel it": (
            (
                "label",
                "configmap",
                "tenants-own",
                "-n",
                namespace,
                f"{contract.MANAGED_BY_LABEL}={contract.MANAGED_BY_VALUE}",
                "--dry-run=server",
            ),
            None,
        ),
        "create an unlabelled pod": (("create", "-n", namespace, *dry), json.dumps(unlabelled_pod)),
        "create a labelled ConfigMap in kube-system": (
            ("create", "-n", "kube-system", *dry),
            json.dumps(labelled("ConfigMap", "c")),
        ),
        "create a labelled Service in kube-public": (
            ("create", "-n", "kube-public", *dry),
            json.dumps(labelled("Service", "s", spec={"ports": [{"port": 80}]})),
        ),
        "create another ServiceAccount": (
            ("create", "-n", namespace, *dry),
            json.dumps(labelled("ServiceAccount", "other")),
        ),
        "bind the trainers' ClusterRole to someone else": (
            ("create", "-n", namespace, *dry),
            json.dumps(
                labelled(
                    "RoleBinding",
                    contract.TRAINER_ACCOUNT,
                    f"{RBAC}/v1",
                    roleRef={"apiGroup": RBAC, "kind": "ClusterRole", "name": contract.TRAINER_CLUSTER_ROLE},
                    subjects=[{"kind": "ServiceAccount", "name": "powerful", "namespace": namespace}],
                )
            ),
        ),
    }
    for what, (args, stdin) in cases.items():
        message = refused(operator, *args, stdin=stdin)
        assert "ValidatingAdmissionPolicy 'trainingjob-operator-" in message, (what, message)
    # What the operator does goes through.
    example = yaml.safe_load((REPO / "examples" / "trainingjob-simple.yaml").read_text(encoding="utf-8"))
    job = with_defaults({**example, "metadata": {"name": "x", "namespace": namespace, "uid": "u"}})
    operator.run("create", "-n", namespace, *dry, stdin=as_list(shared.build_shared(parse(job))))


def test_identity_objects_are_the_deployed_ones(cluster: Kubectl, identity: list[Manifest]) -> None:
    assert identity == identity_objects(render(REPO / "deploy"))
    names = {(obj["kind"], obj["metadata"]["name"]) for obj in identity}
    assert {
        ("Namespace", NAMESPACE),
        ("ServiceAccount", SERVICE_ACCOUNT),
        ("ClusterRole", "trainingjob-operator"),
        ("ClusterRole", contract.TRAINER_CLUSTER_ROLE),
        ("ClusterRoleBinding", "trainingjob-operator"),
        ("Role", "trainingjob-operator-leader-election"),
        ("RoleBinding", "trainingjob-operator-leader-election"),
        *(("ValidatingAdmissionPolicy", name) for name in OPERATOR_POLICIES),
        *(("ValidatingAdmissionPolicyBinding", name) for name in OPERATOR_POLICIES),
    } <= names
    for rendered in (obj for obj in identity if obj["kind"] == "ClusterRole"):
        live = cluster.get_json("clusterrole", rendered["metadata"]["name"])
        assert live["rules"] == rendered["rules"]
    assert cluster.get_or_none("serviceaccount", SERVICE_ACCOUNT, "-n", NAMESPACE) is not None
    for name in OPERATOR_POLICIES:
        assert cluster.get_or_none("validatingadmissionpolicybinding", name) is not None


def test_the_single_namespace_identity_is_renamed_consistently() -> None:
    objects = single_namespace_identity("watched")
    names = {(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace")) for obj in objects}
    assert ("Role", SINGLE, "watched") in names
    assert ("ClusterRole", SINGLE, None) in names
    assert ("ServiceAccount", SINGLE, NAMESPACE) in names
    assert all(obj["metadata"]["name"].startswith(SINGLE) for obj in objects)
