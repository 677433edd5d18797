"""The access questions the deployed-identity tests ask (tests/e2e/test_deploy_identity_e2e.py): the
operator's API calls as the RBAC test keeps them (tests/unit/manifests_support.py), what it must be
refused wherever it runs, and asking them with `kubectl auth can-i ... --as=<user>` (a
SubjectAccessReview for the groups the session's cluster does not serve).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from controller.resources import GUARD_POLICIES
from crd import contract
from testbed import Kubectl
from tests.e2e.operator_identity import NAMESPACE, OPERATOR_POLICIES
from tests.unit.manifests_support import CLUSTER_SCOPED_RULES, NAMED_OPERATOR_RULES, OPERATOR_RULES


@dataclass(frozen=True)
class Access:
    """One access question: may `user` do `verb` on `resource` (in `namespace`, "" = every namespace or
    a cluster-scoped resource; `name`, "" = any)."""

    verb: str
    resource: str
    group: str = ""
    namespace: str = ""
    subresource: str = ""
    name: str = ""

    def __str__(self) -> str:
        where = f" -n {self.namespace}" if self.namespace else ""
        what = f"{self.resource}.{self.group}" if self.group else self.resource
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.verb} {what}{sub}{'/' + self.name if self.name else ''}{where}"


RBAC: Final = "rbac.authorization.k8s.io"
LEASES: Final = "coordination.k8s.io"
POLICIES: Final = "admissionregistration.k8s.io"
KUEUE: Final = "kueue.x-k8s.io"
NS: Final = "default"
LEASE: Final = "trainingjob-operator"  # the Lease deploy/ names (--lease-name)
# Groups the session's cluster serves without optional components: `kubectl auth can-i` resolves their
# resources through discovery. For the others (a gang scheduler's, Kueue's) it would send the resource
# without its group, so those are asked as a SubjectAccessReview (what can-i sends, with the group).
SERVED: Final = frozenset({"", RBAC, LEASES, POLICIES, "ml.example.com", "scheduling.k8s.io"})


def operator_calls(namespace: str) -> list[Access]:
    """Every call of the operator's list (tests/unit/manifests_support.py), asked in `namespace` (""
    for every namespace), the cluster-scoped reads, and the policies it watches by name."""
    accesses = []
    for group, resource, verbs in OPERATOR_RULES:
        plural, _, subresource = resource.partition("/")
        accesses += [Access(verb, plural, group, namespace, subresource) for verb in verbs]
    for group, resource, verbs, name in NAMED_OPERATOR_RULES:
        accesses += [Access(verb, resource, group, namespace, name=name) for verb in verbs]
    for group, resource, verbs in CLUSTER_SCOPED_RULES:
        accesses += [Access(verb, resource, group) for verb in verbs]
    for policy in GUARD_POLICIES:
        for resource in ("validatingadmissionpolicies", "validatingadmissionpolicybindings"):
            accesses += [Access(verb, resource, POLICIES, name=policy) for verb in ("list", "watch")]
    return accesses


def lease_calls(lease: str) -> list[Access]:
    return [
        Access("create", "leases", LEASES, namespace=NAMESPACE),
        Access("get", "leases", LEASES, namespace=NAMESPACE, name=lease),
        Access("update", "leases", LEASES, namespace=NAMESPACE, name=lease),
    ]


def refused_anywhere(namespace: str, lease: str) -> list[Access]:
    """What the operator may not do in `namespace` (where it runs jobs), nor anywhere else."""
    return [
        # Secrets, never.
        Access("get", "secrets"),
        Access("list", "secrets"),
        Access("get", "secrets", namespace=NAMESPACE),
        Access("watch", "secrets", namespace=namespace),
        # No rights on Roles at all, and no binding of anything but the trainers' ClusterRole.
        *(Access(verb, "roles", RBAC, namespace) for verb in ("get", "list", "create", "patch", "delete")),
        Access("delete", "roles", RBAC, namespace, name=contract.TRAINER_ACCOUNT),
        Access("bind", "roles", RBAC, namespace=namespace),
        Access("bind", "clusterroles", RBAC, namespace, name="admin"),
        Access("bind", "clusterroles", RBAC, namespace, name="cluster-admin"),
        Access("bind", "clusterroles", RBAC, namespace, name="edit"),
        Access("bind", "clusterroles", RBAC, namespace),
        Access("escalate", "clusterroles", RBAC, name=contract.TRAINER_CLUSTER_ROLE),
        Access("escalate", "roles", RBAC, namespace=namespace),
        Access("create", "clusterroles", RBAC),
        Access("create", "clusterrolebindings", RBAC),
        Access("impersonate", "serviceaccounts", namespace=namespace),
        # The trainer account and its RoleBinding by name only.
        Access("list", "serviceaccounts", namespace=namespace),
        Access("get", "serviceaccounts", namespace=namespace, name="default"),
        Access("delete", "serviceaccounts", namespace=namespace, name="default"),
        Access("patch", "serviceaccounts", namespace=namespace, name=contract.TRAINER_ACCOUNT),
        Access("create", "serviceaccounts", namespace=namespace, subresource="token"),
        Access("list", "rolebindings", RBAC, namespace),
        Access("patch", "rolebindings", RBAC, namespace, name="admin-binding"),
        Access("delete", "rolebindings", RBAC, namespace, name="admin-binding"),
        # The admission policies: the guard policies by name, read-only; nothing else.
        Access("list", "validatingadmissionpolicies", POLICIES),
        Access("get", "validatingadmissionpolicies", POLICIES, name=contract.IMMUTABLE_SPEC_POLICY),
        Access("get", "validatingadmissionpolicies", POLICIES, name=contract.TRAINER_POLICY),
        Access("delete", "validatingadmissionpolicies", POLICIES, name=contract.TRAINER_POLICY),
        Access("delete", "validatingadmissionpolicybindings", POLICIES, name=contract.TRAINER_POLICY),
        Access("patch", "validatingadmissionpolicybindings", POLICIES, name=contract.TRAINER_POLICY),
        Access("create", "validatingadmissionpolicies", POLICIES),
        Access("patch", "validatingadmissionpolicies", POLICIES, name=OPERATOR_POLICIES[0]),
        Access("delete", "validatingadmissionpolicybindings", POLICIES, name=OPERATOR_POLICIES[0]),
        # Its Lease only, in its own namespace only.
        Access("update", "leases", LEASES, namespace=NAMESPACE, name="some-other-lease"),
        Access("get", "leases", LEASES, namespace=NAMESPACE, name="some-other-lease"),
        Access("delete", "leases", LEASES, namespace=NAMESPACE, name=lease),
        Access("update", "leases", LEASES, namespace=namespace, name=lease),
        Access("create", "leases", LEASES, namespace=namespace),
        # Nodes, the jobs' specs, the pods' other subresources, anything else.
        Access("delete", "nodes"),
        Access("patch", "nodes"),
        Access("update", "trainingjobs", "ml.example.com", namespace=namespace),
        Access("patch", "trainingjobs", "ml.example.com", namespace=namespace),
        Access("create", "trainingjobs", "ml.example.com", namespace=namespace),
        Access("update", "trainingjobs", "ml.example.com", namespace=namespace, subresource="status"),
        Access("update", "pods", namespace=namespace),
        Access("create", "pods", namespace=namespace, subresource="exec"),
        Access("get", "pods", namespace=namespace, subresource="log"),
        Access("create", "pods", namespace=namespace, subresource="eviction"),
        Access("delete", "persistentvolumeclaims", namespace=namespace),
        Access("create", "deployments", "apps", namespace=namespace),
        Access("delete", "namespaces"),
        Access("delete", "customresourcedefinitions", "apiextensions.k8s.io"),
        Access("create", "podgroups", "scheduling.example.org", namespace=namespace),
        Access("update", "workloads", KUEUE, namespace=namespace, subresource="status"),
        Access("create", "localqueues", KUEUE, namespace=namespace),
        Access("create", "clusterqueues", KUEUE),
        Access("patch", "resourceflavors", KUEUE),
        Access("create", "priorityclasses", "scheduling.k8s.io"),
    ]


def may(admin: Kubectl, user: str, access: Access) -> bool:
    """`kubectl auth can-i ... --as=<user>`, or for a group the cluster does not serve the
    SubjectAccessReview it stands for."""
    groups = (
        "system:serviceaccounts",
        f"system:serviceaccounts:{user.split(':')[2]}",
        "system:authenticated",
    )
    if access.group in SERVED:
        what = f"{access.resource}.{access.group}" if access.group else access.resource
        args = [
            "auth",
            "can-i",
            access.verb,
            f"{what}/{access.name}" if access.name else what,
            f"--as={user}",
        ]
        if access.subresource:
            args.append(f"--subresource={access.subresource}")
        if access.namespace:
            args += ["-n", access.namespace]
        elif access.resource not in CLUSTER_SCOPED:
            args.append("--all-namespaces")
        result = admin.attempt(*args)
        answer = result.stdout.strip()
        assert answer in ("yes", "no"), f"can-i {' '.join(args)}: {result.stdout} {result.stderr}"
        return answer == "yes"
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": list(groups),
            "resourceAttributes": {
                "verb": access.verb,
                "group": access.group,
                "resource": access.resource,
                "subresource": access.subresource,
                "namespace": access.namespace,
                "name": access.name,
            },
        },
    }
    answer = json.loads(admin.run("create", "-f", "-", "-o", "json", stdin=json.dumps(review)))
    return bool(answer["status"].get("allowed"))


CLUSTER_SCOPED: Final = frozenset(
    {
        "nodes",
        "namespaces",
        "clusterroles",
        "clusterrolebindings",
        "customresourcedefinitions",
        "priorityclasses",
        "resourceflavors",
        "workloadpriorityclasses",
        "clusterqueues",
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    }
)


def answers(admin: Kubectl, user: str, accesses: list[Access]) -> dict[Access, bool]:
    with ThreadPoolExecutor(max_workers=8) as pool:
        return dict(zip(accesses, pool.map(lambda access: may(admin, user, access), accesses), strict=True))


def check(admin: Kubectl, user: str, allowed: list[Access], refused: list[Access]) -> None:
    granted = answers(admin, user, allowed)
    denied = answers(admin, user, refused)
    wrongly_refused = [str(access) for access, answer in granted.items() if not answer]
    wrongly_allowed = [str(access) for access, answer in denied.items() if answer]
    assert not wrongly_refused, f"refused: {wrongly_refused}"
    assert not wrongly_allowed, f"allowed: {wrongly_allowed}"
