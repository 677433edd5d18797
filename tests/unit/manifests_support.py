"""What the checks of the shipped files share (tests/unit/test_manifests*.py): the operator's API calls as
RBAC rules, the files checked, rendering deploy/ with kustomize, strict schema validation, and reading
the RBAC that the rendered manifests grant.
"""

from __future__ import annotations

import configparser
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate
import yaml

from controller.resources import GUARD_POLICIES, REVIEWS
from crd import contract
from tests.cluster import REPO
from tests.e2e.operator_identity import DEPLOY, NAMESPACE, SERVICE_ACCOUNT, render

Manifest = dict[str, Any]
RBAC_GROUP: Final = "rbac.authorization.k8s.io"


# The operator's API calls (its entry point's contract), as RBAC rules: (apiGroup, resource, verbs).
# Namespaced resources are needed wherever TrainingJobs live; nodes are cluster-scoped.
OPERATOR_RULES: Final[tuple[tuple[str, str, tuple[str, ...]], ...]] = (
    ("ml.example.com", "trainingjobs", ("get", "list", "watch", "delete")),
    ("ml.example.com", "trainingjobs/status", ("get", "patch")),
    ("ml.example.com", "trainingjobs/finalizers", ("update",)),
    ("", "pods", ("get", "list", "watch", "create", "delete", "patch")),
    ("", "services", ("get", "list", "watch", "create", "delete", "patch")),
    ("", "configmaps", ("get", "list", "watch", "create", "delete", "patch")),
    ("", "serviceaccounts", ("create",)),
    ("", "persistentvolumeclaims", ("get", "list", "watch", "create", "patch")),
    # An MPI job's SSH key: created only (controller/resources.py CREATED_ONLY).
    ("", "secrets", ("create",)),
    ("", "events", ("create", "patch")),
    ("rbac.authorization.k8s.io", "rolebindings", ("create",)),
    ("scheduling.x-k8s.io", "podgroups", ("get", "list", "watch", "create", "delete", "patch")),
    ("scheduling.volcano.sh", "podgroups", ("get", "list", "watch", "create", "delete", "patch")),
    ("kueue.x-k8s.io", "workloads", ("get", "list", "watch", "create", "delete", "patch")),
    ("kueue.x-k8s.io", "workloads/status", ("patch",)),
)


# The operator's calls on objects of one name, wherever TrainingJobs live: (apiGroup, resource, verbs,
# name). The namespace's trainer account and its RoleBinding (watched with a field selector on the name,
# controller/resources.py NAMED), and the one ClusterRole it may bind. No rights on Roles at all.
NAMED_OPERATOR_RULES: Final[tuple[tuple[str, str, tuple[str, ...], str], ...]] = (
    ("", "serviceaccounts", ("get", "list", "watch", "delete"), contract.TRAINER_ACCOUNT),
    (
        "rbac.authorization.k8s.io",
        "rolebindings",
        ("get", "list", "watch", "patch", "delete"),
        contract.TRAINER_ACCOUNT,
    ),
    ("rbac.authorization.k8s.io", "clusterroles", ("bind",), contract.TRAINER_CLUSTER_ROLE),
)


CLUSTER_SCOPED_RULES: Final = (
    ("", "nodes", ("get", "list", "watch")),
    ("kueue.x-k8s.io", "resourceflavors", ("get", "list", "watch")),
    ("kueue.x-k8s.io", "workloadpriorityclasses", ("get", "list", "watch")),
    ("kueue.x-k8s.io", "multikueueclusters", ("get", "list", "watch")),
    ("scheduling.volcano.sh", "queues", ("get", "list", "watch")),
    ("scheduling.k8s.io", "priorityclasses", ("get", "list", "watch")),
)


LEASE_NAME: Final = "trainingjob-operator"


METRICS_PORT: Final = 8443  # the default of --metrics-bind-address (":8443"): /metrics, HTTPS
HEALTH_PORT: Final = 8081  # the default of --health-probe-bind-address (":8081"): the probes
# The ClusterRole shipped for whoever scrapes /metrics (deploy/base/metrics-reader-clusterrole.yaml),
# which nothing in the install binds, and its one rule: the right the metrics endpoint checks.
METRICS_READER: Final = "trainingjob-operator-metrics-reader"
METRICS_READER_RULE: Final = {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}


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


def named_permissions(scope: str) -> set[Permission]:
    """NAMED_OPERATOR_RULES in `scope`."""
    return {
        Permission(scope, group, resource, verb, name)
        for group, resource, verbs, name in NAMED_OPERATOR_RULES
        for verb in verbs
    }


def policy_permissions() -> set[Permission]:
    """The watch of the admission policies the trainers' rights rest on, and of their bindings, by name
    (controller/guards_watch.py)."""
    return {
        Permission(CLUSTER, "admissionregistration.k8s.io", resource, verb, name)
        for resource in ("validatingadmissionpolicies", "validatingadmissionpolicybindings")
        for verb in ("list", "watch")
        for name in GUARD_POLICIES
    }


def metrics_auth_permissions() -> set[Permission]:
    """The metrics endpoint's reviews of its requesters (controller/resources.py REVIEWS)."""
    return {Permission(CLUSTER, resource.group, resource.plural, "create") for resource in REVIEWS}


def lease_permissions() -> set[Permission]:
    return {
        Permission(NAMESPACE, "coordination.k8s.io", "leases", "create"),
        Permission(NAMESPACE, "coordination.k8s.io", "leases", "get", LEASE_NAME),
        Permission(NAMESPACE, "coordination.k8s.io", "leases", "update", LEASE_NAME),
    }


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


FORBIDDEN_VERBS: Final = frozenset({"escalate", "bind", "impersonate", "*"})
# The one `bind` the operator holds: on the trainers' ClusterRole, by name.
TRAINER_BIND: Final = {
    "apiGroups": ["rbac.authorization.k8s.io"],
    "resources": ["clusterroles"],
    "resourceNames": [contract.TRAINER_CLUSTER_ROLE],
    "verbs": ["bind"],
}


def rule_violations(rule: Manifest) -> list[str]:
    """What is wrong with one PolicyRule: wildcards, Secrets (but their creation alone), Roles,
    privilege-escalating verbs (but `bind` on the trainers' ClusterRole alone), raw URLs."""
    problems = []
    for key in ("verbs", "resources", "apiGroups", "resourceNames"):
        values = rule.get(key) or []
        if any("*" in str(value) for value in values):
            problems.append(f"wildcard in {key}: {values}")
    resources = [str(resource) for resource in rule.get("resources") or []]
    # Secrets may be created (an MPI job's SSH key), never read: a rule naming them grants create alone.
    reads_secrets = set(rule.get("verbs") or []) != {"create"} or len(resources) != 1
    if (
        any(resource == "secrets" or resource.startswith("secrets/") for resource in resources)
        and reads_secrets
    ):
        problems.append(f"grants secrets: {resources}")
    if any(resource == "roles" or resource.startswith("roles/") for resource in resources):
        problems.append(f"grants rights on roles: {resources}")
    escalating = FORBIDDEN_VERBS & set(rule.get("verbs") or [])
    if escalating and not (escalating == {"bind"} and rule == TRAINER_BIND):
        problems.append(f"escalating verbs: {sorted(escalating)}")
    if rule.get("nonResourceURLs") and rule != METRICS_READER_RULE:
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
    nothing binds (dead rules are a trap: someone binds them later) other than the ClusterRoles the
    operator itself binds at run time (the trainers', which it holds `bind` on by name) and the
    metrics reader, which the scraper's owner binds.
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
    bound_by_the_operator = {
        ("ClusterRole", "", permission.name)
        for permission in granted
        if (permission.group, permission.resource, permission.verb) == (RBAC_GROUP, "clusterroles", "bind")
    }
    unused = set(roles) - used - bound_by_the_operator - {("ClusterRole", "", METRICS_READER)}
    assert not unused, f"roles nothing binds: {sorted(unused)}"
    return granted


def watched_namespace(objects: Iterable[Manifest]) -> str | None:
    value = arg_value(container(objects).get("args", []), "--namespace")
    if value is None:
        return None
    env = {item["name"]: item.get("value") for item in container(objects).get("env", [])}
    match = re.fullmatch(r"\$\((\w+)\)", value)
    return env.get(match.group(1)) if match else value
