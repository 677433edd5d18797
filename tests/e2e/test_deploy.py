"""deploy/ and examples/ against a real API server, and the operator's deployed identity.

Why: schema validation (tests/unit/test_manifests.py) cannot see admission: Pod Security, CEL rules of
the CRD, RBAC escalation prevention, field validation of the server's own version. Here every
kustomize target and every option of the Helm chart (rendered by `helm template`) is applied with a
server-side dry run, the operator's pod template is admitted (dry run) into the restricted namespace,
and the operator's ServiceAccount, authenticated with a real token (tests/e2e/operator_identity.py),
is asked what it may do and made to do what the operator does. The chart's real install, upgrade and
uninstall are tests/e2e/test_helm_release.py.

The Prometheus Operator is not installed on the local cluster; the ServiceMonitor and PrometheusRule
of the monitoring overlay are dry-run against minimal stand-in CRDs that this module installs (and
removes) as test fixtures.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from builders import configmap, shared
from crd import contract
from crd.defaults import with_defaults
from crd.spec import parse
from tests.cluster import REPO, Kubectl, wait_for
from tests.e2e.operator_identity import (
    NAMESPACE,
    SERVICE_ACCOUNT,
    USERNAME,
    apply_identity,
    operator_kubeconfig,
    render,
)
from tests.e2e.test_docs_yaml import yaml_blocks
from tests.helmchart import OPTIONS, Helm, merged

Manifest = dict[str, Any]

OVERLAYS: Final = sorted(path.name for path in (REPO / "deploy" / "overlays").iterdir() if path.is_dir())
TARGETS: Final = ("deploy", "deploy/base", *(f"deploy/overlays/{name}" for name in OVERLAYS))
FIXTURE_LABEL: Final = "test.trainingjob-operator.dev/fixture"
# Values beyond the options: placement, image, pod settings (the API server judges what the schema
# lets through, e.g. the toleration and affinity fields).
CHART_POD_VALUES: Final = {
    "image": {"repository": "registry.example:5000/ml/trainingjob-operator", "tag": "1.2.3"},
    "imagePullSecrets": [{"name": "regcred"}],
    "replicas": 3,
    "resources": {"requests": {"cpu": "200m", "memory": "300Mi"}, "limits": {"cpu": None, "memory": "1Gi"}},
    "nodeSelector": {"pool": "system"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
    "affinity": {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "trainingjob-operator"}},
                    },
                }
            ]
        }
    },
    "podAnnotations": {"example.com/team": "ml-platform"},
    "monitoring": {"enabled": True, "labels": {"release": "prometheus"}},
}


def as_list(objects: list[Manifest]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


def warnings(stderr: str) -> list[str]:
    """The API server's warnings, except kubectl's note that the session's CRD (installed with
    server-side apply by tests/conftest.py) lacks the client-side last-applied annotation."""
    return [
        line
        for line in stderr.splitlines()
        if line.startswith("Warning:") and "last-applied-configuration" not in line
    ]


# ------------------------------------------------------------------------------------- fixtures


def stand_in_crd(kind: str, plural: str) -> Manifest:
    """A minimal CustomResourceDefinition for a Prometheus Operator kind: served, schema-less spec."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.monitoring.coreos.com",
            "labels": {FIXTURE_LABEL: "true"},
            "annotations": {
                "description": "TEST FIXTURE of tests/e2e/test_deploy.py: a minimal stand-in for the "
                "Prometheus Operator's CRD, so the monitoring overlay can be dry-run. Not the real schema."
            },
        },
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def monitoring_crds(cluster: Kubectl) -> Iterator[None]:
    """Stand-in monitoring.coreos.com CRDs, unless real ones are installed; removed afterwards if ours."""
    ours: list[str] = []
    for kind, plural in (("ServiceMonitor", "servicemonitors"), ("PrometheusRule", "prometheusrules")):
        crd = stand_in_crd(kind, plural)
        name = crd["metadata"]["name"]
        existing = cluster.get_or_none("customresourcedefinition", name)
        if existing is not None and existing["metadata"].get("labels", {}).get(FIXTURE_LABEL) != "true":
            continue  # a real Prometheus Operator CRD: use it, never touch it
        cluster.apply(crd)
        ours.append(name)
        cluster.run(
            "wait", "--for=condition=Established", "--timeout=60s", f"customresourcedefinition/{name}"
        )
    try:
        yield
    finally:
        for name in ours:
            cluster.run(
                "delete", "customresourcedefinition", name, "--ignore-not-found", "--wait=false", check=False
            )


@pytest.fixture(scope="module")
def identity(cluster: Kubectl) -> list[Manifest]:
    """The default install's namespace, ServiceAccount and RBAC, applied for real (shared, idempotent)."""
    return apply_identity(cluster)


@pytest.fixture(scope="module")
def operator(cluster: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    """kubectl authenticated with a token of the operator's ServiceAccount."""
    return Kubectl(cluster.binary, operator_kubeconfig(cluster, tmp_path_factory.mktemp("operator")))


def retarget(objects: list[Manifest], namespace: str) -> list[Manifest]:
    """The single-namespace overlay's objects aimed at `namespace` instead of its placeholder target."""
    roles = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "trainingjob-operator"]
    if not roles:
        return objects
    watched = roles[0]["metadata"]["namespace"]
    result = copy.deepcopy(objects)
    for obj in result:
        if obj["metadata"].get("namespace") == watched:
            obj["metadata"]["namespace"] = namespace
        if obj["kind"] == "Deployment":
            for spec in obj["spec"]["template"]["spec"]["containers"]:
                for env in spec.get("env", []):
                    if env["name"] == "WATCH_NAMESPACE":
                        env["value"] = namespace
    return result


# -------------------------------------------------------------------------- server-side dry runs


@pytest.mark.parametrize("target", TARGETS)
def test_target_passes_server_side_dry_run(
    cluster: Kubectl, identity: list[Manifest], monitoring_crds: None, namespace: str, target: str
) -> None:
    """`kubectl apply -k <target> --dry-run=server`: admission, field validation and RBAC checks of the
    server, without changing anything. The single-namespace overlay is aimed at the test's namespace
    (its own target namespace does not exist here), so it is rendered and sent as a list."""
    rendered = render(REPO / target)
    objects = retarget(rendered, namespace)
    if objects == rendered:
        result = cluster.attempt("apply", "--dry-run=server", "-k", str(REPO / target))
    else:
        result = cluster.attempt("apply", "--dry-run=server", "-f", "-", stdin=as_list(objects))
    assert result.returncode == 0, result.stderr
    assert not warnings(result.stderr), result.stderr
    for obj in objects:
        assert f"{obj['kind'].lower()}" in result.stdout.lower()


@pytest.fixture(scope="module")
def chart(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm, tmp_path_factory.mktemp("helm"))


@pytest.mark.usefixtures("identity", "monitoring_crds")
@pytest.mark.parametrize("option", ["default", *OPTIONS, "every", "pod-values"])
def test_chart_passes_server_side_dry_run(cluster: Kubectl, namespace: str, chart: Helm, option: str) -> None:
    """`helm template` of each option (and of the pod's values) applied with a server-side dry run into
    the install's namespace, which enforces the restricted Pod Security Standard. In single-namespace
    mode the test's namespace is the watched one."""
    watched = {"watchNamespace": namespace}
    values = {
        "default": {},
        **OPTIONS,
        "single-namespace": watched,
        "every": merged(*OPTIONS.values(), watched),
        "pod-values": CHART_POD_VALUES,
    }[option]
    objects = chart.template(values)
    result = cluster.attempt("apply", "--dry-run=server", "-f", "-", stdin=as_list(objects))
    assert result.returncode == 0, result.stderr
    assert not warnings(result.stderr), result.stderr
    assert len(result.stdout.strip().splitlines()) == len(objects), result.stdout


DEPLOY_README_BLOCKS: Final = yaml_blocks((REPO / "deploy" / "README.md").read_text(encoding="utf-8"))


def test_deploy_readme_has_a_kustomization_and_a_values_file() -> None:
    kinds = [yaml.safe_load(text).get("kind") for text in DEPLOY_README_BLOCKS]
    assert kinds.count("Kustomization") == 1
    assert kinds.count(None) == 1, "one block of Helm values"


@pytest.mark.usefixtures("identity", "monitoring_crds")
@pytest.mark.parametrize("text", DEPLOY_README_BLOCKS)
def test_deploy_readme_blocks_pass_server_side_dry_run(
    cluster: Kubectl, namespace: str, chart: Helm, text: str
) -> None:
    """deploy/README.md's YAML, used as it says: the kustomization in a directory next to deploy/, the
    values file with `helm template`; the result dry-run (the watched namespace is the test's)."""
    document = yaml.safe_load(text)
    if document.get("kind") == "Kustomization":
        directory = Path(tempfile.mkdtemp(prefix=".docs-kustomization.", dir=REPO))
        try:
            (directory / "kustomization.yaml").write_text(text, encoding="utf-8")
            objects = render(directory)
        finally:
            shutil.rmtree(directory)
    else:
        objects = chart.template(document)
    objects = retarget(objects, namespace)
    result = cluster.attempt("apply", "--dry-run=server", "-f", "-", stdin=as_list(objects))
    assert result.returncode == 0, result.stderr
    assert not warnings(result.stderr), result.stderr


def test_examples_pass_server_side_dry_run(cluster: Kubectl, namespace: str) -> None:
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        result = cluster.attempt("apply", "--dry-run=server", "-n", namespace, "-f", str(path))
        assert result.returncode == 0, f"{path.name}: {result.stderr}"
        assert not warnings(result.stderr), f"{path.name}: {result.stderr}"


def operator_pod(objects: list[Manifest]) -> Manifest:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    template = deployment["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "trainingjob-operator-admission-check",
            "namespace": deployment["metadata"]["namespace"],
            "labels": template["metadata"]["labels"],
        },
        "spec": copy.deepcopy(template["spec"]),
    }


def test_operator_pod_is_admitted_under_restricted_pod_security(
    cluster: Kubectl, identity: list[Manifest]
) -> None:
    namespace = cluster.get_json("namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = operator_pod(render(REPO / "deploy"))
    result = cluster.attempt("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod))
    assert result.returncode == 0, result.stderr
    assert "violate" not in result.stderr, result.stderr

    # The control: the namespace really enforces, so the pass above means something.
    weakened = copy.deepcopy(pod)
    (container,) = weakened["spec"]["containers"]
    container["securityContext"]["allowPrivilegeEscalation"] = True
    container["securityContext"]["capabilities"] = {"add": ["NET_ADMIN"]}
    result = cluster.attempt("create", "--dry-run=server", "-f", "-", stdin=json.dumps(weakened))
    assert result.returncode != 0
    assert "violates PodSecurity" in result.stderr, result.stderr


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
    create because it holds patch on pods itself) and trainer sources, a ConfigMap owned by the job, the
    status subresource, deleting the shared objects again; and the refusals (Secrets, spec, granting
    rights it does not hold)."""
    manifest = yaml.safe_load((REPO / "examples" / "trainingjob-simple.yaml").read_text(encoding="utf-8"))
    manifest["metadata"]["namespace"] = namespace
    created = json.loads(cluster.run("create", "-f", "-", "-o", "json", stdin=json.dumps(manifest)))
    job = with_defaults(created)

    operator.run("create", "-f", "-", stdin=as_list(shared.build_shared(parse(job))))
    operator.run("create", "-f", "-", stdin=json.dumps(configmap.build_config_map(parse(job))))
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
