"""What tests know of the real node, and the pods they put on it.

Why apart: every test of the real node (the node itself in testbed/tests/test_real_node.py, training in
containers, the operator deployed from its image, NetworkPolicies) needs the same few things: the node's
name, label, taint and addresses, a pod that tolerates the taint and asks for the node, the container
states the kubelet reports, the processes its containers run on this machine and the files a claim of
the local-path provisioner holds. The node's settings are nodeconfig's; NetworkPolicies are
netpolicies'; the registry the node pulls from is registry's. Standard library only.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from testbed.cluster.kubectl import Kubectl
from testbed.images import push as pusher
from testbed.images.cache import Image
from testbed.node import netpolicies, nodeconfig, nodehost, registry
from testbed.node.apiforward import listen_in

JsonDict = dict[str, Any]

# The base image (a Debian root filesystem with python3, built by testbed/images) under the name the
# node imported it with.
PYTHON_IMAGE: Final = "python:3.11-slim"


@dataclass(frozen=True)
class RealNode:
    """The real node as tests see it: its name, the label and taint that keep other pods off it, its
    address in its network namespace, and where its pods reach the API server."""

    name: str = nodeconfig.NODE_NAME
    label: str = nodeconfig.REAL_NODE_LABEL
    taint: dict[str, str] = field(default_factory=lambda: dict(nodeconfig.TAINT))
    ip: str = nodeconfig.NODE_IP
    # The `kubernetes` Service's address and port, as a pod on the node sees them.
    api_service_ip: str = nodeconfig.API_SERVICE_IP
    api_port: int = nodeconfig.API_PORT

    @property
    def toleration(self) -> JsonDict:
        return {"key": self.label, "operator": "Exists", "effect": "NoSchedule"}

    @property
    def selector(self) -> dict[str, str]:
        return {self.label: "true"}

    @property
    def netns(self) -> Path:
        """The node's network namespace (for `nsenter --net=`)."""
        return nodeconfig.netns_path()

    def listen(self, port: int = 0) -> socket.socket:
        """A listening socket at the node's address, inside its network namespace: a server pods on
        the node reach as a host on their network (the API server's relay is one)."""
        return listen_in(str(self.netns), self.ip, port)

    @staticmethod
    def missing_prerequisites() -> list[str]:
        """Why the node cannot run on this machine (empty when it can): root, cgroup v1, tools."""
        return nodehost.missing_prerequisites()

    @staticmethod
    def machine_snapshot() -> dict[str, Any]:
        """What the node changes on the machine (links, routes, mounts, cgroups, iptables, tunables,
        listeners), to compare before it starts with after it is gone."""
        return nodehost.snapshot()


@dataclass(frozen=True)
class NetworkPolicies:
    """The NetworkPolicy enforcer on the real node (`up --with network-policies`) as tests see it."""

    name: str = netpolicies.NAME
    # The API server's relay, one hop off the node, so that policies judge a pod's traffic to it.
    api_ip: str = netpolicies.API_IP

    @staticmethod
    def missing_prerequisites() -> list[str]:
        return netpolicies.missing_prerequisites()

    @staticmethod
    def metrics() -> str:
        """The enforcer's Prometheus metrics text (its verdicts among them)."""
        return netpolicies.metrics()

    @staticmethod
    def queue_bound() -> bool:
        """The enforcer reads its packet queue and its nftables table is in place."""
        return netpolicies.queue_bound()


@dataclass(frozen=True)
class LocalRegistry:
    """The local cluster's image registry (`up --with registry`) as tests see it: its host (where the
    machine pushes and the node pulls), its credentials and CA, its HTTP API and pushes to it."""

    name: str = registry.NAME
    host: str = registry.HOST

    @staticmethod
    def missing_prerequisites() -> list[str]:
        return registry.missing_prerequisites()

    @staticmethod
    def credentials() -> tuple[str, str]:
        """The running registry's user and password."""
        return registry.credentials()

    @property
    def auth_file(self) -> Path:
        """Its credentials as a docker config file (`hack/dev-cluster.sh env`'s REGISTRY_AUTH_FILE): what
        a `kubernetes.io/dockerconfigjson` Secret holds."""
        return registry.files().auth_file

    @property
    def ca_file(self) -> Path:
        """The CA its certificate is signed by (the cluster's)."""
        return registry.ca_file()

    def reference(self, path_and_tag: str) -> str:
        """`path:tag` under this registry's host."""
        return f"{self.host}/{path_and_tag}"

    def client(self, login: tuple[str, str] | None = None) -> pusher.Registry:
        """Its HTTP API, with its own credentials unless `login` says otherwise."""
        return pusher.Registry(self.host, login or self.credentials(), registry.tls_context())

    def manifest(self, reference: str) -> tuple[str, JsonDict]:
        """The digest and content of the manifest a reference of this registry names."""
        target = pusher.parse_target(reference)
        answer = self.client().request(
            "GET", f"/v2/{target.path}/manifests/{target.tag}", headers={"Accept": pusher.OCI_MANIFEST}
        )
        if answer.status != 200:
            raise AssertionError(f"the registry has no manifest {reference}: {answer.status}")
        return answer.headers["docker-content-digest"], json.loads(answer.body)

    def push(self, image: Image, path_and_tag: str) -> str:
        """Pushes a built image as `path:tag` here (as `make docker-push` does); its manifest's digest."""
        target = pusher.parse_target(self.reference(path_and_tag))
        return pusher.push(image, target, self.client())


REAL_NODE: Final = RealNode()
NETWORK_POLICIES: Final = NetworkPolicies()
REGISTRY: Final = LocalRegistry()


def pod_on_node(name: str, command: list[str], **spec: Any) -> JsonDict:
    """A pod of one container `main` running `command` in the base image on the real node."""
    container: JsonDict = {
        "name": "main",
        "image": PYTHON_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
    }
    container.update(spec.pop("container", {}))
    body: JsonDict = {
        "nodeSelector": REAL_NODE.selector,
        "tolerations": [REAL_NODE.toleration],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
    }
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body}


def terminated(pod: JsonDict, container: str = "main") -> JsonDict | None:
    """The container's `state.terminated` as the kubelet reported it, or None while it runs."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            found = (status.get("state") or {}).get("terminated")
            return found if isinstance(found, dict) else None
    return None


def is_ready(pod: JsonDict) -> bool:
    """The pod's Ready condition is True (its containers run, and pass their readiness probes)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def container_states(pod: JsonDict, key: str = "containerStatuses") -> dict[str, JsonDict]:
    """Each container's state by name, as the kubelet reported it (`initContainerStatuses` for the
    init containers and native sidecars)."""
    return {s["name"]: s["state"] for s in (pod.get("status") or {}).get(key) or []}


def pod_processes(uids: Iterable[str]) -> dict[int, str]:
    """The processes on this machine that belong to any of these pods, by pid: the node's kubelet puts
    each pod's sandbox and containers in cgroups under `pod<uid>` (its cgroupfs driver), which every
    process's /proc/<pid>/cgroup names. Empty once the node runs nothing of them."""
    wanted = {f"pod{uid}": uid for uid in uids}
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            lines = (entry / "cgroup").read_text().splitlines()
        except OSError:  # the process ended meanwhile
            continue
        for line in lines:
            owners = [wanted[part] for part in line.rsplit(":", 1)[-1].split("/") if part in wanted]
            if owners:
                found[int(entry.name)] = owners[0]
                break
    return found


def claim_directory(kubectl: Kubectl, namespace: str, claim: str) -> Path:
    """Where a bound claim of the local-path provisioner keeps its files on this machine: its
    PersistentVolume's hostPath (the node's root filesystem is the machine's)."""
    bound = kubectl.get_json("pvc", claim, "-n", namespace)
    volume = kubectl.get_json("pv", bound["spec"]["volumeName"])
    return Path(volume["spec"]["hostPath"]["path"])
