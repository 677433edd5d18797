"""Checks of what ships next to the code: deploy/ (kustomize), examples/, monitoring/ and the Dockerfile.

Why: these files are only exercised when someone installs the operator, so mistakes in them (an RBAC
rule too wide or missing, a probe on the wrong port, an alert on a metric that does not exist, an image
that runs as root) surface in production. Everything here needs no cluster and no container engine:

- every kustomize target of deploy/ is rendered with the project's kubectl and validated with
  kubernetes-validate (strict schemas of the dev cluster's Kubernetes version); TrainingJobs (examples/)
  are validated against the CRD's openAPIV3Schema;
- RBAC: no wildcards and no Secrets anywhere in deploy/, and the rights the ServiceAccount ends up with
  equal exactly the operator's list of API calls (OPERATOR_RULES, from the operator's contract):
  tests/unit/test_manifests_rbac.py;
- the Deployment: replicas, leader election, restricted pod security, probes, resources, image;
- monitoring: `promtool check rules` and `promtool test rules`, the PrometheusRule generated from
  monitoring/alerts.yaml is up to date, and every metric named in alerts and dashboard is one that
  controller/metrics.py publishes: tests/unit/test_manifests_monitoring.py;
- the Dockerfile: hadolint, the project's own rules, .dockerignore, and that its `pip install` works:
  tests/unit/test_manifests_dockerfile.py.

What they share is in tests/unit/manifests_support.py.

The server-side checks of the same manifests live in tests/e2e/test_deploy.py.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from crd import contract
from crd.__main__ import (
    CHART_CRD_FILE,
    CHART_ESCALATION_POLICY_FILE,
    CHART_POLICY_FILE,
    ESCALATION_POLICY_FILE,
    POLICY_FILE,
)
from tests.cluster import REPO
from tests.e2e.operator_identity import DEPLOY, NAMESPACE, SERVICE_ACCOUNT, render
from tests.unit.manifests_support import (
    CRD_FILE,
    DOCKERFILE,
    DOCKERIGNORE,
    FOREIGN_KINDS,
    HEALTH_PORT,
    IMAGE,
    METRICS_PORT,
    OVERLAYS,
    TARGETS,
    arg_value,
    container,
    example_documents,
    kube_minor_version,
    of_kind,
    one,
    rendered,
    setup_cfg,
    validate_manifest,
    validate_trainingjob,
    watched_namespace,
    yaml_documents_under,
)

# ---------------------------------------------------------------------------- deploy/: rendering


def test_overlays_exist() -> None:
    assert set(OVERLAYS) >= {"monitoring", "network-policy", "single-namespace"}


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_renders_with_the_crd_from_crd(target: str) -> None:
    objects = rendered(target)
    crd = one(objects, "CustomResourceDefinition")
    source = yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))
    assert crd["spec"] == source["spec"], "the installed CRD must be crd/'s, unchanged"
    one(objects, "Namespace", NAMESPACE)
    one(objects, "Deployment", "trainingjob-operator")
    keys = [(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]) for obj in objects]
    assert len(keys) == len(set(keys)), "duplicate objects"


def test_default_install_is_base() -> None:
    assert rendered("deploy") == rendered("deploy/base")


def test_crd_is_never_copied_into_deploy() -> None:
    """Kustomize takes the CRD from crd/. Helm reads no file outside its chart, so the chart holds the
    one copy, written by `make generate` and compared with crd/'s by `python -m crd check`."""
    copies = [
        path
        for path, doc in yaml_documents_under(DEPLOY)
        if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition" and path != CHART_CRD_FILE
    ]
    assert not copies, f"deploy/ must take the CRD from crd/, not copy it: {copies}"
    assert CHART_CRD_FILE.read_text(encoding="utf-8") == CRD_FILE.read_text(encoding="utf-8")
    assert CHART_POLICY_FILE.read_text(encoding="utf-8") == POLICY_FILE.read_text(encoding="utf-8")
    assert CHART_ESCALATION_POLICY_FILE.read_text(encoding="utf-8") == ESCALATION_POLICY_FILE.read_text(
        encoding="utf-8"
    )


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("name", "path"),
    [(contract.IMMUTABLE_SPEC_POLICY, POLICY_FILE), (contract.ESCALATION_POLICY, ESCALATION_POLICY_FILE)],
)
def test_every_target_installs_crds_generated_policies(target: str, name: str, path: Path) -> None:
    objects = rendered(target)
    source = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        installed = one(objects, kind, name)
        assert "namespace" not in installed["metadata"], "cluster-scoped"
        assert installed["spec"] == next(doc for doc in source if doc["kind"] == kind)["spec"]


def with_every_component(directory: Path) -> Path:
    """`directory`, holding a kustomization of a user's own: deploy/base with every component."""
    components = sorted(path for path in (DEPLOY / "components").iterdir() if path.is_dir())
    relative = Path(os.path.relpath(DEPLOY, directory))
    (directory / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(relative / "base")],
                "components": [str(relative / "components" / path.name) for path in components],
            }
        ),
        encoding="utf-8",
    )
    return directory


def test_components_compose(tmp_path: Path) -> None:
    """All components together in one kustomization of a user's own (what a production install does)."""
    objects = render(with_every_component(tmp_path))
    kinds = {obj["kind"] for obj in objects}
    assert {"ServiceMonitor", "PrometheusRule", "NetworkPolicy"} <= kinds
    assert watched_namespace(objects) is not None


# --------------------------------------------------------------------------- schemas (strict)


@pytest.mark.parametrize("target", TARGETS)
def test_rendered_manifests_validate_strictly(target: str) -> None:
    version = kube_minor_version()
    unknown = {kind for obj in rendered(target) if (kind := validate_manifest(obj, version)) is not None}
    allowed = {f"{api} {kind}" for api, kind in FOREIGN_KINDS}
    assert unknown <= allowed, f"kinds without a schema (typo?): {sorted(unknown - allowed)}"


def test_examples_validate() -> None:
    docs = example_documents()
    assert docs, "examples/ holds no manifests"
    version = kube_minor_version()
    for name, doc in docs:
        if doc.get("apiVersion") == "ml.example.com/v1" and doc.get("kind") == "TrainingJob":
            try:
                validate_trainingjob(doc)
            except AssertionError as error:
                raise AssertionError(f"examples/{name}: {error}") from None
        else:
            assert validate_manifest(doc, version) is None, f"examples/{name}: no schema for {doc['kind']}"


def test_trainingjob_validation_rejects_typos() -> None:
    """The strict CRD check must catch what the API server would prune or reject."""
    docs = [doc for _, doc in example_documents() if doc.get("kind") == "TrainingJob"]
    job = json.loads(json.dumps(docs[0]))
    job["spec"]["numWorker"] = 2
    with pytest.raises(AssertionError, match="numWorker"):
        validate_trainingjob(job)
    job = json.loads(json.dumps(docs[0]))
    job["spec"]["numWorkers"] = "two"
    with pytest.raises(AssertionError, match="numWorkers"):
        validate_trainingjob(job)


# ------------------------------------------------------------------------------------- Deployment


def test_namespace_enforces_restricted_pod_security() -> None:
    labels = one(rendered("deploy"), "Namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"


def test_deployment_runs_two_replicas_with_leader_election() -> None:
    objects = rendered("deploy")
    deployment = one(objects, "Deployment", "trainingjob-operator")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["namespace"] == NAMESPACE
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT
    args = container(objects)["args"]
    assert "--leader-elect" in args
    assert "--leader-elect=false" not in args
    env = {item["name"]: item for item in container(objects)["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


def test_deployment_pod_security_is_restricted() -> None:
    deployment = one(rendered("deploy"), "Deployment", "trainingjob-operator")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for host_namespace in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(host_namespace), host_namespace
    security = container([deployment])["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 65532
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    harmless = {"name", "emptyDir", "configMap", "projected", "downwardAPI"}
    assert all(volume.keys() <= harmless for volume in pod.get("volumes", [])), "no hostPath or the like"


def quantity_mib(value: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0, "M": 1e6 / 2**20, "G": 1e9 / 2**20}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value) / 2**20


def test_deployment_resources_fit_the_memory_target() -> None:
    resources = container(rendered("deploy"))["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert "memory" in resources["limits"]
    # The operator targets < 150 MB RSS with 1,000 jobs: request that, and leave headroom below the limit.
    assert quantity_mib(resources["requests"]["memory"]) >= 150e6 / 2**20
    assert quantity_mib(resources["limits"]["memory"]) > quantity_mib(resources["requests"]["memory"])


def test_probes_use_the_health_port_and_the_service_the_metrics_port() -> None:
    """Port names other parts rely on: `metrics` (the Service, the ServiceMonitor, the NetworkPolicy)
    and `health` (the probes, the NetworkPolicy)."""
    objects = rendered("deploy/overlays/monitoring")
    operator = container(objects)
    ports = {port["name"]: port for port in operator["ports"]}
    assert ports["metrics"]["containerPort"] == METRICS_PORT
    assert ports["health"]["containerPort"] == HEALTH_PORT
    assert arg_value(operator["args"], "--metrics-bind-address") in (None, f":{METRICS_PORT}")
    assert arg_value(operator["args"], "--health-probe-bind-address") in (None, f":{HEALTH_PORT}")
    assert arg_value(operator["args"], "--metrics-secure") in (None, "true"), "HTTPS with authentication"
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert operator["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    service = one(objects, "Service", "trainingjob-operator-metrics")
    deployment = one(objects, "Deployment", "trainingjob-operator")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == "metrics"
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [endpoint["port"] for endpoint in monitor["spec"]["endpoints"]] == [service_port["name"]]
    # HTTPS with Prometheus's own token; the self-signed certificate cannot be verified (said there).
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
    # trainingjob_* series carry the job's namespace label, which must win over the target's.
    assert all(endpoint.get("honorLabels") is True for endpoint in monitor["spec"]["endpoints"])


def test_image_is_set_through_kustomize_without_a_registry() -> None:
    version = setup_cfg()["metadata"]["version"]
    kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["images"] == [{"name": IMAGE, "newTag": version}]
    for target in TARGETS:
        for obj in of_kind(rendered(target), "Deployment"):
            for spec in obj["spec"]["template"]["spec"]["containers"]:
                assert spec["image"] == f"{IMAGE}:{version}", f"{target}: {spec['image']}"


def test_network_policy_allows_only_metrics_and_probes_in_and_the_api_server_and_dns_out() -> None:
    """Every egress rule names its destination and its ports (a rule without `to` allows any host). As
    shipped, the API server's rule names no address (hack/deploy.sh and the chart fill it in from the
    cluster; tests/unit/test_network_policy.py): the operator reaches nothing until it is filled in."""
    objects = rendered("deploy/overlays/network-policy")
    policy = one(objects, "NetworkPolicy")
    deployment = one(objects, "Deployment", "trainingjob-operator")
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    ingress_ports = [port for rule in policy["spec"]["ingress"] for port in rule["ports"]]
    assert ingress_ports == [{"port": "metrics", "protocol": "TCP"}, {"port": "health", "protocol": "TCP"}]
    egress = policy["spec"]["egress"]
    assert all(rule.get("to") and rule.get("ports") for rule in egress), (
        "egress must name where and which ports"
    )
    api_server, dns = egress
    assert api_server == {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/32"}}],
        "ports": [{"port": 6443, "protocol": "TCP"}],
    }
    assert dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    assert {(port["protocol"], port["port"]) for port in dns["ports"]} == {("UDP", 53), ("TCP", 53)}


def test_no_machine_paths_or_registry_hosts() -> None:
    # The chart's copy of the CRD is crd/'s (whose descriptions name paths inside a pod, like /tmp/).
    deploy = [path for path in sorted(DEPLOY.rglob("*")) if path != CHART_CRD_FILE]
    files = [DOCKERFILE, DOCKERIGNORE, *deploy, *sorted((REPO / "monitoring").rglob("*"))]
    pattern = re.compile(
        r"/(?:home|root|work|Users|tmp)/|(?:docker\.io|gcr\.io|quay\.io|ghcr\.io|registry\.k8s\.io|"
        r"amazonaws\.com|azurecr\.io|pkg\.dev)"
    )
    found = [
        f"{path.relative_to(REPO)}: {match.group(0)}"
        for path in files
        if path.is_file() and "__pycache__" not in path.parts
        for match in pattern.finditer(path.read_text(encoding="utf-8"))
    ]
    assert not found, found
