"""`hack/dev-cluster.sh up --with network-policies`: the enforcer on the real node, and how it goes.

Why: the part changes the machine (a network namespace for the API server's relay, the enforcer's
nftables table in the node's namespace) and the cluster (the `kubernetes` Service's endpoint), so
`remove network-policies` must undo each, and `up --with network-policies` must bring the node it runs
on. Its settings are checked without a cluster; its effect on pods is
tests/e2e/test_network_policy_real_node.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed import Kubectl
from testbed.addons.optional import parse_with
from testbed.cluster.state import NETWORK_POLICY_COMPONENTS
from testbed.common import DEV, ToolError
from testbed.node import netpolicies, nodeconfig, nodehost
from testbed.tests.clusters import dev_cluster, read_state


def test_network_policies_bring_the_real_node_first() -> None:
    assert parse_with("network-policies") == ["real-node", "network-policies"]
    assert parse_with("kueue,network-policies,real-node") == ["kueue", "real-node", "network-policies"]
    assert parse_with("real-node,network-policies") == ["real-node", "network-policies"]
    with pytest.raises(ToolError, match=r"one of: .*network-policies"):
        parse_with("calico")


def test_the_enforcer_guards_the_real_node_with_its_metrics_on_the_nodes_loopback() -> None:
    args = netpolicies.enforcer_args()
    assert f"--hostname-override={nodeconfig.NODE_NAME}" in args
    assert f"--nfqueue-id={netpolicies.QUEUE}" in args
    assert "--metrics-bind-address=127.0.0.1:9080" in args
    assert "--netfilter-bug-1766-fix=false" in args


def test_the_api_servers_endpoint_moves_off_the_node_and_back() -> None:
    off = netpolicies.api_endpoint_slice(netpolicies.API_IP)
    (endpoint,) = off["endpoints"]
    assert endpoint["addresses"] == [netpolicies.API_IP]
    assert "nodeName" not in endpoint, "the relay is not on the node"
    (back,) = nodeconfig.api_objects()
    assert netpolicies.api_endpoint_slice(nodeconfig.NODE_IP) == back
    assert off["metadata"] == back["metadata"]


def machine_and_cluster(cluster: Kubectl) -> dict[str, Any]:
    """What the part changes: the namespaces, the enforcer's table, the Service's endpoint, processes."""
    (endpoint_slice,) = cluster.items(
        "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes"
    )
    table = nodehost.run(
        "ip", "netns", "exec", nodeconfig.NETNS, "nft", "list", "tables", check=False
    ).split()
    processes = read_state(DEV)["processes"]
    return {
        "netns": sorted(p.name for p in nodehost.NETNS_DIR.iterdir()),
        "table": netpolicies.TABLE in table,
        "endpoint": endpoint_slice["endpoints"][0]["addresses"],
        "processes": sorted(set(NETWORK_POLICY_COMPONENTS) & set(processes)),
        "optional": read_state(DEV)["optional"],
    }


def test_remove_undoes_it_and_up_brings_it_back(network_policies: Kubectl) -> None:
    running = machine_and_cluster(network_policies)
    assert running["table"] is True
    assert netpolicies.API_NETNS in running["netns"]
    assert running["endpoint"] == [netpolicies.API_IP]
    assert running["processes"] == sorted(NETWORK_POLICY_COMPONENTS)
    try:
        dev_cluster("remove", "network-policies")
        removed = machine_and_cluster(network_policies)
        assert removed["table"] is False
        assert netpolicies.API_NETNS not in removed["netns"]
        assert removed["endpoint"] == [nodeconfig.NODE_IP]
        assert removed["processes"] == []
        assert "network-policies" not in removed["optional"]
        assert "real-node" in removed["optional"]
        assert json.loads((DEV / "run" / "state.json").read_text()).get("network_policies") is None
    finally:
        dev_cluster("up", "--with", "network-policies")
    assert machine_and_cluster(network_policies) == running


def test_a_namespace_left_behind_is_removed_by_the_next_up(network_policies: Kubectl) -> None:
    """A run killed before its `down` leaves the relay's namespace; the next `up --with` removes it
    before making its own."""
    dev_cluster("remove", "network-policies")
    try:
        nodehost.run("ip", "netns", "add", netpolicies.API_NETNS)
        assert Path(nodehost.NETNS_DIR / netpolicies.API_NETNS).exists()
        result = dev_cluster("up", "--with", "network-policies")
        assert f"removing the network namespace {netpolicies.API_NETNS}" in result.stderr
    finally:
        dev_cluster("up", "--with", "network-policies")
    assert machine_and_cluster(network_policies)["endpoint"] == [netpolicies.API_IP]
