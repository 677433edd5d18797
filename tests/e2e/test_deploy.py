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
from pathlib import Path
from typing import Final

import pytest
import yaml

from testbed import Kubectl
from tests.cluster import REPO
from tests.e2e import deploy_support
from tests.e2e.deploy_support import Manifest, as_list
from tests.e2e.operator_identity import (
    NAMESPACE,
    render,
)
from tests.e2e.test_docs_yaml import yaml_blocks
from tests.helmchart import OPTIONS, Helm, merged

# The shared fixtures, bound here so that pytest finds them for this module's tests.
identity = deploy_support.identity
operator = deploy_support.operator


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


def warnings(stderr: str) -> list[str]:
    """The API server's warnings, except kubectl's note that the session's CRD (installed with
    server-side apply by conftest.py) lacks the client-side last-applied annotation."""
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

# How deploy/README.md says to install: server-side (the CRD is too large for a client-side apply).
SERVER_SIDE_DRY_RUN: Final = ("apply", "--server-side", "--force-conflicts", "--dry-run=server")


@pytest.mark.parametrize("target", TARGETS)
def test_target_passes_server_side_dry_run(
    cluster: Kubectl, identity: list[Manifest], monitoring_crds: None, namespace: str, target: str
) -> None:
    """`kubectl apply --server-side -k <target> --dry-run=server`, as deploy/README.md says to install:
    admission, field validation and RBAC checks of the server, without changing anything. (A
    client-side apply cannot install the CRD: its last-applied annotation would exceed 256 KiB.) The
    single-namespace overlay is aimed at the test's namespace (its own target namespace does not exist
    here), so it is rendered and sent as a list."""
    rendered = render(REPO / target)
    objects = retarget(rendered, namespace)
    if objects == rendered:
        result = cluster.attempt(*SERVER_SIDE_DRY_RUN, "-k", str(REPO / target))
    else:
        result = cluster.attempt(*SERVER_SIDE_DRY_RUN, "-f", "-", stdin=as_list(objects))
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
    result = cluster.attempt(*SERVER_SIDE_DRY_RUN, "-f", "-", stdin=as_list(objects))
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
        objects = chart.template(with_api_server(document))
    objects = retarget(objects, namespace)
    result = cluster.attempt(*SERVER_SIDE_DRY_RUN, "-f", "-", stdin=as_list(objects))
    assert result.returncode == 0, result.stderr
    assert not warnings(result.stderr), result.stderr


def with_api_server(values: Manifest) -> Manifest:
    """`values` as `helm template` needs them: with the NetworkPolicy on and no API server endpoints
    given, `helm install` looks them up in the cluster, which `helm template` cannot (deploy/README.md
    says to give them); a documentation address (RFC 5737) stands in."""
    policy = values.get("networkPolicy") or {}
    if not policy.get("enabled") or (policy.get("apiServer") or {}).get("addresses"):
        return values
    api_server = {"addresses": ["192.0.2.10"], "ports": [6443]}
    return {**values, "networkPolicy": {**policy, "apiServer": api_server}}


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
