"""The operator's identity as deployed, checked by the API server's own authorizer: the operator's
ServiceAccount may do exactly its API calls (`kubectl auth can-i`, and the calls themselves made
with its token), its kubeconfig authenticates as that account, and the identity objects are the
deployed ones.

Split out of tests/e2e/test_deploy.py (server-side dry runs of deploy/, the chart, the examples).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

import yaml

from builders import configmap, shared
from crd import contract
from crd.defaults import with_defaults
from crd.spec import parse
from tests.cluster import REPO, Kubectl, wait_for
from tests.e2e import deploy_support
from tests.e2e.deploy_support import Manifest, as_list
from tests.e2e.operator_identity import (
    NAMESPACE,
    SERVICE_ACCOUNT,
    USERNAME,
)

# The shared fixtures, bound here so that pytest finds them for this module's tests.
identity = deploy_support.identity
operator = deploy_support.operator


# ------------------------------------------------------------------------------ operator identity


def can_i(kubectl: Kubectl, *args: str) -> bool:
    """`kubectl auth can-i ...` as the user of `kubectl`."""
    result = kubectl.attempt("auth", "can-i", *args)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), f"can-i {' '.join(args)}: {result.stdout} {result.stderr}"
    return answer == "yes"


@dataclass(frozen=True)
class Access:
    """One access question, asked as a SelfSubjectAccessReview.

    Asked directly rather than through `kubectl auth can-i`, which sends `podgroups.scheduling.x-k8s.io`
    as a resource name without group when discovery does not know the group (no PodGroup CRD here).
    """

    verb: str
    resource: str
    group: str = ""
    namespace: str = ""  # "" = every namespace (or a cluster-scoped resource)
    subresource: str = ""
    name: str = ""

    def __str__(self) -> str:
        where = f" -n {self.namespace}" if self.namespace else ""
        what = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{self.verb} {what}{'/' + self.subresource if self.subresource else ''} {self.name}{where}"


def allowed(kubectl: Kubectl, access: Access) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": access.verb,
                "group": access.group,
                "resource": access.resource,
                "subresource": access.subresource,
                "namespace": access.namespace,
                "name": access.name,
            }
        },
    }
    path = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
    answer = json.loads(kubectl.run("create", "--raw", path, "-f", "-", stdin=json.dumps(review)))
    return bool(answer["status"].get("allowed"))


RBAC: Final = "rbac.authorization.k8s.io"
LEASES: Final = "coordination.k8s.io"
JOBS: Final = "ml.example.com"
KUEUE: Final = "kueue.x-k8s.io"
NS: Final = "default"
ALLOWED: Final = (
    Access("create", "pods"),
    Access("delete", "pods", namespace=NS),
    Access("patch", "pods", namespace=NS),
    Access("watch", "pods"),
    Access("list", "trainingjobs", JOBS),
    Access("get", "trainingjobs", JOBS, namespace=NS),
    Access("delete", "trainingjobs", JOBS, namespace=NS),
    Access("patch", "trainingjobs", JOBS, namespace=NS, subresource="status"),
    Access("update", "trainingjobs", JOBS, namespace=NS, subresource="finalizers"),
    Access("create", "services", namespace=NS),
    Access("patch", "configmaps", namespace=NS),
    Access("create", "serviceaccounts", namespace=NS),
    Access("create", "persistentvolumeclaims", namespace=NS),
    Access("patch", "persistentvolumeclaims", namespace=NS),
    Access("create", "events", namespace=NS),
    Access("patch", "events", namespace=NS),
    Access("list", "nodes"),
    Access("watch", "nodes"),
    Access("create", "roles", RBAC, namespace=NS),
    Access("delete", "rolebindings", RBAC, namespace=NS),
    Access("create", "podgroups", "scheduling.x-k8s.io", namespace=NS),
    Access("patch", "podgroups", "scheduling.volcano.sh", namespace=NS),
    Access("create", "workloads", KUEUE, namespace=NS),
    Access("delete", "workloads", KUEUE, namespace=NS),
    Access("patch", "workloads", KUEUE, namespace=NS, subresource="status"),
    Access("watch", "resourceflavors", KUEUE),
    Access("list", "workloadpriorityclasses", KUEUE),
    Access("watch", "priorityclasses", "scheduling.k8s.io"),
    Access("create", "leases", LEASES, namespace=NAMESPACE),
    Access("get", "leases", LEASES, namespace=NAMESPACE, name="trainingjob-operator"),
    Access("update", "leases", LEASES, namespace=NAMESPACE, name="trainingjob-operator"),
)
REFUSED: Final = (
    Access("get", "secrets"),
    Access("list", "secrets"),
    Access("get", "secrets", namespace=NAMESPACE),
    Access("watch", "secrets", namespace=NS),
    Access("create", "clusterroles", RBAC),
    Access("create", "clusterrolebindings", RBAC),
    Access("escalate", "roles", RBAC, namespace=NS),
    Access("bind", "roles", RBAC, namespace=NS),
    Access("impersonate", "serviceaccounts", namespace=NS),
    Access("update", "leases", LEASES, namespace=NAMESPACE, name="some-other-lease"),
    Access("get", "leases", LEASES, namespace=NAMESPACE, name="some-other-lease"),
    Access("delete", "leases", LEASES, namespace=NAMESPACE, name="trainingjob-operator"),
    Access("update", "leases", LEASES, namespace=NS, name="trainingjob-operator"),
    Access("create", "leases", LEASES, namespace=NS),
    Access("delete", "nodes"),
    Access("patch", "nodes"),
    Access("update", "trainingjobs", JOBS, namespace=NS),
    Access("patch", "trainingjobs", JOBS, namespace=NS),
    Access("create", "trainingjobs", JOBS, namespace=NS),
    Access("update", "trainingjobs", JOBS, namespace=NS, subresource="status"),
    Access("update", "pods", namespace=NS),
    Access("create", "pods", namespace=NS, subresource="exec"),
    Access("get", "pods", namespace=NS, subresource="log"),
    Access("create", "pods", namespace=NS, subresource="eviction"),
    Access("create", "serviceaccounts", namespace=NS, subresource="token"),
    Access("delete", "persistentvolumeclaims", namespace=NS),
    Access("create", "deployments", "apps", namespace=NS),
    Access("delete", "namespaces"),
    Access("delete", "customresourcedefinitions", "apiextensions.k8s.io"),
    Access("create", "podgroups", "scheduling.example.org", namespace=NS),
    Access("update", "workloads", KUEUE, namespace=NS, subresource="status"),
    Access("create", "localqueues", KUEUE, namespace=NS),
    Access("create", "clusterqueues", KUEUE),
    Access("patch", "resourceflavors", KUEUE),
    Access("create", "priorityclasses", "scheduling.k8s.io"),
)


def test_operator_may_do_exactly_its_api_calls(operator: Kubectl) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        may = dict(zip(ALLOWED, pool.map(lambda access: allowed(operator, access), ALLOWED), strict=True))
        may_not = dict(zip(REFUSED, pool.map(lambda access: allowed(operator, access), REFUSED), strict=True))
    wrongly_refused = [str(access) for access, answer in may.items() if not answer]
    wrongly_allowed = [str(access) for access, answer in may_not.items() if answer]
    assert not wrongly_refused, f"refused: {wrongly_refused}"
    assert not wrongly_allowed, f"allowed: {wrongly_allowed}"


def test_kubectl_auth_can_i_with_the_operator_kubeconfig(operator: Kubectl) -> None:
    assert can_i(operator, "create", "pods", "--all-namespaces")
    assert can_i(operator, "update", "leases/trainingjob-operator", "-n", NAMESPACE)
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


def test_operator_can_do_what_the_operator_does(cluster: Kubectl, operator: Kubectl, namespace: str) -> None:
    """Real requests with the operator's token: the namespace's trainer RBAC (which RBAC only lets it
    create because it holds patch on pods itself) and trainer sources, the status subresource,
    deleting the shared objects again; and the refusals (Secrets, spec, granting rights it does not
    hold)."""
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
    for kind in ("rolebinding", "role", "serviceaccount"):
        operator.run("delete", kind, contract.TRAINER_ACCOUNT, "-n", namespace)
    operator.run("delete", "configmap", configmap.TRAINER_SOURCES_NAME, "-n", namespace)

    refused_spec = operator.attempt(
        "patch", "trainingjob", name, "-n", namespace, "--type=merge", "-p", '{"spec": {"numWorkers": 3}}'
    )
    assert refused_spec.returncode != 0
    assert "forbidden" in refused_spec.stderr.lower()
    secrets = operator.attempt("get", "secrets", "-n", namespace)
    assert secrets.returncode != 0
    assert "forbidden" in secrets.stderr.lower()
    greedy_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "reads-secrets", "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    escalation = operator.attempt("create", "-f", "-", stdin=json.dumps(greedy_role))
    assert escalation.returncode != 0
    assert "not currently held" in escalation.stderr or "escalat" in escalation.stderr, escalation.stderr


def test_identity_objects_are_the_deployed_ones(cluster: Kubectl, identity: list[Manifest]) -> None:
    kinds = sorted(obj["kind"] for obj in identity)
    assert kinds == sorted(
        ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    )
    live = cluster.get_json("clusterrole", "trainingjob-operator")
    (rendered,) = [obj for obj in identity if obj["kind"] == "ClusterRole"]
    assert live["rules"] == rendered["rules"]
    assert cluster.get_or_none("serviceaccount", SERVICE_ACCOUNT, "-n", NAMESPACE) is not None
