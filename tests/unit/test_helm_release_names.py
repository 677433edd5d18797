"""The Helm chart under another release name: every name follows the release and the objects still
refer to each other; fullnameOverride, and a release named after the chart.

Split out of tests/unit/test_helm_chart.py (the chart against the kustomize install, lint, values).
"""

from __future__ import annotations

import re

from tests.helmchart import (
    Helm,
    one,
    operator_container,
    operator_settings,
)
from tests.unit import helm_support
from tests.unit.helm_support import EVERY_OPTION

# The shared fixtures, bound here so that pytest finds them for this module's tests.
chart = helm_support.chart


# ------------------------------------------------------------------------ another release name


def test_names_follow_the_release_and_stay_consistent(chart: Helm) -> None:
    """Another release name and namespace: every reference between the objects still holds."""
    objects = chart.template(EVERY_OPTION, release="ml-ops", namespace="ops")
    fullname = "ml-ops-trainingjob-operator"
    namespaced = [
        obj
        for obj in objects
        if obj["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding")
        and not obj["kind"].startswith("ValidatingAdmissionPolicy")
    ]
    assert {obj["metadata"]["namespace"] for obj in namespaced} == {"ops", "ml-training"}
    for binding in (obj for obj in objects if obj["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": fullname, "namespace": "ops"}]
        roles = [
            o
            for o in objects
            if o["kind"] == binding["roleRef"]["kind"] and o["metadata"]["name"] == binding["roleRef"]["name"]
        ]
        assert roles, f"{binding['metadata']['name']} refers to a role the release lacks"
    deployment = one(objects, "Deployment", fullname)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == fullname
    settings = operator_settings(operator_container(objects))
    assert settings["lease_name"] == fullname
    lease_role = one(objects, "Role", f"{fullname}-leader-election")
    assert {name for rule in lease_role["rules"] for name in rule.get("resourceNames", [])} == {fullname}
    service = one(objects, "Service", f"{fullname}-metrics")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert pod_labels["app.kubernetes.io/instance"] == "ml-ops", "two releases never share pods"
    for selector in (
        one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        one(objects, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
    ):
        assert selector == deployment["spec"]["selector"]["matchLabels"]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    expressions = [
        rule["expr"] for group in one(objects, "PrometheusRule")["spec"]["groups"] for rule in group["rules"]
    ]
    selectors = [selector for expr in expressions for selector in re.findall(r'job="[^"]*"', expr)]
    assert len(selectors) > 20
    assert set(selectors) == {f'job="{fullname}-metrics"'}, "the alerts select the release's scrape job"


def test_fullname_override_and_a_release_named_after_the_chart(chart: Helm) -> None:
    names = {obj["metadata"]["name"] for obj in chart.template({"fullnameOverride": "tjo"}, release="x")}
    # The CRD, the trainers' ClusterRole and the admission policies are the API's, named as the operator
    # knows them; the policies on the operator's writes are the release's.
    assert names >= {
        "tjo",
        "tjo-leader-election",
        "tjo-metrics",
        "tjo-writes",
        "tjo-rolebindings",
        "trainingjob-trainer",
        "trainingjobs.ml.example.com",
        "trainingjob-trainer-progress",
        "trainingjob-immutable-spec",
        "trainingjob-escalation",
    }
    names = {obj["metadata"]["name"] for obj in chart.template(release="team-trainingjob-operator")}
    assert "team-trainingjob-operator" in names
    long_release = "a" * 53
    deployment = one(chart.template(release=long_release), "Deployment")
    assert len(deployment["metadata"]["name"]) <= 55
    assert not deployment["metadata"]["name"].endswith("-")
