"""The operator's NetworkPolicy names the API server's endpoints, never an open destination.

Why: no selector can name the API server (it is no pod), so its addresses come from the cluster: the
`kubernetes` Service's EndpointSlices. `make deploy OVERLAY=network-policy` (hack/deploy.sh) and the
chart fill them in; without one they must stop, in one line naming the setting, rather than install a
rule that lets the operator reach any host. Here, without a cluster: the variables and values are
rendered into the rule, the script and the chart render the same policy for the same endpoints, and
what is missing or malformed is refused. deploy/README.md's kustomization for kubectl users renders
with the addresses it patches in. The rule on a cluster, looked up and enforced, is
tests/e2e/test_network_policy_real_node.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest

from tests.cluster import REPO
from tests.e2e.operator_identity import render
from tests.e2e.test_docs_yaml import yaml_blocks
from tests.helmchart import Helm, HelmError, compare, load_all, one
from tests.unit import helm_support
from tests.unit.test_deploy_placement import deploy_script

chart = helm_support.chart

Manifest = dict[str, Any]

ADDRESSES: Final = "10.0.0.2,10.0.0.3,fd00:10::2,10.1.0.0/28"
RULE: Final = {
    "to": [
        {"ipBlock": {"cidr": "10.0.0.2/32"}},
        {"ipBlock": {"cidr": "10.0.0.3/32"}},
        {"ipBlock": {"cidr": "fd00:10::2/128"}},
        {"ipBlock": {"cidr": "10.1.0.0/28"}},
    ],
    "ports": [{"port": 6443, "protocol": "TCP"}],
}
# No cluster answers here: the script and the chart must take everything from their settings.
NO_CLUSTER: Final = {"KUBECONFIG": "/nonexistent/kubeconfig"}


def policy(objects: list[Manifest]) -> Manifest:
    return one(objects, "NetworkPolicy")


def rendered_script(**variables: str) -> list[Manifest]:
    result = deploy_script("render", OVERLAY="network-policy", **NO_CLUSTER, **variables)
    assert result.returncode == 0, result.stderr
    return load_all(result.stdout)


def test_make_deploy_names_the_endpoints_it_is_given() -> None:
    objects = rendered_script(API_SERVER_ADDRESSES=ADDRESSES, API_SERVER_PORTS="6443")
    api_server, dns = policy(objects)["spec"]["egress"]
    assert api_server == RULE
    assert dns["ports"] == [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
    assert not list(REPO.glob(".dev-deploy.*")), "the throwaway kustomization was left behind"


def test_make_deploy_and_the_chart_render_the_same_policy(chart: Helm) -> None:
    ours = rendered_script(API_SERVER_ADDRESSES=ADDRESSES, API_SERVER_PORTS="6443")
    api_server = {"addresses": ADDRESSES.split(","), "ports": [6443]}
    values = {"networkPolicy": {"enabled": True, "apiServer": api_server}}
    assert compare(chart.template(values), ours) == []


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({}, "deploy: API_SERVER_ADDRESSES: no address of the API server"),
        ({"API_SERVER_ADDRESSES": "10.0.0.2"}, "deploy: API_SERVER_PORTS: no port of the API server's"),
        (
            {"API_SERVER_ADDRESSES": "10.0.0.256", "API_SERVER_PORTS": "6443"},
            "deploy: API_SERVER_ADDRESSES: '10.0.0.256' is not an IP address or a CIDR",
        ),
        (
            {"API_SERVER_ADDRESSES": "10.0.0.0/8x", "API_SERVER_PORTS": "6443"},
            "deploy: API_SERVER_ADDRESSES: '10.0.0.0/8x'",
        ),
        (
            {"API_SERVER_ADDRESSES": "10.0.0.2", "API_SERVER_PORTS": "70000"},
            "deploy: API_SERVER_PORTS: '70000' is not a port number",
        ),
    ],
)
def test_make_deploy_without_an_endpoint_stops_in_one_line(variables: dict[str, str], message: str) -> None:
    result = deploy_script("render", OVERLAY="network-policy", **NO_CLUSTER, **variables)
    assert result.returncode != 0
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(message), result.stderr


def test_the_endpoints_are_only_for_the_network_policy_overlay() -> None:
    result = deploy_script("render", OVERLAY="monitoring", API_SERVER_ADDRESSES="10.0.0.2")
    assert result.returncode != 0
    assert result.stderr.strip() == (
        "deploy: API_SERVER_ADDRESSES and API_SERVER_PORTS are for OVERLAY=network-policy"
    )


@pytest.mark.parametrize(
    ("api_server", "named"),
    [
        ({"addresses": [], "ports": []}, "networkPolicy.apiServer.addresses: no address of the API server"),
        ({"addresses": ["10.0.0.2"], "ports": []}, "networkPolicy.apiServer.ports: no port"),
    ],
)
def test_the_chart_without_an_endpoint_stops_naming_the_value(
    chart: Helm, api_server: Manifest, named: str
) -> None:
    """`helm template` has no cluster to look them up in, as `helm install` has (the e2e test)."""
    with pytest.raises(HelmError) as refused:
        chart.template({"networkPolicy": {"enabled": True, "apiServer": api_server}})
    (line,) = [line for line in refused.value.stderr.splitlines() if line.startswith("Error:")]
    assert named in line, line


@pytest.mark.parametrize(
    ("api_server", "named"),
    [
        ({"addresses": ["api.example"], "ports": [6443]}, "/networkPolicy/apiServer/addresses/0"),
        ({"addresses": ["10.0.0.2"], "ports": [0]}, "/networkPolicy/apiServer/ports/0"),
    ],
)
def test_the_chart_refuses_a_malformed_endpoint(chart: Helm, api_server: Manifest, named: str) -> None:
    with pytest.raises(HelmError) as refused:
        chart.template({"networkPolicy": {"enabled": True, "apiServer": api_server}})
    assert named in refused.value.stderr


def test_the_readmes_kustomization_patches_the_endpoints_in(tmp_path: Path) -> None:
    """deploy/README.md's kustomization of one's own, beside deploy/ as it says, rendered by kubectl."""
    readme = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    (block,) = [text for text in yaml_blocks(readme) if "kind: Kustomization" in text]
    beside = tmp_path / "mine"
    beside.mkdir()
    (tmp_path / "deploy").symlink_to(REPO / "deploy")
    (beside / "kustomization.yaml").write_text(block, encoding="utf-8")
    api_server, _ = policy(render(beside))["spec"]["egress"]
    assert api_server == {
        "to": [{"ipBlock": {"cidr": "10.0.0.2/32"}}, {"ipBlock": {"cidr": "10.0.0.3/32"}}],
        "ports": [{"port": 6443, "protocol": "TCP"}],
    }
