"""The Helm chart (deploy/helm/trainingjob-operator) without a cluster: lint, its values and their
schema, and that it renders what the kustomize install applies.

Why: the chart and deploy/'s kustomize tree are two descriptions of one install. Each option the
kustomize tree offers as an overlay (monitoring, network-policy, single-namespace, and all of them
together) is rendered both ways and compared object by object (tests/helmchart.py says what is set
aside), so a change to either side fails here until the other follows. Values are the chart's
interface: each must reach the objects (the operator's flags as the operator parses them), and a
wrong one must be refused by helm, naming it, before anything reaches a cluster.

The server-side dry runs of the rendered chart are in tests/e2e/test_deploy.py, the real install,
upgrade and uninstall in tests/e2e/test_helm_release.py.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from controller import cli
from crd.render import CRD_FILE_NAME
from tests.cluster import REPO
from tests.e2e.operator_identity import DEPLOY, render
from tests.helmchart import (
    CHART,
    NAMESPACE,
    OPTIONS,
    RELEASE,
    Helm,
    HelmError,
    compare,
    default_values,
    load_all,
    merged,
    one,
    operator_container,
    operator_settings,
)
from tests.unit import helm_support
from tests.unit.helm_support import EVERY_OPTION
from tests.unit.manifests_support import kube_minor_version, setup_cfg, validate_manifest
from tests.unit.test_manifests import with_every_component

# The shared fixtures, bound here so that pytest finds them for this module's tests.
chart = helm_support.chart

Manifest = dict[str, Any]

FOREIGN_KINDS: Final = frozenset({"ServiceMonitor", "PrometheusRule"})  # no schema in kubernetes-validate
# Operator flags the chart sets itself instead of offering them as values, and why.
FLAGS_NOT_VALUES: Final = {
    "kubeconfig": "in-cluster configuration",
    "context": "in-cluster configuration",
    "metrics_bind_address": "port 8443, which the Service, the ServiceMonitor and the NetworkPolicy use",
    "health_probe_bind_address": "port 8081, which the probes and the NetworkPolicy use",
    "metrics_secure": "metrics.secure, which also sets the ServiceMonitor's scheme",
    "metrics_cert_path": "metrics.certSecret, mounted there",
    "metrics_addr": "the deprecated alias of --metrics-bind-address",
    "lease_name": "the release's name, which the leader-election Role names",
    "lease_namespace": "the release namespace (the pod's)",
    "namespace": "watchNamespace, which also moves the RBAC",
}


@functools.cache
def _kustomize(target: Path) -> str:
    return json.dumps(render(target))


def kustomize(target: Path) -> list[Manifest]:
    """`kubectl kustomize <target>`, run once per test session (callers get their own objects)."""
    objects: list[Manifest] = json.loads(_kustomize(target))
    return objects


def refusal(chart: Helm, values: Manifest) -> str:
    """helm's message for values it refuses (failing the test when it renders them)."""
    with pytest.raises(HelmError) as refused:
        chart.template(values)
    return refused.value.stderr


# ------------------------------------------------------------------------- the kustomize install


def test_the_overlays_are_the_charts_options() -> None:
    overlays = {path.name for path in (DEPLOY / "overlays").iterdir() if path.is_dir()}
    assert overlays == set(OPTIONS)


@pytest.mark.parametrize("option", ["default", *OPTIONS])
def test_chart_renders_what_kustomize_installs(chart: Helm, option: str) -> None:
    if option == "default":
        ours, theirs = chart.template(), kustomize(DEPLOY)
    else:
        ours, theirs = chart.template(OPTIONS[option]), kustomize(DEPLOY / "overlays" / option)
    assert compare(ours, theirs) == []
    # The comparison set aside only the Namespace (and Helm's labels); the rest is all there.
    assert {obj["kind"] for obj in theirs} - {obj["kind"] for obj in ours} == {"Namespace"}


def test_chart_with_every_option_renders_kustomize_with_every_component(chart: Helm, tmp_path: Path) -> None:
    ours = chart.template(EVERY_OPTION)
    theirs = kustomize(with_every_component(tmp_path))
    assert compare(ours, theirs) == []
    assert {"ServiceMonitor", "PrometheusRule", "NetworkPolicy", "Role"} <= {obj["kind"] for obj in ours}


def test_the_comparison_sees_a_change_on_either_side(chart: Helm) -> None:
    ours, theirs = chart.template(), kustomize(DEPLOY)
    # What Helm adds on purpose is not a difference ...
    one(theirs, "ServiceAccount")["metadata"]["labels"]["app.kubernetes.io/instance"] = "another-release"
    one(theirs, "Deployment")["spec"]["selector"]["matchLabels"]["helm.sh/chart"] = "x-1.0"
    assert compare(ours, theirs) == []
    # ... a change to either side is.
    one(theirs, "Deployment")["spec"]["replicas"] = 3
    operator_container(theirs)["args"].append("--workers=6")
    one(ours, "ClusterRole", "trainingjob-operator")["rules"][0]["verbs"].append("update")
    found = compare([obj for obj in ours if obj["kind"] != "PodDisruptionBudget"], theirs)
    deployment = "('Deployment', 'trainingjob-system', 'trainingjob-operator')"
    assert f"{deployment}: .spec.replicas: chart 2 != kustomize 3" in found
    assert any(".args.workers: chart 4 != kustomize 6" in line for line in found), found
    assert any(".rules[0].verbs" in line for line in found), found
    assert any(line.startswith("only in the kustomize install: ('PodDisruptionBudget'") for line in found)
    assert len(found) == 4, found


def test_the_chart_copies_of_crd_and_alerts_are_current() -> None:
    """Helm reads no file outside the chart: files/ holds copies that `make generate` writes."""
    crd = (REPO / "crd" / CRD_FILE_NAME).read_text(encoding="utf-8")
    assert (CHART / "files" / CRD_FILE_NAME).read_text(encoding="utf-8") == crd, "run `make generate`"
    alerts = (REPO / "monitoring" / "alerts.yaml").read_text(encoding="utf-8")
    copy = (CHART / "files" / "alerts.yaml").read_text(encoding="utf-8")
    assert copy.endswith(alerts), "run `make generate-monitoring`"
    assert yaml.safe_load(copy) == yaml.safe_load(alerts)


def test_the_crd_spec_is_installed_as_written(chart: Helm) -> None:
    (source,) = load_all((REPO / "crd" / CRD_FILE_NAME).read_text(encoding="utf-8"))
    crd = one(chart.template(), "CustomResourceDefinition")
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["labels"]["app.kubernetes.io/name"] == "trainingjob", "the CRD's own label wins"
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


# ----------------------------------------------------------------------------------------- lint


@pytest.mark.parametrize("option", ["default", *OPTIONS, "every"])
def test_helm_lint_strict(chart: Helm, option: str) -> None:
    values = {"default": {}, "every": EVERY_OPTION, **OPTIONS}[option]
    output = chart.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE, values=values)
    assert "1 chart(s) linted, 0 chart(s) failed" in output
    assert "[WARNING]" not in output, output
    assert "[ERROR]" not in output, output


def test_helm_lint_fails_on_values_the_schema_refuses(chart: Helm) -> None:
    result = chart.attempt("lint", "--strict", str(CHART), values={"replicas": "two"})
    assert result.returncode != 0
    assert "replicas" in result.stdout + result.stderr


def test_helm_package_carries_the_crd_and_the_rules(chart: Helm, tmp_path: Path) -> None:
    chart.run("package", str(CHART), "--destination", str(tmp_path))
    (archive,) = tmp_path.glob("trainingjob-operator-*.tgz")
    objects = chart.template(EVERY_OPTION, chart=archive)
    assert one(objects, "CustomResourceDefinition")["spec"]["names"]["kind"] == "TrainingJob"
    assert one(objects, "PrometheusRule")["spec"]["groups"]


# ---------------------------------------------------------------------------------------- values


def test_chart_version_is_the_packages() -> None:
    version = setup_cfg()["metadata"]["version"]
    metadata = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    assert metadata["version"] == version
    assert metadata["appVersion"] == version


def schema() -> Manifest:
    value = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    assert isinstance(value, dict)
    return value


def value_paths(node: Manifest, prefix: str = "") -> Iterator[str]:
    """Every value the schema declares, nested ones as dotted paths (image.tag)."""
    for name, child in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        if "properties" in child:
            yield from value_paths(child, f"{path}.")
        else:
            yield path


def test_every_value_has_a_default_and_a_line_in_deploy_readme() -> None:
    defaults = default_values()
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    paths = list(value_paths(schema()))
    assert len(paths) > 20
    for path in paths:
        node: Any = defaults
        for part in path.split("."):
            assert isinstance(node, dict), f"values.yaml: {path} is inside a value that is not a map"
            assert part in node, f"values.yaml has no default for {path}"
            node = node[part]
        assert f"`{path}`" in readme, f"deploy/README.md does not describe {path}"


def test_every_operator_flag_is_a_value_or_set_by_the_chart() -> None:
    flags = {action.dest for action in cli.parser()._actions if action.dest != "help"}
    # operator.eventsQps is --events-qps (dest events_qps); operator.logLevel is LOG_LEVEL (--log-level).
    offered = {
        "".join(f"_{c.lower()}" if c.isupper() else c for c in name) for name in default_values()["operator"]
    }
    covered = offered | set(FLAGS_NOT_VALUES)
    assert flags - covered == set(), "operator flags the chart neither offers nor sets"
    assert covered - flags == set(), "values for flags the operator does not have"


CUSTOM_OPERATOR: Final = {
    "workers": 7,
    "logLevel": "DEBUG",
    "leaderElect": False,
    "leaseDuration": "40s",
    "renewDeadline": "30s",
    "retryPeriod": "5s",
    "qps": 12.5,
    "burst": 33,
    "eventsQps": 7.5,
    "eventsBurst": 9,
    "createConcurrency": 3,
    "forceDeleteAfter": "2m30s",
    "nodeLostAfter": "45s",
    "progressInterval": "500ms",
    "discoveryInterval": "1m",
    "fastHttpClient": False,
}


def test_operator_values_reach_the_operators_flags(chart: Helm) -> None:
    objects = chart.template({"operator": CUSTOM_OPERATOR, "replicas": 1})
    container = operator_container(objects)
    settings = operator_settings(container)
    assert settings == {
        **settings,
        "workers": 7,
        "leader_elect": False,
        "lease_duration": 40.0,
        "renew_deadline": 30.0,
        "retry_period": 5.0,
        "qps": 12.5,
        "burst": 33,
        "events_qps": 7.5,
        "events_burst": 9,
        "create_concurrency": 3,
        "force_delete_after": 150.0,
        "node_lost_after": 45.0,
        "progress_interval": 0.5,
        "discovery_interval": 60.0,
        "fast_http_client": False,
        "lease_name": RELEASE,
        "namespace": None,
    }
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["LOG_LEVEL"] == "DEBUG"
    assert one(objects, "Deployment")["spec"]["replicas"] == 1


def test_default_values_are_the_operators_defaults(chart: Helm) -> None:
    """values.yaml shows the operator's defaults, so reading it tells what the operator does."""
    settings = operator_settings(operator_container(chart.template()))
    assert settings == dict(vars(cli.parser().parse([], environ={})))


@pytest.mark.parametrize(
    ("lease", "renew", "retry"),
    [
        ("15s", "10s", "2s"),
        ("10s", "10s", "2s"),
        ("1m", "59.5s", "2s"),
        ("11s", "10s", "8333ms"),
        ("11s", "10s", "8334ms"),
        ("1h", "2.4s", "2s"),
        ("1h", "2401ms", "2s"),
        ("1m30s", "1m", "500ms"),
        ("90s", "1m30s", "1s"),
        ("15s", "10s", "0s"),
    ],
)
def test_leader_election_durations_are_refused_exactly_when_the_operator_refuses_them(
    chart: Helm, lease: str, renew: str, retry: str
) -> None:
    operator = {"leaseDuration": lease, "renewDeadline": renew, "retryPeriod": retry}
    result = chart.attempt("template", RELEASE, str(CHART), values={"operator": operator})
    args = [f"--lease-duration={lease}", f"--renew-deadline={renew}", f"--retry-period={retry}"]
    if retry == "0s":
        assert result.returncode != 0
        assert "operator.retryPeriod (0s) must be more than 0" in result.stderr
        return
    problem = cli.check_relations(cli.parser().parse(args, environ={}))
    if problem is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0, f"helm rendered what the operator refuses: {problem}"
        assert "operator.renewDeadline" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"replicas": "two"}, "replicas"),
        ({"replicas": -1}, "replicas"),
        ({"replicas": 1.5}, "replicas"),
        ({"replica": 2}, "'replica'"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"image": {"repository": ""}}, "repository"),
        ({"image": {"repository": "team/operator:1.0"}}, "repository"),
        ({"image": {"tag": "1.0 beta"}}, "tag"),
        ({"imagePullSecrets": ["regcred"]}, "imagePullSecrets"),
        ({"resources": {"limits": {"memory": "lots"}}}, "memory"),
        ({"resources": {"limit": {"memory": "1Gi"}}}, "'limit'"),
        ({"nodeSelector": {"pool": 3}}, "pool"),
        ({"podAnnotations": {"note": True}}, "note"),
        ({"tolerations": {"key": "gpu"}}, "tolerations"),
        ({"operator": {"workers": 0}}, "workers"),
        ({"operator": {"workers": "4"}}, "workers"),
        ({"operator": {"logLevel": "verbose"}}, "logLevel"),
        ({"operator": {"leaderElect": "false"}}, "leaderElect"),
        ({"operator": {"leaseDuration": "15"}}, "leaseDuration"),
        ({"operator": {"nodeLostAfter": "-30s"}}, "nodeLostAfter"),
        ({"operator": {"progressInterval": "5 s"}}, "progressInterval"),
        ({"operator": {"qps": -1}}, "qps"),
        ({"operator": {"burst": 0}}, "burst"),
        ({"operator": {"lease-duration": "15s"}}, "'lease-duration'"),
        ({"watchNamespace": "ML_Team"}, "watchNamespace"),
        ({"watchNamespace": "x" * 64}, "watchNamespace"),
        ({"monitoring": {"enabled": "yes"}}, "enabled"),
        ({"monitoring": {"labels": {"release": 1}}}, "release"),
        ({"networkPolicy": {"enable": True}}, "'enable'"),
        ({"crds": {"install": "false"}}, "install"),
        ({"fullnameOverride": "Trainingjob"}, "fullnameOverride"),
        ({"fullnameOverride": "t" * 56}, "fullnameOverride"),
    ],
)
def test_wrong_values_are_refused_naming_them(chart: Helm, values: Manifest, named: str) -> None:
    message = refusal(chart, values)
    assert "values don't meet the specifications of the schema" in message, message
    assert named in message, message


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"operator": {"leaderElect": False}},
            "replicas (2) must be 0 or 1 when operator.leaderElect is false",
        ),
        (
            {"operator": {"leaseDuration": "10s"}},
            "operator.leaseDuration (10s) must be longer than operator.renewDeadline (10s)",
        ),
        (
            {"operator": {"renewDeadline": "2s", "retryPeriod": "2s"}},
            "operator.renewDeadline (2s) must be longer than 1.2 x operator.retryPeriod (2s)",
        ),
    ],
)
def test_values_that_contradict_each_other_are_refused(chart: Helm, values: Manifest, message: str) -> None:
    assert message in refusal(chart, values)


def test_without_leader_election_one_replica_renders(chart: Helm) -> None:
    objects = chart.template({"operator": {"leaderElect": False}, "replicas": 1})
    assert operator_settings(operator_container(objects))["leader_elect"] is False


def test_placement_image_and_pod_values_reach_the_deployment(chart: Helm) -> None:
    values: Manifest = {
        "image": {"repository": "registry.example:5000/ml/trainingjob-operator", "tag": "1.2.3"},
        "imagePullSecrets": [{"name": "regcred"}],
        "replicas": 3,
        "resources": {"requests": {"cpu": "200m", "memory": "300Mi"}, "limits": {"memory": "1Gi"}},
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}
                    ]
                }
            }
        },
        "podAnnotations": {"example.com/team": "ml-platform"},
    }
    deployment = one(chart.template(values), "Deployment")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert deployment["spec"]["replicas"] == 3
    assert container["image"] == "registry.example:5000/ml/trainingjob-operator:1.2.3"
    # Helm merges maps of values into the defaults: limits.cpu and the os node selector stay (a null
    # value removes a key).
    assert container["resources"] == merged(default_values()["resources"], values["resources"])
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "system"}
    assert pod["spec"]["tolerations"] == values["tolerations"]
    assert pod["spec"]["affinity"] == values["affinity"]
    assert pod["metadata"]["annotations"] == {
        "kubectl.kubernetes.io/default-container": "operator",
        "example.com/team": "ml-platform",
    }
    version = kube_minor_version()
    assert validate_manifest(deployment, version) is None


def crd_directory_objects() -> list[tuple[str, str]]:
    """(kind, name) of every object crd/ installs."""
    found = []
    for path in sorted((REPO / "crd").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
            found += [(doc["kind"], doc["metadata"]["name"]) for doc in documents]
    return sorted(found)


def of_crd(objects: list[Manifest]) -> list[Manifest]:
    return [obj for obj in objects if (obj["kind"], obj["metadata"]["name"]) in crd_directory_objects()]


def test_crd_values_cover_crds_objects(chart: Helm) -> None:
    """crd/'s objects, the CRD, the trainers' ClusterRole and the admission policies (the trainers', the
    immutable spec fields', the escalation policy), go together: a cluster that has them from `make
    install` takes the chart with crds.install=false, and an uninstall that keeps the CRD's jobs keeps the
    policies that guard them."""
    kept = of_crd(chart.template())
    assert sorted((obj["kind"], obj["metadata"]["name"]) for obj in kept) == crd_directory_objects()
    assert len(kept) == 8
    assert all(obj["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"} for obj in kept)
    assert not of_crd(chart.template({"crds": {"install": False}}))
    removed = of_crd(chart.template({"crds": {"keep": False}}))
    assert len(removed) == len(kept)
    assert not [obj for obj in removed if "annotations" in obj["metadata"]], (
        "without keep, uninstall deletes them"
    )


def test_monitoring_labels_go_on_servicemonitor_and_rule(chart: Helm) -> None:
    objects = chart.template({"monitoring": {"enabled": True, "labels": {"release": "prometheus"}}})
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert one(objects, kind)["metadata"]["labels"]["release"] == "prometheus"


def test_every_option_validates_strictly(chart: Helm) -> None:
    version = kube_minor_version()
    objects = chart.template(merged(EVERY_OPTION, {"monitoring": {"labels": {"release": "prometheus"}}}))
    unknown = {obj["kind"] for obj in objects if validate_manifest(obj, version) is not None}
    assert unknown <= FOREIGN_KINDS
