"""Checks of the RBAC in deploy/: no wildcards, no Secrets and no rights on Roles anywhere, and the
rights the operator's ServiceAccount ends up with equal exactly the operator's list of API calls
(OPERATOR_RULES and NAMED_OPERATOR_RULES in tests/unit/manifests_support.py), cluster-wide and in the
single-namespace overlay; the trainers' ClusterRole is the one the operator may bind; the admission
policies on the operator's writes name the account it runs as; the Deployment's arguments parse with
the operator's own CLI.

Split out of tests/unit/test_manifests.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from crd import contract
from tests.cluster import REPO
from tests.e2e.operator_identity import DEPLOY, NAMESPACE, OPERATOR_POLICIES
from tests.unit.manifests_support import (
    ANY_NAME,
    CLUSTER,
    CLUSTER_SCOPED_RULES,
    HEALTH_PORT,
    LEASE_NAME,
    METRICS_PORT,
    METRICS_READER,
    METRICS_READER_RULE,
    OPERATOR_RULES,
    TARGETS,
    TRAINER_BIND,
    Manifest,
    Permission,
    arg_value,
    container,
    effective_permissions,
    lease_permissions,
    metrics_auth_permissions,
    named_permissions,
    of_kind,
    one,
    permissions,
    policy_permissions,
    rendered,
    role_violations,
    rule_violations,
    rules_anywhere,
    watched_namespace,
    yaml_documents_under,
)

# ------------------------------------------------------------------------------------------- RBAC


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"apiGroups": ["*"], "resources": ["pods"], "verbs": ["get"]}, "wildcard in apiGroups"),
        ({"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}, "wildcard in resources"),
        ({"apiGroups": [""], "resources": ["pods/*"], "verbs": ["get"]}, "wildcard in resources"),
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}, "wildcard in verbs"),
        ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}, "grants secrets"),
        ({"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["list"]}, "grants secrets"),
        (
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]},
            "escalating",
        ),
        ({"nonResourceURLs": ["/metrics"], "verbs": ["get", "post"]}, "nonResourceURLs"),
        ({"nonResourceURLs": ["/healthz"], "verbs": ["get"]}, "nonResourceURLs"),
        (
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"]},
            "escalating",
        ),
        (
            {
                "apiGroups": ["rbac.authorization.k8s.io"],
                "resources": ["clusterroles"],
                "resourceNames": ["admin"],
                "verbs": ["bind"],
            },
            "escalating",
        ),
        (
            {
                "apiGroups": ["rbac.authorization.k8s.io"],
                "resources": ["clusterroles"],
                "resourceNames": ["trainingjob-trainer"],
                "verbs": ["bind", "escalate"],
            },
            "escalating",
        ),
        ({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["get"]}, "roles"),
    ],
)
def test_rbac_checker_catches(rule: Manifest, expected: str) -> None:
    assert any(expected in problem for problem in rule_violations(rule))


def test_the_checker_lets_the_one_bind_through() -> None:
    assert rule_violations(dict(TRAINER_BIND)) == []


def test_no_role_in_deploy_has_wildcards_or_secrets() -> None:
    """Every rule anywhere under deploy/ (roles, patches) and in every rendered target: no wildcards, no
    Secrets, no rights on Roles, no escalating verb but `bind` on the trainers' ClusterRole by name."""
    problems = [
        f"{path.relative_to(REPO)}: {problem}"
        for path, doc in yaml_documents_under(DEPLOY)
        for rule in rules_anywhere(doc)
        for problem in rule_violations(rule)
    ]
    for target in TARGETS:
        for obj in of_kind(rendered(target), "ClusterRole", "Role"):
            problems.extend(f"{target}: {problem}" for problem in role_violations(obj))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("target", [t for t in TARGETS if not t.endswith("single-namespace")])
def test_cluster_wide_rbac_is_exactly_the_operators_api_calls(target: str) -> None:
    expected = (
        permissions(CLUSTER, OPERATOR_RULES)
        | named_permissions(CLUSTER)
        | permissions(CLUSTER, CLUSTER_SCOPED_RULES)
        | policy_permissions()
        | lease_permissions()
        | metrics_auth_permissions()
    )
    granted = effective_permissions(rendered(target))
    assert granted == expected, (
        f"more than needed: {sorted(granted - expected)}\nmissing: {sorted(expected - granted)}"
    )


def test_single_namespace_rbac_is_exactly_the_operators_api_calls_in_that_namespace() -> None:
    objects = rendered("deploy/overlays/single-namespace")
    target = watched_namespace(objects)
    assert target
    assert target != NAMESPACE
    expected = (
        permissions(target, OPERATOR_RULES)
        | named_permissions(target)
        | permissions(CLUSTER, CLUSTER_SCOPED_RULES)
        | policy_permissions()
        | lease_permissions()
        | metrics_auth_permissions()
    )
    granted = effective_permissions(objects)
    assert granted == expected, (
        f"more than needed: {sorted(granted - expected)}\nmissing: {sorted(expected - granted)}"
    )


def test_single_namespace_names_the_watched_namespace_once() -> None:
    objects = rendered("deploy/overlays/single-namespace")
    role = one(objects, "Role", "trainingjob-operator")
    binding = one(objects, "RoleBinding", "trainingjob-operator")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    assert watched_namespace(objects) == role["metadata"]["namespace"]
    assert "--namespace=$(WATCH_NAMESPACE)" in container(objects)["args"]
    clusterrole = one(objects, "ClusterRole", "trainingjob-operator")
    # Outside the watched namespace: reads of cluster-scoped objects, and the policy check by name.
    assert permissions(CLUSTER, CLUSTER_SCOPED_RULES) | policy_permissions() == {
        Permission(CLUSTER, group, resource, verb, name)
        for rule in clusterrole["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [ANY_NAME]
    }
    assert not any(obj["metadata"].get("namespace") == "WATCHED-NAMESPACE" for obj in objects)


# How the docs name each resource the single-namespace ClusterRole keeps (a policy and its binding go
# together).
DOCUMENTED_AS = {
    "nodes": "nodes",
    "priorityclasses": "priority classes",
    "resourceflavors": "ResourceFlavors",
    "workloadpriorityclasses": "WorkloadPriorityClasses",
    "multikueueclusters": "MultiKueueClusters",
    "queues": "Volcano's Queues",
    "validatingadmissionpolicies": "admission policies",
    "validatingadmissionpolicybindings": "admission policies",
}


def single_namespace_texts() -> dict[str, str]:
    """What deploy/README.md (the overlay's bullet, the chart's `watchNamespace` row) and the component's
    kustomization say the single-namespace ClusterRole keeps."""
    readme = (REPO / "deploy" / "README.md").read_text()
    bullet = readme[readme.index("  - `single-namespace`:") :].split("\n- ", 1)[0]
    row = next(line for line in readme.splitlines() if line.startswith("| `watchNamespace` |"))
    component = REPO / "deploy" / "components" / "single-namespace" / "kustomization.yaml"
    comment = " ".join(
        line.lstrip("# ") for line in component.read_text().split("apiVersion:", 1)[0].splitlines()
    )
    return {
        "deploy/README.md single-namespace": bullet,
        "deploy/README.md watchNamespace": row,
        "component": comment,
    }


def test_the_docs_name_every_cluster_scoped_read_of_the_single_namespace_install() -> None:
    clusterrole = one(rendered("deploy/overlays/single-namespace"), "ClusterRole", "trainingjob-operator")
    kept = {resource for rule in clusterrole["rules"] for resource in rule["resources"]}
    assert kept == set(DOCUMENTED_AS)
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in clusterrole["rules"])
    missing = {
        where: [
            DOCUMENTED_AS[resource]
            for resource in sorted(kept)
            if DOCUMENTED_AS[resource] not in " ".join(text.split())
        ]
        for where, text in single_namespace_texts().items()
    }
    assert not any(missing.values()), missing


def test_lease_role_matches_the_lease_the_deployment_uses() -> None:
    objects = rendered("deploy")
    args = container(objects)["args"]
    assert "--leader-elect" in args
    lease = arg_value(args, "--lease-name") or LEASE_NAME
    role = one(objects, "Role", "trainingjob-operator-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert named
    assert all(rule["resourceNames"] == [lease] for rule in named)


def operator_cli() -> Any:
    """controller.cli, or a skip while the entry point does not exist yet."""
    return pytest.importorskip("controller.cli", reason="controller/cli.py does not exist yet")


@pytest.mark.parametrize("target", TARGETS)
def test_deployment_args_parse_with_the_operators_cli(target: str) -> None:
    """The flags deploy/ passes exist, and mean what the RBAC and Service assume."""
    cli = operator_cli()
    objects = rendered(target)
    operator = container(objects)
    env = {item["name"]: item.get("value", "") for item in operator.get("env", [])}
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in operator["args"]]
    parsed = cli.parser().parse_args(args)
    assert parsed.leader_elect is True
    assert parsed.metrics_bind_address == f":{METRICS_PORT}"
    assert parsed.health_probe_bind_address == f":{HEALTH_PORT}"
    assert parsed.metrics_secure is True
    assert parsed.metrics_addr is None, "not the deprecated flag"
    assert parsed.lease_namespace is None, "the lease lives in the pod's namespace (POD_NAMESPACE)"
    role = one(objects, "Role", "trainingjob-operator-leader-election")
    names = {name for rule in role["rules"] for name in rule.get("resourceNames", [])}
    assert names == {parsed.lease_name}
    assert parsed.namespace == watched_namespace(objects)
    assert cli.parser().get_default("metrics_bind_address") == f":{METRICS_PORT}", "EXPOSE assumes it"
    assert cli.parser().get_default("health_probe_bind_address") == f":{HEALTH_PORT}", "EXPOSE too"


@pytest.mark.parametrize("target", TARGETS)
def test_the_operator_binds_the_trainers_cluster_role_which_allows_patching_pods_and_reading_jobs_only(
    target: str,
) -> None:
    """Trainers patch pods (narrowed by the admission policy to two annotations of their own pod) and
    read TrainingJobs (an in-place restart's supervisor watches its job); nothing else, no pod reads."""
    objects = rendered(target)
    trainer = one(objects, "ClusterRole", contract.TRAINER_CLUSTER_ROLE)
    assert trainer["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
        {"apiGroups": [contract.GROUP], "resources": [contract.PLURAL], "verbs": ["get", "list", "watch"]},
    ]
    binds = {
        permission
        for permission in effective_permissions(objects)
        if permission.verb in ("bind", "escalate", "impersonate")
    }
    assert {(p.resource, p.name) for p in binds} == {("clusterroles", contract.TRAINER_CLUSTER_ROLE)}


@pytest.mark.parametrize("target", TARGETS)
def test_the_write_policies_name_the_account_the_operator_runs_as(target: str) -> None:
    """The admission policies on the operator's writes apply to its ServiceAccount: a policy that named
    another account would limit nothing."""
    objects = rendered(target)
    deployment = one(objects, "Deployment", "trainingjob-operator")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    username = f"system:serviceaccount:{deployment['metadata']['namespace']}:{account}"
    policies = {
        obj["metadata"]["name"]: obj
        for obj in of_kind(objects, "ValidatingAdmissionPolicy")
        if obj["metadata"]["name"] in OPERATOR_POLICIES
    }
    assert set(policies) == set(OPERATOR_POLICIES)
    for policy in policies.values():
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == f'request.userInfo.username == "{username}"'
    bindings = {obj["metadata"]["name"]: obj for obj in of_kind(objects, "ValidatingAdmissionPolicyBinding")}
    for name in OPERATOR_POLICIES:
        assert bindings[name]["spec"] == {"policyName": name, "validationActions": ["Deny"]}


def test_the_checker_lets_the_metrics_reader_rule_through() -> None:
    assert rule_violations(dict(METRICS_READER_RULE)) == []


@pytest.mark.parametrize("target", TARGETS)
def test_the_metrics_reader_is_shipped_unbound_with_the_one_right_the_endpoint_checks(target: str) -> None:
    """Whoever scrapes /metrics gets this ClusterRole bound to its account; the install binds it to no
    one, and the operator's own account gets no right on /metrics."""
    objects = rendered(target)
    reader = one(objects, "ClusterRole", METRICS_READER)
    assert reader["rules"] == [METRICS_READER_RULE]
    bindings = of_kind(objects, "ClusterRoleBinding", "RoleBinding")
    assert METRICS_READER not in {binding["roleRef"]["name"] for binding in bindings}
