"""NetworkPolicies enforced for real: the operator's own, and a tenant namespace that denies by default.

Why: a NetworkPolicy is only as good as what enforces it, and the API server enforces none. Here the
local cluster's real node runs kube-network-policies (`hack/dev-cluster.sh up --with network-policies`,
testbed/node/netpolicies.py), which judges every new connection of a pod a policy selects, and the
`kubernetes` Service's endpoint sits one hop off the node, as a control plane does, so that a pod's
connection to the API server is judged like any other. What the policies allow is shown to work and
what they leave out is shown to fail, each against a control that succeeds:
- the operator deployed with `make deploy OVERLAY=network-policy` (the API server's addresses read
  from the cluster; its image pulled from the local registry, which the node's containerd reaches
  from the node itself, outside any policy) is Ready (its probes pass), reconciles a job (it reaches
  the API server) and resolves names, while its connection to a pod serving HTTP times out, which
  another pod reaches; the chart looks up the same addresses;
- the kubelet's probes pass a policy that refuses all ingress (node traffic is not judged);
- docs/security.md's tenant policies: a two-worker job trains with DDP over the pod network and its
  progress reaches the status; deleting the API server's rule makes the reports time out and the
  status stop, while training completes.

Connections are tried from inside the pods with a 3 s connect timeout (a dropped SYN is what a refused
connection looks like here); every other wait is for a condition, with a deadline.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from crd import contract
from testbed import NETWORK_POLICIES, REAL_NODE, REGISTRY, Image, Kubectl, pod_on_node, wait_for
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.deployed_operator import (
    NODE_SELECTOR,
    TOLERATE,
    operator_pods,
    reconciled,
    wait_lease_free,
    wait_ready_replicas,
)
from tests.e2e.jobs import status_of, wait_for_state
from tests.e2e.operator_identity import NAMESPACE as OPERATOR_NAMESPACE
from tests.e2e.realnode import training_job, wait_running
from tests.e2e.test_deploy_real_node import (
    PULL_SECRET,
    SELECTOR,
    image_in_the_registry,
    make,
    pull_access,
)
from tests.e2e.test_docs_yaml import manifests, yaml_blocks
from tests.helmchart import CHART, RELEASE, Helm

pytestmark = pytest.mark.slow

JsonDict = dict[str, Any]
SECURITY: Final = REPO / "docs" / "security.md"
# docs/security.md's stand-in for the reader's API server endpoints (a documentation address).
DOCUMENTED_ADDRESS: Final = "192.0.2.10/32"
SERVER_PORT: Final = 8000
# Run inside a pod: one TCP connection, with a deadline; prints "connected" or why not.
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("connected")
except OSError as error:
    print(type(error).__name__, error)
"""
RESOLVE = "import socket, sys; print(socket.gethostbyname(sys.argv[1]))"
REPORT_FAILED: Final = "progress report could not reach the Kubernetes API"
# What CONNECT prints when the connection's SYN was dropped.
TIMED_OUT: Final = ("TimeoutError", "timeout")


def api_server_endpoints(cluster: Kubectl) -> tuple[list[str], list[int]]:
    """The `kubernetes` Service's endpoint addresses and ports, as the policies must name them."""
    slices = cluster.items("endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes")
    addresses = [a for s in slices for e in s.get("endpoints") or [] for a in e["addresses"]]
    ports = [int(p["port"]) for s in slices for p in s.get("ports") or []]
    return addresses, ports


def http_server(name: str, **spec: Any) -> JsonDict:
    """A pod on the real node serving HTTP on SERVER_PORT, Ready when its kubelet's probe gets an answer."""
    probe = {"httpGet": {"path": "/", "port": SERVER_PORT}, "periodSeconds": 1}
    pod = pod_on_node(
        name,
        ["python3", "-m", "http.server", str(SERVER_PORT)],
        container={"readinessProbe": probe, "workingDir": "/tmp"},
        **spec,
    )
    pod["metadata"]["labels"] = {"app": name}
    return pod


def idle_pod(name: str) -> JsonDict:
    return pod_on_node(name, ["sleep", "3600"])


def started(cluster: Kubectl, namespace: str, *pods: JsonDict) -> dict[str, str]:
    """Creates the pods and waits until they are Ready; their IPs by name."""
    for pod in pods:
        cluster.apply(pod, "-n", namespace)
    return {
        pod["metadata"]["name"]: str(
            wait_running(cluster, namespace, pod["metadata"]["name"], timeout=120)["status"]["podIP"]
        )
        for pod in pods
    }


def connect(cluster: Kubectl, namespace: str, pod: str, address: str, port: int) -> str:
    """One TCP connection from inside `pod` (its first container) to address:port."""
    output = cluster.run("exec", "-n", namespace, pod, "--", "python3", "-c", CONNECT, address, str(port))
    return output.strip().splitlines()[-1]


def refused_connection(cluster: Kubectl, namespace: str, pod: str, address: str, port: int) -> str | None:
    """The outcome of a connection from `pod` once it times out (the enforcer dropped its SYN); None
    while it still connects (the enforcer has not yet seen the policy or the pod)."""
    outcome = connect(cluster, namespace, pod, address, port)
    return outcome if outcome != "connected" else None


def dropped_packets() -> float:
    """The enforcer's count of packets it refused (kube-network-policies' own metric)."""
    text = NETWORK_POLICIES.metrics()
    pattern = r'^kube_network_policies_packet_count\{[^}]*verdict="drop"[^}]*\} (\S+)$'
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


def deny_ingress(name: str, app: str) -> JsonDict:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name},
        "spec": {"podSelector": {"matchLabels": {"app": app}}, "policyTypes": ["Ingress"], "ingress": []},
    }


def policy_blocks() -> list[str]:
    """docs/security.md's blocks of NetworkPolicies (the tenant's), which the tests here apply."""
    return [
        block
        for block in yaml_blocks(SECURITY.read_text(encoding="utf-8"))
        if all(manifest["kind"] == "NetworkPolicy" for manifest in manifests(block))
    ]


def tenant_policies(cluster: Kubectl) -> tuple[str, list[JsonDict]]:
    """docs/security.md's tenant block, with the cluster's API server endpoints for the documented
    stand-in; its text and its objects."""
    (text,) = policy_blocks()
    addresses, ports = api_server_endpoints(cluster)
    assert DOCUMENTED_ADDRESS in text
    assert ports == [6443], "docs/security.md's port is the local API server's"
    blocks = "\n".join(f"        - ipBlock:\n            cidr: {address}/32" for address in addresses)
    text = text.replace(f"        - ipBlock:\n            cidr: {DOCUMENTED_ADDRESS}", blocks)
    return text, manifests(text)


# ------------------------------------------------------------------------------------------- tests


def test_the_node_is_enforcing_and_the_api_server_is_one_hop_off_it(network_policies: Kubectl) -> None:
    addresses, ports = api_server_endpoints(network_policies)
    assert (addresses, ports) == ([NETWORK_POLICIES.api_ip], [REAL_NODE.api_port])
    assert NETWORK_POLICIES.queue_bound()


def test_the_kubelet_probes_a_pod_whose_policy_refuses_all_ingress(
    network_policies: Kubectl, namespace: str
) -> None:
    """Node-originated traffic (the kubelet's probes, sent as root) is not judged: a pod whose policy
    refuses all ingress is probed Ready, while another pod's connection to it is dropped; the same
    connection to a pod without a policy goes through."""
    cluster = network_policies
    cluster.apply(deny_ingress("refuse-all", "fenced"), "-n", namespace)
    ips = started(cluster, namespace, http_server("fenced"), http_server("open"), idle_pod("client"))
    assert connect(cluster, namespace, "client", ips["open"], SERVER_PORT) == "connected"
    drops = dropped_packets()
    refused = wait_for(
        "the enforcer dropping the client's connection to the fenced pod",
        lambda: refused_connection(cluster, namespace, "client", ips["fenced"], SERVER_PORT),
        timeout=60,
    )
    assert refused.startswith(TIMED_OUT), refused
    assert dropped_packets() > drops
    # Ready all along: every readiness probe since the pod started came from the node, through the policy.
    fenced = cluster.get_json("pod", "fenced", "-n", namespace)
    assert [c["ready"] for c in fenced["status"]["containerStatuses"]] == [True]


@pytest.mark.usefixtures("registry")
def test_the_deployed_operator_reaches_the_api_server_and_dns_and_nothing_else(
    network_policies: Kubectl,
    namespace: str,
    node_images: Callable[[str], Image],
    helm: Path,
    tmp_path: Path,
) -> None:
    cluster = network_policies
    img = image_in_the_registry("network-policy")
    REGISTRY.push(node_images("operator"), img.removeprefix(f"{REGISTRY.host}/"))
    ips = started(cluster, namespace, http_server("target"), idle_pod("neighbour"))
    assert connect(cluster, namespace, "neighbour", ips["target"], SERVER_PORT) == "connected"

    # The chart looks the API server's endpoints up in the cluster (what `helm install` does).
    chart = Helm(helm, tmp_path / "helm", cluster.kubeconfig)
    charted = chart.run(
        *("template", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--dry-run=server"),
        *("--set", "networkPolicy.enabled=true", "--show-only", "templates/networkpolicy.yaml"),
    )
    charted_rule = yaml.safe_load(charted)["spec"]["egress"][0]
    expected_rule = {
        "to": [{"ipBlock": {"cidr": f"{NETWORK_POLICIES.api_ip}/32"}}],
        "ports": [{"port": REAL_NODE.api_port, "protocol": "TCP"}],
    }
    assert charted_rule == expected_rule

    variables = {
        "IMG": img,
        "IMAGE_PULL_SECRETS": PULL_SECRET,
        "NODE_SELECTOR": NODE_SELECTOR,
        "TOLERATE": TOLERATE,
        "OVERLAY": "network-policy",
    }
    wait_lease_free(cluster)
    try:
        pull_access(cluster)
        deployed = make("deploy", cluster, **variables)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        policy = cluster.get_json("networkpolicy", "trainingjob-operator", "-n", OPERATOR_NAMESPACE)
        assert policy["spec"]["egress"][0] == expected_rule
        # Ready: the kubelet's probes pass; reconciling: it reaches the API server through the rule.
        pods = wait_ready_replicas(cluster, SELECTOR, 2)
        reconciled(cluster, namespace, "behind-a-policy")
        pod = str(pods[0]["metadata"]["name"])

        def from_operator(*args: str) -> str:
            output = cluster.run("exec", "-n", OPERATOR_NAMESPACE, pod, "-c", "operator", "--", *args)
            return output.strip().splitlines()[-1]

        resolved = from_operator("python", "-c", RESOLVE, "kubernetes.default.svc.cluster.local")
        assert resolved == REAL_NODE.api_service_ip
        drops = dropped_packets()

        def refused() -> str | None:
            outcome = from_operator("python", "-c", CONNECT, ips["target"], str(SERVER_PORT))
            return outcome if outcome != "connected" else None

        outcome = wait_for("the operator's connection to another pod dropped", refused, timeout=60)
        assert outcome.startswith(TIMED_OUT), outcome
        assert dropped_packets() > drops
        # The same pod still reaches the API server (a fresh connection, judged like the refused one).
        api = from_operator("python", "-c", CONNECT, REAL_NODE.api_service_ip, "443")
        assert api == "connected"
        assert connect(cluster, namespace, "neighbour", ips["target"], SERVER_PORT) == ("connected")
        cluster.run("delete", "trainingjobs", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
    finally:
        removed = make("undeploy", cluster, **variables)
        assert removed.returncode == 0, removed.stdout + removed.stderr
    assert cluster.get_or_none("networkpolicy", "trainingjob-operator", "-n", OPERATOR_NAMESPACE) is None
    assert operator_pods(cluster, SELECTOR) == []


def test_a_job_trains_in_a_default_deny_namespace_and_reports_through_the_documented_rule(
    network_policies: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    cluster = network_policies
    text, policies = tenant_policies(cluster)
    assert [p["metadata"]["name"] for p in policies] == [
        "default-deny",
        "trainingjob-gangs",
        "trainingjob-progress-reports",
    ]
    applied = cluster.run("apply", "-n", namespace, "-f", "-", stdin=text)
    assert applied.count("created") == 3, applied
    start_operator("--progress-interval=0")
    name = "fenced"
    # Epochs of 2 s: long enough to take the reports' rule away midway.
    cluster.apply(training_job(name, epochs=8, env={"TRAIN_STEP_SECONDS": "0.4"}), "-n", namespace)

    def reporting() -> JsonDict | None:
        status = status_of(cluster, namespace, name)
        return status if status.get("state") == "Running" and status.get("currentEpoch", 0) >= 1 else None

    during = wait_for("progress in status through the documented rule", reporting, timeout=240)
    assert during["totalEpochs"] == 8

    cluster.run("delete", "networkpolicy", "trainingjob-progress-reports", "-n", namespace)
    rank0 = f"{name}-worker-0"

    def report_failed() -> bool:
        log = cluster.run("logs", "-n", namespace, rank0, "-c", contract.CONTAINER_NAME, check=False)
        return REPORT_FAILED in log

    wait_for("rank 0's progress report timing out", report_failed, timeout=120)
    stalled = status_of(cluster, namespace, name).get("currentEpoch", 0)
    job = wait_for_state(cluster, namespace, name, "Completed", timeout=300)
    # The gang trained to the end over the pod network (the gangs' rule), but no report arrived once
    # the API server's rule was gone.
    assert job["status"]["currentEpoch"] == stalled < 8, job["status"]
    log = cluster.run("logs", "-n", namespace, rank0, "-c", contract.CONTAINER_NAME)
    assert "training finished: 8 epochs" in log, log[-2000:]
    print(f"\nprogress stopped at epoch {stalled} of 8 once the API server's rule was deleted")
