"""The local control plane does what every other test relies on.

Fake GPU nodes are Ready, pods requesting GPUs run, owned objects are garbage-collected, the kubelet
stand-in helpers end pods and lose nodes, everything listens on 127.0.0.1 only, and hack/dev-cluster.sh
copes with a second `up`, a dead component, a stale run directory, racing starts and a failing build;
dev processes registered with `run` are reused, refused or stopped as documented.
The fault tests run a second, throwaway cluster in a temporary directory so the session's cluster is
left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

from testbed import Kubectl, add_disruption_condition, end_pod, lose_node, restore_node, wait_for
from testbed.cluster.nodes import KWOK_NODE_LABEL
from testbed.cluster.state import NODE_COMPONENTS
from testbed.common import DEV, REPO, listening_addresses, pid_running
from testbed.node import netpolicies, nodeconfig
from testbed.tests.clusters import SCRIPT, dev_cluster, listening_ports, read_state

# ------------------------------------------------------------------------------ the session cluster


def test_four_ready_gpu_nodes(cluster: Kubectl) -> None:
    nodes = cluster.items("nodes")
    assert len(nodes) >= 4
    for node in nodes[:4]:
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready
        assert ready[0]["status"] == "True"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["status"]["allocatable"]["cpu"] == "64"
        assert node["status"]["allocatable"]["memory"] == "512Gi"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"]
        assert not [t for t in node["spec"].get("taints", []) if t["key"] == "node.kubernetes.io/not-ready"]


def test_fake_nodes_are_at_loopback_and_the_api_server_calls_kubelets_with_its_certificate(
    cluster: Kubectl,
) -> None:
    """kwok's nodes name 127.0.0.1 as their address, so a request for a kwok pod's logs would dial
    nothing but loopback; the API server reaches a kubelet (the real node's) at its InternalIP, checks
    it with the cluster's CA and presents its own client certificate."""
    nodes = cluster.items("nodes", "-l", f"{KWOK_NODE_LABEL}=true")
    assert len(nodes) >= 4
    for node in nodes:
        addresses = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert addresses == ["127.0.0.1"], node["metadata"]["name"]
    flags = read_state(DEV)["processes"]["kube-apiserver"]["args"]
    assert "--kubelet-preferred-address-types=InternalIP" in flags
    assert any(flag.startswith("--kubelet-certificate-authority=") for flag in flags)
    assert any(flag.startswith("--kubelet-client-certificate=") for flag in flags)


def test_versions_are_stamped(cluster: Kubectl) -> None:
    version = json.loads(cluster.run("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"].startswith("v1.34.")
    assert version["clientVersion"]["gitVersion"] == version["serverVersion"]["gitVersion"]


def gpu_pod(namespace: str, name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": [
                {"name": "trainer", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ]
        },
    }


def test_gpu_pod_runs_and_is_garbage_collected_with_its_owner(cluster: Kubectl, namespace: str) -> None:
    cluster.run("create", "configmap", "owner", "-n", namespace)
    owner = cluster.get_json("configmap", "owner", "-n", namespace)
    cluster.apply(gpu_pod(namespace, "gpu", owner))
    pod = wait_for(
        "gpu pod Running",
        lambda: (
            (p := cluster.get_json("pod", "gpu", "-n", namespace))
            and p["status"].get("phase") == "Running"
            and p
        ),
    )
    assert pod["spec"]["nodeName"].startswith("gpu-node-")
    assert pod["status"]["podIP"]
    assert pod["status"]["containerStatuses"][0]["ready"] is True
    cluster.run("delete", "configmap", "owner", "-n", namespace)
    wait_for("pod garbage-collected", lambda: cluster.get_or_none("pod", "gpu", "-n", namespace) is None)


def test_gpu_requests_beyond_capacity_stay_pending(cluster: Kubectl, namespace: str) -> None:
    pod = gpu_pod(namespace, "too-big")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "9"
    cluster.apply(pod)
    message = wait_for(
        "scheduler reports Insufficient nvidia.com/gpu",
        lambda: next(
            (
                c.get("message")
                for c in cluster.get_json("pod", "too-big", "-n", namespace)["status"].get("conditions", [])
                if c["type"] == "PodScheduled" and c["status"] == "False"
            ),
            None,
        ),
    )
    assert "Insufficient nvidia.com/gpu" in message


def run_pod(cluster: Kubectl, namespace: str, name: str) -> None:
    cluster.apply(gpu_pod(namespace, name))
    wait_for(
        f"{name} Running",
        lambda: cluster.get_json("pod", name, "-n", namespace)["status"].get("phase") == "Running",
    )


def test_end_pod_succeeded_failed_oom_and_disruption(cluster: Kubectl, namespace: str) -> None:
    for name in ("ok", "oom", "preempted"):
        run_pod(cluster, namespace, name)
    ok = end_pod(cluster, namespace, "ok")
    assert ok["status"]["phase"] == "Succeeded"
    assert ok["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0

    oom = end_pod(cluster, namespace, "oom", exit_code=137, reason="OOMKilled")
    terminated = oom["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (oom["status"]["phase"], terminated["exitCode"], terminated["reason"]) == (
        "Failed",
        137,
        "OOMKilled",
    )

    add_disruption_condition(cluster, namespace, "preempted", "PreemptionByScheduler")
    preempted = end_pod(cluster, namespace, "preempted", exit_code=143, disruption="PreemptionByScheduler")
    conditions = {c["type"]: c for c in preempted["status"]["conditions"]}
    assert conditions["DisruptionTarget"]["status"] == "True"
    assert conditions["DisruptionTarget"]["reason"] == "PreemptionByScheduler"

    # kwok must not move an ended pod back to Running: read it back after a later write has landed.
    cluster.run("label", "pod", "oom", "-n", namespace, "observed=yes")
    assert cluster.get_json("pod", "oom", "-n", namespace)["status"]["phase"] == "Failed"


def test_lost_node_keeps_deleted_pods_terminating(cluster: Kubectl, namespace: str) -> None:
    run_pod(cluster, namespace, "victim")
    node = cluster.get_json("pod", "victim", "-n", namespace)["spec"]["nodeName"]
    lose_node(cluster, node)
    try:
        ready = next(
            c for c in cluster.get_json("node", node)["status"]["conditions"] if c["type"] == "Ready"
        )
        assert ready["status"] == "Unknown"
        cluster.run("delete", "pod", "victim", "-n", namespace, "--wait=false")
        pod = cluster.get_json("pod", "victim", "-n", namespace)
        assert pod["metadata"]["deletionTimestamp"]
        # A node that lost its kubelet never confirms the deletion; a pod on a healthy node would be gone
        # by now, so wait for that to happen elsewhere and check the victim is still there.
        run_pod(cluster, namespace, "witness")
        cluster.run("delete", "pod", "witness", "-n", namespace, "--wait=true", "--timeout=60s")
        assert cluster.get_or_none("pod", "victim", "-n", namespace) is not None
        cluster.run("delete", "pod", "victim", "-n", namespace, "--grace-period=0", "--force")
    finally:
        restore_node(cluster, node)
    wait_for(
        f"{node} Ready again",
        lambda: (
            next(c for c in cluster.get_json("node", node)["status"]["conditions"] if c["type"] == "Ready")[
                "status"
            ]
            == "True"
        ),
    )


def test_everything_listens_on_loopback_only(cluster: Kubectl) -> None:
    """Every component listens on 127.0.0.1; the real node's, when it runs, inside its own network
    namespace, on its loopback or the node's address (the API relay too, though its process is on the
    machine); the local-path provisioner and containerd's API (a unix socket) listen on no port."""
    state = read_state(DEV)
    processes = state["processes"]
    node = processes.get("kubelet")
    node_namespace = Path("/run/netns", nodeconfig.NETNS)
    seen = 0
    for name, process in processes.items():
        if name == netpolicies.RELAY:
            # Its socket is in a namespace of its own, which no process of its lives in: its address
            # is the API server's stand-in host one hop off the node, reached from the node.
            assert netpolicies.relay_serves(), f"{name} does not serve {netpolicies.API_IP}"
            seen += 1
            continue
        in_node = name in NODE_COMPONENTS
        addresses = listening_addresses(
            process["pid"], also_in_netns_of=node["pid"] if in_node and node else None
        )
        if name != "local-path-provisioner":
            assert addresses, f"{name} listens on nothing?"
        allowed = {"127.0.0.1", "::ffff:127.0.0.1"} | ({nodeconfig.NODE_IP} if in_node else set())
        for address, port in addresses:
            assert address in allowed, f"{name} listens on {address}:{port}"
            seen += 1
        if in_node and name not in ("node-api", "local-path-provisioner"):
            namespace = os.stat(f"/proc/{process['pid']}/ns/net").st_ino
            assert namespace == os.stat(node_namespace).st_ino, f"{name} is not in the node's namespace"
    assert seen >= 5


def test_status_names_versions_and_logs(cluster: Kubectl) -> None:
    out = dev_cluster("status").stdout
    assert "running" in out
    assert "v1.34." in out
    assert "etcd v3.6." in out
    assert "kwok v0.8" in out
    for component in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
        assert f"{component}.log" in out


def test_second_up_returns_at_once(cluster: Kubectl) -> None:
    before = read_state(DEV)
    result = dev_cluster("up")
    assert "already running" in result.stderr
    assert read_state(DEV)["processes"] == before["processes"]


def test_env_prints_exports(cluster: Kubectl) -> None:
    lines = dev_cluster("env").stdout.splitlines()
    exported = dict(line.removeprefix("export ").split("=", 1) for line in lines)
    assert exported["KUBECONFIG"].endswith("/kubeconfig")
    assert "/bin:" in exported["PATH"]
    # The cluster's own directory too, when it is not .dev/ (so hack/dev-cluster.sh finds it after eval).
    assert ("TJ_DEV_DIR" in exported) == ("TJ_DEV_DIR" in os.environ)
    out = subprocess.run(
        ["bash", "-c", f'eval "$({SCRIPT} env)" && kubectl get nodes -o name && kubectl plugin list'],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.count("node/") >= 4
    # The kubectl plugin is on PATH beside the cluster's kubectl (`kubectl trainingjob ...`).
    assert f"{DEV}/bin/kubectl-trainingjob" in out


# ------------------------------------------------------------------ dev processes registered with it


def extras() -> dict[str, Any]:
    found = json.loads((DEV / "run" / "state.json").read_text()).get("extras", {})
    assert isinstance(found, dict)
    return found


def test_run_registers_a_dev_process_and_stop_ends_it(cluster: Kubectl) -> None:
    name = f"t-sleeper-{uuid.uuid4().hex[:6]}"
    started = dev_cluster("run", name, "--", "sleep", "600", check=False)
    try:
        assert started.returncode == 0, started.stderr
        process = extras()[name]
        assert process["command"] == ["sleep", "600"]
        assert pid_running(process["pid"])
        assert Path(process["log"]) == DEV / "logs" / f"{name}.log"
        assert f"{name}" in dev_cluster("status", check=False).stdout
        again = dev_cluster("run", name, "--", "sleep", "600", check=False)  # the same command: reused
        assert again.returncode == 0
        assert "already running" in again.stderr
        assert extras()[name]["pid"] == process["pid"]
        other = dev_cluster("run", name, "--", "sleep", "700", check=False)  # another one: refused
        assert other.returncode == 1
        assert f"hack/dev-cluster.sh stop {name}" in other.stderr
    finally:
        stopped = dev_cluster("stop", name, check=False)
    assert stopped.returncode == 0, stopped.stderr
    assert not pid_running(process["pid"])
    assert name not in extras()
    assert "is not running" in dev_cluster("stop", name, check=False).stderr
    (DEV / "logs" / f"{name}.log").unlink(missing_ok=True)


# ------------------------------------------------------------------------- a throwaway second cluster


def test_fault_handling_on_a_second_cluster(scratch_dir: Path) -> None:
    assert "nothing running" in dev_cluster("down", dev_dir=scratch_dir).stderr

    dev_cluster("up", "--nodes", "1", dev_dir=scratch_dir)
    state = read_state(scratch_dir)
    pids = {name: proc["pid"] for name, proc in state["processes"].items()}
    ports = list(state["ports"].values())
    kubectl = Kubectl.from_dev_dir(scratch_dir)
    assert len(kubectl.items("nodes")) == 1

    # A dead component found by `up` leads to a clean restart with new processes.
    os.kill(pids["kube-scheduler"], 9)
    wait_for("scheduler gone", lambda: not pid_running(pids["kube-scheduler"]))
    result = dev_cluster("up", "--nodes", "1", dev_dir=scratch_dir)
    assert "kube-scheduler not running" in result.stderr
    assert "restarting it cleanly" in result.stderr
    for old in pids.values():
        assert not pid_running(old)
    restarted = read_state(scratch_dir)
    assert len(Kubectl.from_dev_dir(scratch_dir).items("nodes")) == 1

    # `restart` brings one component back with the same flags and port; after the API server, the
    # controller manager and the scheduler are restarted too (not etcd, not kwok).
    pids = {name: proc["pid"] for name, proc in read_state(scratch_dir)["processes"].items()}
    result = dev_cluster("restart", "kube-apiserver", dev_dir=scratch_dir)
    after = {name: proc["pid"] for name, proc in read_state(scratch_dir)["processes"].items()}
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        assert after[name] != pids[name], name
        assert not pid_running(pids[name]), name
        assert pid_running(after[name]), name
    assert (after["etcd"], after["kwok"]) == (pids["etcd"], pids["kwok"])
    assert "restarted kube-scheduler after the API server" in result.stderr
    assert len(Kubectl.from_dev_dir(scratch_dir).items("nodes")) == 1

    # `stop` is an outage on purpose, not a crash: `status` exits 0 and says so, `up` leaves the
    # component stopped (another session's `up` must not end a test's outage), `start` brings it back.
    dev_cluster("stop", "kube-apiserver", dev_dir=scratch_dir)
    stopped = read_state(scratch_dir)["processes"]["kube-apiserver"]
    assert stopped["stopped"] is True
    assert not pid_running(stopped["pid"])
    assert "stopped on purpose: kube-apiserver" in dev_cluster("status", dev_dir=scratch_dir).stdout
    assert "is stopped on purpose" in dev_cluster("up", "--nodes", "1", dev_dir=scratch_dir).stderr
    assert read_state(scratch_dir)["processes"]["kube-apiserver"]["pid"] == stopped["pid"]
    dev_cluster("start", "kube-apiserver", dev_dir=scratch_dir)
    restarted = read_state(scratch_dir)
    assert "stopped" not in restarted["processes"]["kube-apiserver"]
    assert pid_running(restarted["processes"]["kube-apiserver"]["pid"])
    assert len(Kubectl.from_dev_dir(scratch_dir).items("nodes")) == 1

    # Two `up`s racing: both succeed, one cluster.
    results: list[subprocess.CompletedProcess[str]] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(dev_cluster("up", "--nodes", "1", dev_dir=scratch_dir))
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(results) == 2
    assert all(r.returncode == 0 for r in results)
    assert read_state(scratch_dir)["processes"] == restarted["processes"]

    # `down` stops every process, frees every port and removes the run directory.
    pids = {name: proc["pid"] for name, proc in read_state(scratch_dir)["processes"].items()}
    ports = list(read_state(scratch_dir)["ports"].values())
    dev_cluster("down", dev_dir=scratch_dir)
    assert not (scratch_dir / "run").exists()
    for name, pid in pids.items():
        assert not pid_running(pid), f"{name} still running"
    assert not set(ports) & listening_ports()
    assert "nothing running" in dev_cluster("down", dev_dir=scratch_dir).stderr


def test_stale_run_directory_is_replaced(scratch_dir: Path) -> None:
    run = scratch_dir / "run"
    run.mkdir(parents=True)
    (run / "state.json").write_text(
        json.dumps(
            {
                "server": "https://127.0.0.1:1",
                "processes": {
                    "kube-apiserver": {"pid": 999999, "binary": "/nonexistent/kube-apiserver", "log": "x"}
                },
            }
        )
    )
    result = dev_cluster("up", "--nodes", "1", dev_dir=scratch_dir)
    assert "stale cluster" in result.stderr
    assert read_state(scratch_dir)["processes"]["kube-apiserver"]["pid"] != 999999


def test_failed_build_names_component_and_log_and_caches_nothing(tmp_path: Path) -> None:
    env = dict(os.environ, TJ_CACHE_DIR=str(tmp_path), ETCD_VERSION="v3.6.999999")
    result = subprocess.run(
        [str(REPO / "hack" / "kube-bins.sh"), "ensure"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode != 0
    assert "FAILED building etcd" in result.stderr
    log = tmp_path / "kube-bins" / "logs" / "etcd.log"
    assert str(log) in result.stderr
    assert log.exists()
    leftovers = [p.name for p in (tmp_path / "kube-bins").iterdir() if p.name not in ("logs", ".lock")]
    assert leftovers == [], f"half-built cache entries left: {leftovers}"
