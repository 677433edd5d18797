"""A real node beside the fake ones: kubelet, containerd and runc, a CNI bridge, kube-proxy and CoreDNS
(`hack/dev-cluster.sh up --with real-node`).

Why: kwok only writes statuses, so the operator had never met a container: its own image, a pod
network, a DNS server, a kubelet's SIGTERM and grace period, a cgroup's OOM kill, `kubectl exec`.
This node runs pods for real, on this machine, as a real cluster does, without touching anything of
the machine that `down` does not put back (testbed/node/nodehost.py keeps the record).

How it is put together (the settings and their reasons are in testbed/node/nodeconfig.py):
- a network namespace with one veth pair to the machine; inside it containerd (its shims in a
  cgroup of their own), the kubelet, kube-proxy (iptables) and CoreDNS, and the relay to the API
  server (testbed/node/apiforward.py) that the node and its pods use as the API server's address;
- the kubelet registers with the taint `ml.example.com/real-node=true:NoSchedule` (only pods that
  tolerate it land here) and the node advertises fake `nvidia.com/gpu` capacity like the kwok nodes;
- images are built here (testbed/images) and imported into containerd, whose root is kept in the cache
  so that a later `up` does not import them again;
- the cluster's `kubernetes` and `kube-dns` Services get EndpointSlices at the node's address;
- PersistentVolumes come from the local-path provisioner (testbed/node/storage.py), a
  default StorageClass whose volumes are directories of this node.

Each process is a component in state.json like the control plane's (`status`, `stop`, `start`,
`restart` work on `kubelet`, `containerd`, ...); `down` drains the node and undoes everything.
"""

from __future__ import annotations

import json
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any, Final

from testbed import images
from testbed.cluster import kube_bins
from testbed.cluster.pki import issue, kubeconfig_text
from testbed.cluster.processes import kubectl, spawn, stop_processes, wait_for
from testbed.cluster.state import (
    LOGS,
    NODE_COMPONENTS,
    REAL_NODE,
    RUN,
    read_state,
    read_versions,
    say,
    write_state,
)
from testbed.common import DEV, REPO, ToolError, http_ok, still_running, wait_until
from testbed.node import nodeconfig, nodehost, nodeimages, nodelock, storage
from testbed.node.apiforward import inside
from testbed.node.nodeconfig import NODE_NAME, NodePaths
from testbed.node.nodeimages import IMAGES

NAME: Final = REAL_NODE
# The node's processes, in the order they start (they stop in the reverse order).
PROCESSES: Final = NODE_COMPONENTS
BUILDS: Final = ("kubelet", "containerd", "coredns", "local-path-provisioner")
DRAIN_TIMEOUT: Final = 90.0


def paths() -> NodePaths:
    return NodePaths(
        run=RUN / "node",
        sockets=nodeconfig.SOCKETS_DIR,
        kubelet_root=nodeconfig.STATE_DIR / "kubelet",
        images=kube_bins.cache_base() / "node",
    )


def build(names: tuple[str, ...] = IMAGES) -> dict[str, Path]:
    """The node's binaries, built the first time (hack/kube-bins.sh), and its images `names`
    (testbed/images)."""
    built = build_binaries()
    build_images(names)
    return built


def build_binaries() -> dict[str, Path]:
    require_prerequisites()
    return {name: kube_bins.ensure(name) for name in BUILDS}


def build_images(names: tuple[str, ...] = IMAGES) -> None:
    require_prerequisites()
    for name in names:
        images.ensure(name)


def require_prerequisites() -> None:
    reasons = nodehost.missing_prerequisites()
    if reasons:
        raise ToolError("the real node cannot run here: " + "; ".join(reasons))


def versions() -> dict[str, str]:
    """The versions of the node's components (state.json's `versions`, shown by `status`)."""
    found: dict[str, str] = {}
    for name in BUILDS:
        recorded = read_versions(kube_bins.ensure(name))
        found[f"{name.upper().replace('-', '_')}_VERSION"] = recorded["VERSION"]
    return found


def add(state: dict[str, Any], builds: dict[str, Path], image_names: tuple[str, ...] = IMAGES) -> None:
    """Starts the node on the running cluster of `state` with the images `image_names`, holding the
    machine's real-node lock (nodelock) until `remove`; on any failure, undoes what it did."""
    holder = claim_machine()
    try:
        reclaim_left_behind()
    except BaseException:
        nodelock.release(holder)
        raise
    record: dict[str, Any] = {"started": time.time()}
    if holder is not None:
        record["lock_holder"] = holder
    state["real_node"] = record
    try:
        start(state, builds, record, image_names)
    except BaseException:
        say("the real node did not start; taking down what was started")
        remove(state)
        raise


def start(
    state: dict[str, Any], builds: dict[str, Path], record: dict[str, Any], image_names: tuple[str, ...]
) -> None:
    node = paths()
    bin_dir = Path(state["bin_dir"])
    pki = RUN / "pki"
    processes: dict[str, Any] = state["processes"]
    began = time.monotonic()

    record["mounts_under"] = [str(path) for path in mount_prefixes(node)]
    nodehost.note_fixed_paths(record)
    nodehost.save_tunables(record)
    keep_record(record)
    nodehost.create_network(record)
    keep_record(record)
    nodehost.create_cgroups(record)
    keep_record(record)

    write_files(node, pki)
    say(f"real node: network namespace {nodeconfig.NETNS} at {nodeconfig.NODE_IP}, cgroups, configuration")

    binary, args = nodeconfig.in_cgroup(
        nodeconfig.RUNTIME_CGROUP,
        *nodeconfig.in_node(builds["containerd"] / "containerd", ["--config", str(node.containerd_config)]),
    )
    spawn("containerd", Path(binary), args, processes)
    wait_for("containerd", lambda: containerd_serves(builds), processes)
    import_images(builds, image_names)

    apiserver_port = int(state["ports"]["kube-apiserver"])
    spawn(
        "node-api",
        Path(shutil.which("python3") or "/usr/bin/python3"),
        [
            "-m",
            "testbed.node.apiforward",
            f"--netns={nodeconfig.netns_path()}",
            f"--listen={nodeconfig.NODE_IP}:{nodeconfig.API_PORT}",
            f"--to=127.0.0.1:{apiserver_port}",
        ],
        processes,
        cwd=REPO,
    )
    labels = nodeconfig.node_labels()
    spawn(
        "kubelet", *_in_node(builds["kubelet"] / "kubelet", nodeconfig.kubelet_args(node, labels)), processes
    )
    wait_for("the real node Ready", lambda: node_ready(bin_dir), processes, timeout=120)
    advertise_gpus(bin_dir, nodeconfig.GPUS)

    apply(bin_dir, [*nodeconfig.api_objects(), *nodeconfig.dns_objects()])
    spawn(
        "kube-proxy", *_in_node(builds["kubelet"] / "kube-proxy", nodeconfig.kube_proxy_args(node)), processes
    )
    spawn("coredns", *_in_node(builds["coredns"] / "coredns", nodeconfig.coredns_args(node)), processes)
    wait_for("CoreDNS ready", lambda: in_node_http_ok("http://127.0.0.1:8181/ready"), processes)
    wait_for("kube-proxy healthy", lambda: in_node_http_ok("http://127.0.0.1:10256/healthz"), processes)

    storage.start(state, builds["local-path-provisioner"], node, image_reference("busybox"))
    state.setdefault("optional", []).append(NAME)
    write_state("optional", state["optional"])
    say(f"real node {NODE_NAME} Ready in {time.monotonic() - began:.1f}s (taint {nodeconfig.TAINT['key']})")


def keep_record(record: dict[str, Any]) -> None:
    """What the node changed on the machine, written down before each next change: in the checkout's
    state and on the machine (for an `up` after this run was killed)."""
    write_state("real_node", record)
    nodehost.save_record(record)


def claim_machine(*, hold: bool = True) -> dict[str, Any] | None:
    """The machine's real-node lock for the node about to start (nodelock.claim), before anything is
    changed: refused in one line while another session or node holds it. Without `hold`, only
    whether it could be taken (`up` asks before it builds or starts anything)."""
    for attempt in (1, 2):
        try:
            if not hold:
                nodelock.check()
                return None
            return nodelock.claim(DEV, LOGS / "real-node-lock.log")
        except nodelock.RealNodeHeld:
            if attempt == 2 or not release_left_behind_holder():
                raise
    return None


def release_left_behind_holder() -> bool:
    """Stops the lock's holder of a node killed without its `down` (no process of a node runs, and the
    machine's record of what it left names the holder); whether it did."""
    if nodehost.running_pids():
        return False
    holder = (nodehost.left_behind() or {}).get("lock_holder")
    if not holder or not still_running(holder):
        return False
    say(f"real node: stopping the lock holder (pid {holder['pid']}) of a node stopped without its `down`")
    nodelock.release(holder)
    return True


def reclaim_left_behind() -> None:
    """Undoes what a node killed before its `down` left on the machine (a network namespace, cgroups,
    mounts, sysctls), or refuses when a node runs here already: one machine has one real node."""
    running = nodehost.running_pids()
    if running:
        shown = ", ".join(str(pid) for pid in sorted(running)[:5])
        raise ToolError(
            f"a real node runs on this machine already (processes {shown}); take it down in the checkout "
            "that started it (`hack/dev-cluster.sh remove real-node` or `down`)"
        )
    left = nodehost.left_behind()
    if left is not None:
        say("real node: undoing what a node stopped without its `down` left on the machine")
        undo_host(left)


def mount_prefixes(node: NodePaths) -> list[Path]:
    """Where the kubelet and containerd mount (volumes, root filesystems, sandbox namespaces)."""
    return [node.run, node.sockets, node.kubelet_root, node.images / "root"]


def _in_node(binary: Path, args: list[str]) -> tuple[Path, list[str]]:
    command, full = nodeconfig.in_node(binary, args)
    return Path(command), full


def write_files(node: NodePaths, pki: Path) -> None:
    """Certificates, kubeconfigs and configuration files of the node's processes."""
    for directory in (
        node.run,
        node.sockets,
        node.cni_conf_dir,
        node.cni_data,
        node.kubelet_root,
        node.images,
    ):
        directory.mkdir(parents=True, exist_ok=True)
    issue(
        pki,
        "real-node",
        f"/O=system:nodes/CN=system:node:{NODE_NAME}",
        f"subjectAltName=IP:{nodeconfig.NODE_IP},DNS:{NODE_NAME}\nextendedKeyUsage=serverAuth,clientAuth",
    )
    server = f"https://{nodeconfig.NODE_IP}:{nodeconfig.API_PORT}"
    node.kubeconfig("kubelet").write_text(kubeconfig_text(server, pki, user="real-node"))
    for user in ("kube-proxy", "coredns"):
        node.kubeconfig(user).write_text(kubeconfig_text(server, pki))
    for kubeconfig in node.run.glob("*.kubeconfig"):
        kubeconfig.chmod(0o600)
    (node.images / "root").mkdir(parents=True, exist_ok=True)
    node.containerd_config.write_text(nodeconfig.containerd_config(node, sandbox_image()))
    (node.cni_conf_dir / "10-trainingjob-node.conflist").write_text(
        nodeconfig.json_text(nodeconfig.cni_conflist(node))
    )
    node.kubelet_config.write_text(nodeconfig.json_text(nodeconfig.kubelet_config(node, pki)))
    node.resolv_conf.write_text("")
    node.kube_proxy_config.write_text(nodeconfig.json_text(nodeconfig.kube_proxy_config(node)))
    node.corefile.write_text(nodeconfig.corefile(node))


def sandbox_image() -> str:
    """containerd's sandbox image: the short reference (the CRI plugin normalizes it)."""
    return image_reference("pause")


def image_reference(name: str) -> str:
    """The first reference of a locally built image, as the project writes it (no registry host)."""
    return images.describe(name).references[0]


def ctr(builds: dict[str, Path], *args: str, check: bool = True, timeout: float = 60) -> str:
    return nodehost.run(
        str(builds["containerd"] / "ctr"),
        f"--address={paths().containerd_socket}",
        f"--namespace={nodeconfig.CONTAINERD_NAMESPACE}",
        *args,
        check=check,
        timeout=timeout,
    )


def containerd_serves(builds: dict[str, Path]) -> bool:
    """containerd answers on its socket (`ctr version` prints its client's version either way)."""
    try:
        ctr(builds, "version")
    except ToolError:
        return False
    return True


def import_images(builds: dict[str, Path], names: tuple[str, ...] = IMAGES) -> None:
    """Imports the images `names` into the node's containerd (testbed/node/nodeimages.py)."""
    nodeimages.import_images(partial(ctr, builds), names)


def node_ready(bin_dir: Path) -> bool:
    found = kubectl(bin_dir, "get", "node", NODE_NAME, "-o", "json", check=False)
    if not found:
        return False
    conditions = json.loads(found).get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def advertise_gpus(bin_dir: Path, gpus: int) -> None:
    """Fake `nvidia.com/gpu` capacity in the node's status, as a device plugin would report it;
    containers get no device (CPU training). The kubelet keeps an extended resource it does not
    manage across its status updates and restarts."""
    patch = {
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)}, "allocatable": {"nvidia.com/gpu": str(gpus)}}
    }
    kubectl(
        bin_dir, "patch", "node", NODE_NAME, "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )


def apply(bin_dir: Path, objects: list[dict[str, Any]]) -> None:
    listing = {"apiVersion": "v1", "kind": "List", "items": objects}
    kubectl(bin_dir, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(listing))


def in_node_http_ok(url: str) -> bool:
    """A health endpoint that listens on the node's loopback (inside its namespace)."""
    with inside(str(nodeconfig.netns_path())):
        return http_ok(url, expect="")


def endpoint(component: str) -> str:
    """Where one of the node's processes serves, for `status`."""
    node = f"{nodeconfig.NODE_IP} in netns {nodeconfig.NETNS}"
    return {
        "containerd": str(paths().containerd_socket),
        "node-api": f"{nodeconfig.NODE_IP}:{nodeconfig.API_PORT} in netns {nodeconfig.NETNS}",
        "kubelet": f"{nodeconfig.NODE_IP}:{nodeconfig.KUBELET_PORT} in netns {nodeconfig.NETNS}",
        "kube-proxy": f"iptables of {node}",
        "coredns": f"{nodeconfig.NODE_IP}:53 in netns {nodeconfig.NETNS}",
        "local-path-provisioner": "(a client of the API server)",
    }[component]


def wait_ready(state: dict[str, Any], component: str) -> None:
    """After `start` or `restart` of one of the node's processes: waits until it serves again."""
    processes: dict[str, Any] = state["processes"]
    bin_dir = Path(state["bin_dir"])
    checks = {
        "containerd": lambda: containerd_serves({"containerd": kube_bins.ensure("containerd")}),
        "kubelet": lambda: node_ready(bin_dir),
        "kube-proxy": lambda: in_node_http_ok("http://127.0.0.1:10256/healthz"),
        "coredns": lambda: in_node_http_ok("http://127.0.0.1:8181/ready"),
    }
    check = checks.get(component)
    if check is not None:
        wait_for(f"{component} serving", check, processes, timeout=120)


# -------------------------------------------------------------------------------------------- down


def remove(state: dict[str, Any]) -> None:
    """Drains the node (while the API server still runs), stops its processes, kills what is left in
    its cgroups, unmounts, and undoes every change on the machine recorded in state["real_node"]."""
    record: dict[str, Any] = state.get("real_node") or {}
    processes: dict[str, Any] = state.get("processes", {})
    bin_dir = Path(state["bin_dir"]) if state.get("bin_dir") else None
    ours = {name: processes[name] for name in PROCESSES if name in processes}
    if bin_dir is not None and "kubelet" in ours:
        drain(bin_dir)
    stop_processes({name: ours[name] for name in ours if name != "containerd"}, timeout=20.0)
    nodehost.kill_cgroups([nodeconfig.CGROUP_ROOT])
    if "containerd" in ours:
        stop_processes({"containerd": ours["containerd"]}, timeout=10.0)
    undo_host(record)
    if bin_dir is not None:
        kubectl(bin_dir, "delete", "node", NODE_NAME, "--ignore-not-found", "--wait=false", check=False)
    for name in ours:
        processes.pop(name, None)
    if state.get("optional") and NAME in state["optional"]:
        state["optional"].remove(NAME)
    state.pop("real_node", None)
    if read_state() is not None:
        write_state("processes", processes)
        write_state("optional", state.get("optional", []))
        write_state("real_node", None)


def undo_host(record: dict[str, Any]) -> None:
    """Undoes on the machine what `record` says the node changed, once its processes are stopped:
    whatever is left in its cgroups is killed, its mounts unmounted (where the run that made them
    mounted), then cgroups, sysctls, network and fixed paths; the node's own directories go whatever
    an earlier run left (the images' root is the cache's)."""
    nodehost.kill_cgroups([nodeconfig.CGROUP_ROOT, nodeconfig.RUNTIME_CGROUP])
    node = paths()
    recorded = [Path(path) for path in record.get("mounts_under") or []]
    nodehost.unmount_under([*recorded, *mount_prefixes(node)])
    nodehost.remove_cgroups(record)
    nodehost.restore_tunables(record)
    nodehost.remove_network(record)
    nodehost.remove_fixed_paths(record)
    for directory in (node.sockets, nodeconfig.STATE_DIR, node.run):
        shutil.rmtree(directory, ignore_errors=True)
    nodehost.forget_record()
    nodelock.release(record.get("lock_holder"))  # last: the machine is as it was


def drain(bin_dir: Path) -> None:
    """`kubectl drain` of the node: cordoned, every pod deleted with its grace period (not evicted: a
    disruption budget must not hold a node that is going away), then the containers the kubelet
    stops are waited for. A pod a finalizer holds (the operator's, when no operator runs any more)
    stays in the API, so drain is not asked to wait for pods to go: only their containers must stop.
    Best effort: whatever still runs afterwards is killed with the node's cgroups."""
    kubectl(bin_dir, "cordon", NODE_NAME, check=False)
    kubectl(
        bin_dir,
        "drain",
        NODE_NAME,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--disable-eviction",
        "--timeout=5s",
        check=False,
    )
    try:
        wait_until(
            "the real node's containers to stop",
            lambda: not nodehost.cgroup_pids([f"{nodeconfig.CGROUP_ROOT}/kubepods"]),
            timeout=DRAIN_TIMEOUT,
        )
    except ToolError as error:
        say(f"{error}; killing what is left")
