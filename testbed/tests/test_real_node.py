"""The local cluster's real node (testbed/node/realnode.py): pods in containers, as on a real cluster.

Each test runs real pods on the node: the network (pod to pod, DNS names of Services, a ClusterIP
through kube-proxy, the API server in-cluster), the kubelet's API (logs, exec, port-forward), exit
codes and a cgroup's OOM kill, a PersistentVolumeClaim of the local-path provisioner, the taint that
keeps other pods away; and `remove`/`up` leaving nothing of the node on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from testbed import PYTHON_IMAGE, Kubectl, pid_running, pod_on_node, wait_for
from testbed.cluster.state import NODE_COMPONENTS, REAL_NODE, read_state, write_state
from testbed.common import DEV, ToolError
from testbed.node import nodeconfig, nodehost, nodeimages, nodelock, realnode
from tests.cluster import dev_cluster
from tests.e2e.jobs import wait
from tests.e2e.realnode import NODE, wait_running, wait_terminated

NETWORK_PROBE = """
import json, os, socket, ssl, time, urllib.request

def patiently(call):
    # A new Service's EndpointSlice reaches CoreDNS and kube-proxy a moment after its pod is Ready
    # (until then kube-proxy rejects connections to the ClusterIP): retry, as a client would.
    deadline = time.monotonic() + 60
    while True:
        try:
            return call()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)

found = {}
found["peer_address"] = patiently(lambda: socket.gethostbyname("server.peers"))
found["peer"] = patiently(lambda: urllib.request.urlopen("http://server.peers:8000/", timeout=10).status)
found["cluster_ip"] = patiently(lambda: urllib.request.urlopen("http://web:8000/", timeout=10).status)
token = open("/var/run/secrets/kubernetes.io/serviceaccount/token").read()
context = ssl.create_default_context(cafile="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
headers = {"Authorization": "Bearer " + token}
request = urllib.request.Request("https://kubernetes.default.svc/version", headers=headers)
found["api"] = json.load(urllib.request.urlopen(request, context=context, timeout=10))["gitVersion"]
found["api_env"] = os.environ["KUBERNETES_SERVICE_HOST"]
try:
    socket.gethostbyname("example.com")
    found["outside"] = "resolved"
except OSError as error:
    found["outside"] = "refused"
print(json.dumps(found))
"""


def test_the_node_is_ready_tainted_and_advertises_gpus(real_node: Kubectl) -> None:
    node = real_node.get_json("node", NODE)
    status = node["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    assert {"key": nodeconfig.REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"} in node["spec"][
        "taints"
    ]
    assert node["metadata"]["labels"][nodeconfig.REAL_NODE_LABEL] == "true"
    assert status["capacity"]["nvidia.com/gpu"] == "8"
    assert {"type": "InternalIP", "address": nodeconfig.NODE_IP} in status["addresses"]
    info = status["nodeInfo"]
    assert info["kubeletVersion"] == "v1.34.4"
    assert info["containerRuntimeVersion"].startswith("containerd://2.")
    held = {name for image in status.get("images") or [] for name in image.get("names") or []}
    for reference in ("trainingjob-operator:0.1.0", PYTHON_IMAGE):
        assert any(name.endswith("/" + reference) for name in held), (reference, sorted(held))
    # Every image built here is pinned: the kubelet's garbage collection (under disk pressure too)
    # would remove what cannot be pulled again.
    listed = realnode.ctr(realnode.build(), "images", "list").splitlines()[1:]
    ours = [line.split() for line in listed if nodeimages.IMAGE_KEY_LABEL in line]
    assert len(ours) >= len(nodeimages.FIRST_IMAGES), listed  # the session's node starts with these
    assert all(nodeimages.PINNED_LABEL in fields[-1].split(",") for fields in ours), listed


def test_a_pod_without_the_toleration_is_kept_off_the_node(real_node: Kubectl, namespace: str) -> None:
    pod = pod_on_node("untolerated", ["true"], tolerations=[])
    real_node.apply(pod, "-n", namespace)

    def refused() -> str | None:
        events = real_node.items(
            "events", "-n", namespace, "--field-selector", "involvedObject.name=untolerated"
        )
        messages = [e["message"] for e in events if e.get("reason") == "FailedScheduling"]
        return messages[0] if messages else None

    message = wait("the scheduler's refusal", refused, timeout=60)
    # The only node the pod selects is the real node, and its taint is what keeps the pod off it.
    assert "1 node(s) had untolerated taint(s)" in message, message
    assert real_node.get_json("pod", "untolerated", "-n", namespace)["status"]["phase"] == "Pending"


def test_pods_reach_each_other_services_and_the_api_server_by_name(
    real_node: Kubectl, namespace: str
) -> None:
    services = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "peers"},
            "spec": {"clusterIP": "None", "selector": {"app": "server"}, "ports": [{"port": 8000}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "server"}, "ports": [{"port": 8000}]},
        },
    ]
    for service in services:
        real_node.apply(service, "-n", namespace)
    # Ready once it listens: the Services publish it, and the client's first request finds it.
    listening = {"readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}}
    server = pod_on_node(
        "server",
        ["python3", "-m", "http.server", "8000"],
        container=listening,
        hostname="server",
        subdomain="peers",
    )
    server["metadata"]["labels"] = {"app": "server"}
    real_node.apply(server, "-n", namespace)
    running = wait_running(real_node, namespace, "server")
    address = running["status"]["podIP"]
    assert address.startswith(nodeconfig.POD_CIDR.rsplit(".", 2)[0] + ".")

    real_node.apply(pod_on_node("client", ["python3", "-c", NETWORK_PROBE]), "-n", namespace)
    ended = wait_terminated(real_node, namespace, "client")
    log = real_node.run("logs", "client", "-n", namespace)
    assert ended["exitCode"] == 0, log
    found = json.loads(log.strip().splitlines()[-1])
    assert found == {
        "peer_address": address,
        "peer": 200,
        "cluster_ip": 200,
        "api": "v1.34.4",
        "api_env": nodeconfig.API_SERVICE_IP,
        "outside": "refused",
    }


def test_logs_exec_and_port_forward_go_through_the_kubelet(real_node: Kubectl, namespace: str) -> None:
    counting = (
        "import time\nfor i in range(100000):\n    print('line', i, flush=True)\n    time.sleep(0.05)\n"
    )
    real_node.apply(pod_on_node("talker", ["python3", "-c", counting]), "-n", namespace)
    wait_running(real_node, namespace, "talker")
    wait_for("a few lines", lambda: "line 3" in real_node.run("logs", "talker", "-n", namespace), timeout=30)
    tail = real_node.run("logs", "talker", "-n", namespace, "--tail=1").strip().splitlines()
    assert len(tail) == 1
    assert tail[0].startswith("line ")
    follow = subprocess.Popen(
        [*real_node.command(), "logs", "-f", "talker", "-n", namespace],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        first = int(follow.stdout.readline().split()[1])
        later = [int(follow.stdout.readline().split()[1]) for _ in range(5)]
        assert later == list(range(first + 1, first + 6))
    finally:
        follow.kill()
        follow.wait()
    assert (
        real_node.run("exec", "talker", "-n", namespace, "--", "python3", "-c", "print(6 * 7)").strip()
        == "42"
    )

    server = pod_on_node(
        "page",
        ["python3", "-m", "http.server", "8000", "--directory", "/etc"],
        container={"readinessProbe": {"tcpSocket": {"port": 8000}, "periodSeconds": 1}},
    )
    real_node.apply(server, "-n", namespace)
    wait_running(real_node, namespace, "page")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local = probe.getsockname()[1]
    forward = subprocess.Popen(
        [
            *real_node.command(),
            "port-forward",
            "pod/page",
            f"{local}:8000",
            "-n",
            namespace,
            "--address=127.0.0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        page = wait(
            "the forwarded port",
            lambda: _get(f"http://127.0.0.1:{local}/os-release"),
            timeout=30,
        )
        assert "Debian" in page
    finally:
        forward.kill()
        forward.wait()


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return str(response.read().decode())
    except OSError:
        return None


def test_exit_codes_and_an_oom_kill_are_reported_as_a_kubelet_does(
    real_node: Kubectl, namespace: str
) -> None:
    real_node.apply(pod_on_node("fails", ["python3", "-c", "import sys; sys.exit(1)"]), "-n", namespace)
    hog = "x = bytearray(400 * 1024 * 1024)\nfor i in range(0, len(x), 4096):\n    x[i] = 1\n"
    oom = pod_on_node(
        "hog",
        ["python3", "-c", hog],
        container={"resources": {"requests": {"memory": "64Mi"}, "limits": {"memory": "64Mi"}}},
    )
    real_node.apply(oom, "-n", namespace)
    failed = wait_terminated(real_node, namespace, "fails")
    assert (failed["exitCode"], failed["reason"]) == (1, "Error")
    killed = wait_terminated(real_node, namespace, "hog")
    assert (killed["exitCode"], killed["reason"]) == (137, "OOMKilled")

    def both_failed() -> bool:
        phases = [
            real_node.get_json("pod", name, "-n", namespace)["status"]["phase"] for name in ("fails", "hog")
        ]
        return phases == ["Failed", "Failed"]

    wait_for("both pods Failed", both_failed, timeout=30)


def test_a_claim_binds_and_what_one_pod_writes_the_next_one_reads(real_node: Kubectl, namespace: str) -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "shared"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Mi"}}},
    }
    real_node.apply(claim, "-n", namespace)
    volume = {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "shared"}}]}
    mount = {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    writer = pod_on_node(
        "writer", ["sh", "-c", "echo hello from the writer > /data/note"], container=mount, **volume
    )
    real_node.apply(writer, "-n", namespace)
    assert wait_terminated(real_node, namespace, "writer")["exitCode"] == 0
    reader = pod_on_node("reader", ["cat", "/data/note"], container=mount, **volume)
    real_node.apply(reader, "-n", namespace)
    assert wait_terminated(real_node, namespace, "reader")["exitCode"] == 0
    assert real_node.run("logs", "reader", "-n", namespace).strip() == "hello from the writer"
    bound = real_node.get_json("pvc", "shared", "-n", namespace)
    assert bound["status"]["phase"] == "Bound"
    assert bound["spec"]["storageClassName"] == "local-path"
    volume_name = bound["spec"]["volumeName"]
    real_node.run("delete", "pod", "writer", "reader", "-n", namespace)
    real_node.run("delete", "pvc", "shared", "-n", namespace)
    wait_for(
        f"volume {volume_name} deleted by the provisioner",
        lambda: real_node.get_or_none("pv", volume_name) is None,
        timeout=90,
    )


def test_remove_and_up_again_leave_nothing_on_the_machine(
    real_node: Kubectl, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node taken off and put back twice: the machine's network, mounts, cgroups, sysctls,
    iptables and fixed paths before it came are what they are after it went, with pods having run.
    Put back as outside a test session (a lock file the session does not hold), the node holds the
    machine's real-node lock from `up` until `remove` has undone it (testbed/node/nodelock.py)."""
    dev_cluster("remove", "real-node")
    before = nodehost.snapshot()
    lock = tmp_path / "real-node.lock"
    try:
        with monkeypatch.context() as outside_the_session:
            outside_the_session.setenv("TJ_REAL_NODE_LOCK", str(lock))
            dev_cluster("up", "--with", "real-node")
            assert f": the real node of the cluster in {DEV}, " in str(nodelock.current_holder(lock))
            real_node.apply(pod_on_node("visitor", ["python3", "-c", "print('was here')"]), "-n", namespace)
            assert wait_terminated(real_node, namespace, "visitor")["exitCode"] == 0
            sleeper = pod_on_node("sleeper", ["sleep", "3600"])
            real_node.apply(sleeper, "-n", namespace)
            wait_running(real_node, namespace, "sleeper")
            began = time.monotonic()
            dev_cluster("remove", "real-node")
            took = time.monotonic() - began
        assert nodelock.current_holder(lock) is None
        after = nodehost.snapshot()
        assert after == before, _difference(before, after)
        assert real_node.get_or_none("node", NODE) is None
        assert not Path("/run/netns", nodeconfig.NETNS).exists()
        print(f"remove took {took:.1f}s")
    finally:
        dev_cluster("up", "--with", "real-node")


def test_a_node_killed_before_its_down_is_undone_by_the_next_up(
    real_node: Kubectl, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed with its node up (its processes gone, and with them the checkout's record, as when
    a CI job is cancelled or another checkout ran the node) leaves a network namespace, mounts,
    cgroups and sysctls: the next `up` undoes them from the machine's record and starts the node;
    while a node runs, a second one is refused in one line. The lock holder of the killed node (it ran
    as outside a test session) is stopped by that `up` too, which starts the new node's own."""
    dev_cluster("remove", "real-node")
    before = nodehost.snapshot()
    lock = tmp_path / "real-node.lock"  # as outside a test session: the node's own holder takes it
    try:
        with monkeypatch.context() as outside_the_session:
            outside_the_session.setenv("TJ_REAL_NODE_LOCK", str(lock))
            dev_cluster("up", "--with", "real-node")
            with pytest.raises(ToolError, match="a real node runs on this machine already"):
                realnode.reclaim_left_behind()
            real_node.apply(pod_on_node("sleeper", ["sleep", "3600"]), "-n", namespace)
            wait_running(real_node, namespace, "sleeper")
            killed_holder = nodelock.holder_pid(str(nodelock.current_holder(lock)))
            _kill_the_node_and_lose_its_record()
            assert Path("/run/netns", nodeconfig.NETNS).exists()
            assert nodehost.mounts_under(realnode.mount_prefixes(realnode.paths())), (
                "it left no mounts to undo"
            )

            # The killed node's holder still has the lock: the next `up` stops it with the rest.
            dev_cluster("up", "--with", "real-node")
            node = real_node.get_json("node", NODE)
            assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
            holder = nodelock.holder_pid(str(nodelock.current_holder(lock)))
            assert killed_holder is not None
            assert holder not in (None, killed_holder)
            assert not pid_running(killed_holder)
            real_node.apply(pod_on_node("after", ["python3", "-c", "print('ran')"]), "-n", namespace)
            assert wait_terminated(real_node, namespace, "after")["exitCode"] == 0
            real_node.run("delete", "pod", "sleeper", "-n", namespace, "--wait=false")
            dev_cluster("remove", "real-node")
        assert nodelock.current_holder(lock) is None
        after = nodehost.snapshot()
        assert after == before, _difference(before, after)
    finally:
        dev_cluster("up", "--with", "real-node")


def _kill_the_node_and_lose_its_record() -> None:
    state = read_state()
    assert state is not None
    for name in NODE_COMPONENTS:
        record = state["processes"].pop(name, None)
        if record is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(record["pid"]), signal.SIGKILL)
    nodehost.kill_cgroups([nodeconfig.CGROUP_ROOT, nodeconfig.RUNTIME_CGROUP])
    write_state("processes", state["processes"])
    write_state("optional", [name for name in state.get("optional", []) if name != REAL_NODE])
    write_state("real_node", None)


def _difference(before: dict[str, object], after: dict[str, object]) -> str:
    return json.dumps(
        {key: {"before": before[key], "after": after[key]} for key in before if before[key] != after[key]}
    )


def test_a_restarted_kubelet_keeps_its_running_pods_and_the_fake_gpus(
    real_node: Kubectl, namespace: str
) -> None:
    real_node.apply(pod_on_node("steady", ["sleep", "3600"]), "-n", namespace)
    before = wait_running(real_node, namespace, "steady")
    dev_cluster("restart", "kubelet")
    node = real_node.get_json("node", NODE)
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"] == "True"
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    after = wait_running(real_node, namespace, "steady")
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    assert (
        after["status"]["containerStatuses"][0]["containerID"]
        == before["status"]["containerStatuses"][0]["containerID"]
    )
