"""The Helm chart's metrics endpoint (deploy/helm/trainingjob-operator, values `metrics.*`): HTTPS with
the self-signed certificate and an unverified scrape by default, a cert-manager Secret mounted as the
serving certificate and verified by the ServiceMonitor, plain HTTP scraped plainly, the reader role
shipped; and the values the chart refuses.

Why apart from tests/unit/test_helm_chart.py: that module compares the chart with the kustomize
install; these values have no overlay to compare with (kustomize users patch their own, as
deploy/README.md says).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helmchart import NAMESPACE, RELEASE, Helm, one, operator_container, operator_settings
from tests.unit import helm_support
from tests.unit.test_helm_chart import refusal

chart = helm_support.chart

Manifest = dict[str, Any]


def endpoint(objects: list[Manifest]) -> Manifest:
    (found,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert isinstance(found, dict)
    return found


def pod_volumes(objects: list[Manifest]) -> list[Manifest]:
    volumes: list[Manifest] = one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
    return volumes


def test_metrics_are_https_with_a_token_and_a_self_signed_certificate_by_default(chart: Helm) -> None:
    objects = chart.template({"monitoring": {"enabled": True}})
    container = operator_container(objects)
    settings = operator_settings(container)
    assert (settings["metrics_secure"], settings["metrics_cert_path"]) == (True, None)
    assert [volume["name"] for volume in pod_volumes(objects)] == ["tmp"]
    scrape = endpoint(objects)
    assert scrape["scheme"] == "https"
    assert scrape["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert scrape["tlsConfig"] == {"insecureSkipVerify": True}, "a self-signed certificate: nothing to verify"
    reader = one(objects, "ClusterRole", f"{RELEASE}-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_a_certificate_secret_is_mounted_served_and_verified(chart: Helm) -> None:
    objects = chart.template({"monitoring": {"enabled": True}, "metrics": {"certSecret": "metrics-certs"}})
    container = operator_container(objects)
    path = operator_settings(container)["metrics_cert_path"]
    assert {"name": "metrics-certs", "mountPath": path, "readOnly": True} in container["volumeMounts"]
    volumes = {volume["name"]: volume for volume in pod_volumes(objects)}
    assert volumes["metrics-certs"]["secret"]["secretName"] == "metrics-certs"
    assert endpoint(objects)["tlsConfig"] == {
        "serverName": f"{RELEASE}-metrics.{NAMESPACE}.svc",
        "ca": {"secret": {"name": "metrics-certs", "key": "ca.crt"}},
    }


def test_plain_metrics_are_scraped_in_plain_http(chart: Helm) -> None:
    objects = chart.template({"monitoring": {"enabled": True}, "metrics": {"secure": False}})
    assert operator_settings(operator_container(objects))["metrics_secure"] is False
    scrape = endpoint(objects)
    assert not {"scheme", "bearerTokenFile", "tlsConfig"} & scrape.keys()


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"metrics": {"secure": "true"}}, "secure"),
        ({"metrics": {"certSecret": "Metrics_Certs"}}, "certSecret"),
        ({"metrics": {"port": 8443}}, "'port'"),
    ],
)
def test_wrong_metrics_values_are_refused_naming_them(chart: Helm, values: Manifest, named: str) -> None:
    message = refusal(chart, values)
    assert "values don't meet the specifications of the schema" in message, message
    assert named in message, message


def test_a_certificate_without_https_is_refused(chart: Helm) -> None:
    message = refusal(chart, {"metrics": {"secure": False, "certSecret": "metrics-certs"}})
    assert "metrics.certSecret needs metrics.secure: plain HTTP serves no certificate" in message
