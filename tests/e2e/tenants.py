"""Real users of the local cluster, for tests of what a tenant may and may not do.

Why not `kubectl --as`: impersonation is the admin acting, and the API server's authorizer and the
admission policies should see a requester exactly as a tenant's kubectl would present one. Each user
here has a client certificate signed by the cluster's CA (`Cluster.user_kubeconfig` of the testbed,
in a directory of the test's own), so the API server authenticates the certificate's
CN as the user name and its O entries as groups; a RoleBinding gives the user what a test grants.

Usage::

    user = tenant_user(cluster, tmp_path, "alice")
    grant(cluster, namespace, "alice", [rule(GROUP, ["trainingjobs"], ["create"])])
    user.kubectl.run("apply", "-n", namespace, "-f", "job.yaml")
    TrainingJobClient(namespace, kubeconfig=user.kubeconfig)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import Kubectl
from tests.cluster import SESSION
from tests.e2e.jobs import PatientKubectl


@dataclass(frozen=True)
class TenantUser:
    name: str
    kubeconfig: Path
    kubectl: Kubectl


def tenant_user(cluster: Kubectl, directory: Path, name: str, groups: tuple[str, ...] = ()) -> TenantUser:
    """A user `name` (in `groups`) with a client certificate of the cluster's CA, and its kubeconfig."""
    kubeconfig = SESSION.user_kubeconfig(directory, name, groups)
    return TenantUser(name, kubeconfig, PatientKubectl(cluster.binary, kubeconfig))


def rule(
    group: str, resources: list[str], verbs: list[str], names: list[str] | None = None
) -> dict[str, Any]:
    found: dict[str, Any] = {"apiGroups": [group], "resources": resources, "verbs": verbs}
    if names:
        found["resourceNames"] = names
    return found


def grant(cluster: Kubectl, namespace: str, user: str, rules: list[dict[str, Any]]) -> None:
    """A Role named after `user` in `namespace` with `rules`, bound to the user."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": f"tenant-{user}", "namespace": namespace},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"tenant-{user}", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"tenant-{user}"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": [role, binding]})
