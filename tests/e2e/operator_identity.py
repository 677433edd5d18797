"""The operator's deployed identity on the local cluster, for end-to-end tests that run the operator.

Why: an operator that works as cluster admin can still fail in production on a missing RBAC rule.
`operator_kubeconfig` applies the RBAC of the default install (deploy/: the namespace, the
ServiceAccount, the ClusterRoles (the operator's, and the trainers' it binds) and the binding, the
leader-election Role and its binding, and the admission policies on the operator's writes with their
bindings; not the Deployment), mints a token for the ServiceAccount with the TokenRequest API and
writes a kubeconfig that authenticates with that bearer token against the local cluster. A process
using it is really `system:serviceaccount:trainingjob-system:trainingjob-operator` (not an
impersonating admin), with exactly the deployed rights.

The objects applied are cluster-wide and shared by every test that calls this: applying is idempotent,
and they are left in place (the session's cluster goes away with them).

Usage::

    from tests.e2e.operator_identity import operator_kubeconfig

    def test_something(cluster: Kubectl, namespace: str, tmp_path: Path) -> None:
        kubeconfig = operator_kubeconfig(cluster, tmp_path)
        # start the operator with --kubeconfig=<kubeconfig> ...

The module also renders deploy/ with the project's kubectl (`render`), which the manifest tests use.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from testbed import Kubectl
from tests.cluster import DEV, REPO

DEPLOY: Final = REPO / "deploy"
NAMESPACE: Final = "trainingjob-system"
SERVICE_ACCOUNT: Final = "trainingjob-operator"
USERNAME: Final = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
IDENTITY_KINDS: Final = frozenset(
    {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
# The admission policies (each with a binding of its name) that bound the operator's own writes
# (deploy/base/operator-writes-policy.yaml): part of its identity, so every test that runs the operator
# with these rights runs it under them too.
OPERATOR_POLICIES: Final = ("trainingjob-operator-writes", "trainingjob-operator-rolebindings")
POLICY_KINDS: Final = frozenset({"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"})
Manifest = dict[str, Any]

_kubectl_binary: Path | None = None


def project_kubectl() -> Path:
    """The project's built kubectl (kustomize included): the dev cluster's link, else the cached build.

    `hack/kube-bins.sh ensure` prints the directory of the cached binaries, building them the first time
    on a fresh machine, so rendering needs no running cluster.
    """
    global _kubectl_binary  # noqa: PLW0603 - one lookup per process
    if _kubectl_binary is None:
        linked = DEV / "bin" / "kubectl"
        if linked.exists():
            _kubectl_binary = linked
        else:
            result = subprocess.run(
                [str(REPO / "hack" / "kube-bins.sh"), "ensure"],
                stdout=subprocess.PIPE,
                text=True,
                check=True,
            )
            _kubectl_binary = Path(result.stdout.strip().splitlines()[-1]) / "kubectl"
    return _kubectl_binary


def render(target: Path) -> list[Manifest]:
    """`kubectl kustomize <target>`: the objects a `kubectl apply -k <target>` would send."""
    result = subprocess.run(
        [str(project_kubectl()), "kustomize", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {target} failed: {result.stderr.strip()}")
    # libyaml's loader when PyYAML has it: five times faster on the CRD's 0.5 MB.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(result.stdout, Loader=loader) if doc]


def identity_objects(objects: Iterable[Manifest]) -> list[Manifest]:
    """The objects that make up the operator's identity and rights, in the order they must be applied."""
    order = [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "ClusterRoleBinding",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    chosen = [
        obj
        for obj in objects
        if obj["kind"] in IDENTITY_KINDS
        or (obj["kind"] in POLICY_KINDS and obj["metadata"]["name"] in OPERATOR_POLICIES)
    ]
    return sorted(chosen, key=lambda obj: order.index(obj["kind"]))


def apply_identity(cluster: Kubectl, target: Path = DEPLOY) -> list[Manifest]:
    """Applies the identity objects of `target`'s rendering (idempotent); returns them."""
    objects = identity_objects(render(target))
    cluster.run("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    return objects


def _cluster_entry(kubeconfig: Path) -> dict[str, Any]:
    """The `cluster` entry (server, CA) of the kubeconfig's current context."""
    config = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))
    context_name = config.get("current-context")
    contexts = {entry["name"]: entry["context"] for entry in config.get("contexts", [])}
    clusters = {entry["name"]: entry["cluster"] for entry in config["clusters"]}
    if context_name in contexts:
        cluster: dict[str, Any] = clusters[contexts[context_name]["cluster"]]
        return cluster
    if len(clusters) != 1:
        raise AssertionError(f"{kubeconfig}: no current context and {len(clusters)} clusters")
    return next(iter(clusters.values()))


def operator_kubeconfig(cluster: Kubectl, tmp_path: Path, *, duration: str = "2h") -> Path:
    """A kubeconfig authenticating as the operator's ServiceAccount with the rights deploy/ grants it.

    Applies the default install's identity objects, requests a token for the ServiceAccount valid for
    `duration`, and writes `<tmp_path>/operator.kubeconfig` (mode 0600) pointing at the same API server
    and CA as `cluster`.
    """
    apply_identity(cluster)
    return token_kubeconfig(cluster, SERVICE_ACCOUNT, NAMESPACE, tmp_path / "operator.kubeconfig", duration)


def token_kubeconfig(
    cluster: Kubectl, service_account: str, namespace: str, path: Path, duration: str = "2h"
) -> Path:
    """Writes `path` (mode 0600): a kubeconfig for `cluster`'s API server that authenticates with a
    token of the ServiceAccount `namespace/service_account` (TokenRequest API, valid for `duration`)."""
    token = cluster.run("create", "token", service_account, "-n", namespace, f"--duration={duration}").strip()
    if not token:
        raise AssertionError("kubectl create token printed no token")
    entry = _cluster_entry(cluster.kubeconfig)
    cluster_fields = {
        key: entry[key]
        for key in ("server", "certificate-authority-data", "certificate-authority", "tls-server-name")
        if key in entry
    }
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "trainingjob-dev", "cluster": cluster_fields}],
        "users": [{"name": service_account, "user": {"token": token}}],
        "contexts": [
            {
                "name": service_account,
                "context": {"cluster": "trainingjob-dev", "user": service_account, "namespace": namespace},
            }
        ],
        "current-context": service_account,
    }
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
    return path


class SessionIdentity:
    """A token kubeconfig of the operator's ServiceAccount for a whole test session. A token is bound
    to the ServiceAccount's UID, so once the account is deleted and created again (`make undeploy`,
    then another test applying the identity) the old token is refused with 401: `kubeconfig()` checks
    the UID and mints again when it changed."""

    def __init__(self, cluster: Kubectl, directory: Path) -> None:
        self.cluster = cluster
        self.directory = directory
        self.minted_for: str | None = None

    def kubeconfig(self) -> Path:
        path = self.directory / "operator.kubeconfig"
        account = self.cluster.get_or_none("serviceaccount", SERVICE_ACCOUNT, "-n", NAMESPACE)
        uid = (account or {}).get("metadata", {}).get("uid")
        if uid is None or uid != self.minted_for or not path.exists():
            operator_kubeconfig(self.cluster, self.directory, duration="12h")
            account = self.cluster.get_json("serviceaccount", SERVICE_ACCOUNT, "-n", NAMESPACE)
            self.minted_for = str(account["metadata"]["uid"])
        return path


@pytest.fixture
def operator_kubectl(cluster: Kubectl, tmp_path: Path) -> Kubectl:
    """The project's kubectl authenticated as the operator's ServiceAccount (see `operator_kubeconfig`)."""
    return Kubectl(cluster.binary, operator_kubeconfig(cluster, tmp_path))


__all__ = [
    "DEPLOY",
    "NAMESPACE",
    "OPERATOR_POLICIES",
    "SERVICE_ACCOUNT",
    "USERNAME",
    "SessionIdentity",
    "apply_identity",
    "identity_objects",
    "operator_kubeconfig",
    "operator_kubectl",
    "project_kubectl",
    "render",
    "token_kubeconfig",
]
