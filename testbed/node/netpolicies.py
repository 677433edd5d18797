"""NetworkPolicy enforcement on the real node: `hack/dev-cluster.sh up --with network-policies`.

Why: the API server stores NetworkPolicies but enforces none; a network plugin does. The real node's
CNI bridge enforces nothing, so a policy there would be proven by nothing. This part adds an enforcer,
kube-network-policies (hack/kube-bins.sh builds it, with the changes its entry explains), as a process
inside the node's network namespace: its nftables table there hands the first packet of every
connection from or to a pod that some policy selects to nfnetlink_queue, and it answers each with the
verdict of the policies (the packets of a connection it accepted pass without asking). Pods no policy
selects are not looked at.

The API server, off the node. Pods reach the API server through the `kubernetes` Service. On the real
node its endpoint is the relay at the node's own address (testbed/node/apiforward.py), and a pod's
connection to an address of its own node is delivered to the node (netfilter's input path), which no
NetworkPolicy enforcer judges: an egress rule for the API server would be proven by nothing. So while
this part runs, the Service's endpoint is a second relay in a network namespace of its own,
`API_NETNS`, joined to the node by a veth pair (`NODE_END` in the node, `API_IP` on the other side),
as an API server sits on control-plane nodes of a real cluster: the node forwards a pod's connection
to it, and the enforcer judges it against the policies' ipBlocks like any other.

Not judged here (testbed/node/README.md, docs/security.md): traffic the node itself originates as root (the
kubelet's probes; the enforcer accepts it before asking), and the pods' DNS, which goes to CoreDNS, a
process at the node's own address (input path, as above), not to pods of kube-dns.

What it changes, recorded in state.json's `network_policies` before each change and undone by `remove
network-policies`, by `remove real-node` and by `down` (before the node is taken down): the network
namespace `API_NETNS` (the veth pair goes with it; its other end is in the node's namespace), the
`kubernetes` EndpointSlice (back to the node's relay), the enforcer's nftables table in the node's
namespace (the enforcer removes it as it stops; removed again in case it was killed), and the two
processes. A namespace left by a run killed before its `down` is found by its name and removed by the
next `up --with network-policies`.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any, Final

from testbed.cluster.pki import kubeconfig_text
from testbed.cluster.processes import kubectl, spawn, stop_processes, wait_for
from testbed.cluster.state import (
    LOGS,
    NETWORK_POLICIES,
    NETWORK_POLICY_COMPONENTS,
    RUN,
    read_state,
    read_versions,
    record_started,
    say,
    write_state,
)
from testbed.common import REPO, ToolError
from testbed.node import nodeconfig, nodehost
from testbed.node.apiforward import inside

NAME: Final = NETWORK_POLICIES
BUILD: Final = "kube-network-policies"
# Its processes, in the order they start: the API server's relay off the node, then the enforcer.
RELAY, ENFORCER = NETWORK_POLICY_COMPONENTS

# The API server's host, as the node's pods see it: a network namespace of its own, one hop from the node.
API_NETNS: Final = "trainingjob-apiserver"
NODE_END: Final = "tjapi0"
API_END: Final = "eth0"
NODE_END_IP: Final = "172.31.250.5"
API_IP: Final = "172.31.250.6"
LINK_PREFIX: Final = 30
# The enforcer's queue, its nftables table (its default name) and its metrics, on the node's loopback.
QUEUE: Final = 100
TABLE: Final = "kube-network-policies"
METRICS: Final = "127.0.0.1:9080"
NFT: Final = Path("/usr/sbin/nft")
QUEUE_STATS: Final = "/proc/net/netfilter/nfnetlink_queue"


def missing_prerequisites() -> list[str]:
    """Why the enforcer cannot run here (empty when it can), beside the real node's own reasons."""
    reasons = nodehost.missing_prerequisites()
    if not NFT.exists():
        reasons.append(f"{NFT} is missing (Debian's nftables; `make node-tools` installs it)")
    if not Path(QUEUE_STATS).exists():
        reasons.append("the kernel has no nfnetlink_queue (CONFIG_NETFILTER_NETLINK_QUEUE)")
    return reasons


def enforcer_args() -> list[str]:
    """The enforcer's flags: the node it guards, its queue, metrics on the node's loopback, and the DNS
    workaround off: it is for kernels before 6.12 (its own help says so), and it would judge the
    pods' DNS on the prerouting hook, where CoreDNS at the node's address is no pod a rule can name."""
    return [
        f"--hostname-override={nodeconfig.NODE_NAME}",
        f"--nfqueue-id={QUEUE}",
        f"--metrics-bind-address={METRICS}",
        "--netfilter-bug-1766-fix=false",
        "--v=2",
    ]


def api_endpoint_slice(address: str) -> dict[str, Any]:
    """The `kubernetes` Service's EndpointSlice (testbed/node/nodeconfig.py's) pointing at `address`."""
    (endpoint_slice,) = nodeconfig.api_objects()
    (endpoint,) = endpoint_slice["endpoints"]
    endpoint["addresses"] = [address]
    if address != nodeconfig.NODE_IP:
        endpoint.pop("nodeName", None)
    return endpoint_slice


# ---------------------------------------------------------------------------------------------- add


def add(state: dict[str, Any], build_dir: Path) -> None:
    """Starts the enforcer and moves the API server's endpoint off the node, on the running cluster of
    `state` with its real node; one that runs is left alone. On any failure, undoes what it did."""
    if state.get("network_policies"):
        say(f"{NAME} is already running")
        return
    if not state.get("real_node"):
        raise ToolError(f"{NAME} needs the real node: `hack/dev-cluster.sh up --with real-node,{NAME}`")
    reasons = missing_prerequisites()
    if reasons:
        raise ToolError(f"{NAME} cannot run here: " + "; ".join(reasons))
    remove_left_behind()
    record: dict[str, Any] = {}
    state["network_policies"] = record
    try:
        start(state, build_dir, record)
    except BaseException:
        say(f"{NAME} did not start; undoing what was done (logs in {LOGS})")
        remove(state)
        raise
    record_started(state, NAME, {"KUBE_NETWORK_POLICIES_VERSION": read_versions(build_dir)["VERSION"]})


def start(state: dict[str, Any], build_dir: Path, record: dict[str, Any]) -> None:
    bin_dir = Path(state["bin_dir"])
    processes: dict[str, Any] = state["processes"]
    record["netns"] = API_NETNS
    write_state("network_policies", record)
    create_network()

    python = Path(shutil.which("python3") or "/usr/bin/python3")
    relay_args = [
        "-m",
        "testbed.node.apiforward",
        f"--netns={api_netns_path()}",
        f"--listen={API_IP}:{nodeconfig.API_PORT}",
        f"--to=127.0.0.1:{state['ports']['kube-apiserver']}",
    ]
    spawn(RELAY, python, relay_args, processes, cwd=REPO)
    wait_ready(state, RELAY)
    record["endpoint"] = API_IP
    write_state("network_policies", record)
    apply(bin_dir, api_endpoint_slice(API_IP))
    wait_for("kube-proxy sending the kubernetes Service to the relay", endpoint_moved, processes)

    kubeconfig = RUN / "node" / f"{ENFORCER}.kubeconfig"
    kubeconfig.write_text(kubeconfig_text(f"https://{nodeconfig.NODE_IP}:{nodeconfig.API_PORT}", RUN / "pki"))
    kubeconfig.chmod(0o600)
    binary, args = nodeconfig.in_node(
        "/usr/bin/env", [f"KUBECONFIG={kubeconfig}", str(build_dir / BUILD), *enforcer_args()]
    )
    spawn(ENFORCER, Path(binary), args, processes)
    record["table"] = TABLE
    write_state("network_policies", record)
    wait_ready(state, ENFORCER)
    say(
        f"{NAME}: kube-network-policies enforces NetworkPolicies on {nodeconfig.NODE_NAME} (queue {QUEUE}); "
        f"the kubernetes Service's endpoint is {API_IP}:{nodeconfig.API_PORT}, one hop off the node"
    )


def api_netns_path() -> Path:
    return nodehost.NETNS_DIR / API_NETNS


def in_node(*command: str, check: bool = True) -> str:
    return nodehost.run("/usr/bin/nsenter", f"--net={nodeconfig.netns_path()}", "--", *command, check=check)


def in_api_netns(*command: str) -> str:
    return nodehost.run("ip", "netns", "exec", API_NETNS, *command)


def create_network() -> None:
    """The API server's network namespace, its veth pair to the node (made inside the node's namespace,
    its peer put straight into the new one: nothing appears on the machine), and the route back to the
    pods; the node forwards between its pods and the new link."""
    nodehost.run("ip", "netns", "add", API_NETNS)
    in_node("ip", "link", "add", NODE_END, "type", "veth", "peer", "name", API_END, "netns", API_NETNS)
    in_node("ip", "addr", "add", f"{NODE_END_IP}/{LINK_PREFIX}", "dev", NODE_END)
    in_node("ip", "link", "set", NODE_END, "up")
    in_node("sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
    in_api_netns("ip", "addr", "add", f"{API_IP}/{LINK_PREFIX}", "dev", API_END)
    in_api_netns("ip", "link", "set", API_END, "up")
    in_api_netns("ip", "link", "set", "lo", "up")
    in_api_netns("ip", "route", "add", nodeconfig.POD_CIDR, "via", NODE_END_IP)


def apply(bin_dir: Path, obj: dict[str, Any]) -> None:
    text = nodeconfig.json_text(obj)
    kubectl(bin_dir, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text)


# ------------------------------------------------------------------------------------------ readiness


def relay_serves() -> bool:
    """The relay accepts connections at API_IP, as a pod's would arrive: from the node's namespace."""
    with inside(str(nodeconfig.netns_path())):
        try:
            socket.create_connection((API_IP, nodeconfig.API_PORT), timeout=2).close()
        except OSError:
            return False
    return True


def endpoint_moved() -> bool:
    """kube-proxy's rules in the node send the `kubernetes` Service to the relay off the node."""
    rules = in_node("iptables-save", "-t", "nat", check=False)
    return f"{API_IP}:{nodeconfig.API_PORT}" in rules


def queue_bound() -> bool:
    """The enforcer reads its queue (nfnetlink_queue's table in the node's namespace lists it) and its
    nftables table is in place."""
    queues = in_node("cat", QUEUE_STATS, check=False)
    bound = any(line.split()[:1] == [str(QUEUE)] for line in queues.splitlines())
    return bound and bool(in_node(str(NFT), "list", "table", "inet", TABLE, check=False))


def wait_ready(state: dict[str, Any], component: str) -> None:
    """After `start`, `restart` or `add`: waits until the relay or the enforcer serves."""
    check = relay_serves if component == RELAY else queue_bound
    wait_for(f"{component} serving", check, state["processes"], timeout=90)


def endpoint(component: str) -> str:
    """Where the relay or the enforcer serves, for `status`."""
    if component == RELAY:
        return f"{API_IP}:{nodeconfig.API_PORT} in netns {API_NETNS}"
    return f"queue {QUEUE} and metrics {METRICS} in netns {nodeconfig.NETNS}"


def metrics() -> str:
    """The enforcer's Prometheus metrics (its verdicts by protocol and family among them)."""
    host, _, port = METRICS.rpartition(":")
    with inside(str(nodeconfig.netns_path())), socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(f"GET /metrics HTTP/1.0\r\nHost: {METRICS}\r\n\r\n".encode())
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace").partition("\r\n\r\n")[2]


# ------------------------------------------------------------------------------------------- remove


def remove(state: dict[str, Any]) -> None:
    """Undoes everything `add` did, in reverse, by what state["network_policies"] records: the
    enforcer stopped and its table removed, the Service's endpoint back at the node's relay, the
    relay stopped, the namespace deleted."""
    record: dict[str, Any] = state.get("network_policies") or {}
    processes: dict[str, Any] = state.get("processes", {})
    ours = {name: processes[name] for name in NETWORK_POLICY_COMPONENTS if name in processes}
    if ENFORCER in ours:
        stop_processes({ENFORCER: ours[ENFORCER]}, timeout=20.0)
    if record.get("table") and nodeconfig.netns_path().exists():
        in_node(str(NFT), "delete", "table", "inet", TABLE, check=False)
    if record.get("endpoint") and state.get("bin_dir") and state.get("real_node"):
        with contextlib.suppress(ToolError, subprocess.SubprocessError):
            apply(Path(state["bin_dir"]), api_endpoint_slice(nodeconfig.NODE_IP))
    if RELAY in ours:
        stop_processes({RELAY: ours[RELAY]})
    if record.get("netns"):
        delete_network()
    for name in ours:
        processes.pop(name, None)
    if NAME in state.get("optional", []):
        state["optional"].remove(NAME)
    state.pop("network_policies", None)
    if read_state() is not None:
        write_state("processes", processes)
        write_state("optional", state.get("optional", []))
        write_state("network_policies", None)


def delete_network() -> None:
    """The namespace goes with its end of the veth pair, and so the pair; the node's end with it."""
    if api_netns_path().exists():
        nodehost.run("ip", "netns", "delete", API_NETNS, check=False)
    if nodeconfig.netns_path().exists():
        in_node("ip", "link", "delete", NODE_END, check=False)


def remove_left_behind() -> None:
    """A namespace of this name that no running part of this cluster made: left by a run killed before
    its `down`. Nothing runs in it (the relay only listens there), so it is deleted."""
    if api_netns_path().exists():
        say(f"{NAME}: removing the network namespace {API_NETNS} an earlier run left behind")
        delete_network()
