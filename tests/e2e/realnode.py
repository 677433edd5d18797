"""Putting pods and TrainingJobs on the local cluster's real node, and reading what its kubelet did.

Why apart: every test of the real node (the node itself in tests/hack/test_real_node.py, training in
containers, the operator deployed from its image) needs the same few things: a pod or a job that
tolerates the node's taint and asks for it, resources that fit a 2-core machine, and the container
states the kubelet reports. The node's settings are hack/devcluster/nodeconfig.py's.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hack.devcluster import nodeconfig
from tests.cluster import Kubectl
from tests.e2e.jobs import wait

JsonDict = dict[str, Any]

NODE = nodeconfig.NODE_NAME
# The base image (a Debian root filesystem with python3, built by hack/images) and the trainer image
# (the same with torch), under the names the node imported them with.
PYTHON_IMAGE = "python:3.11-slim"
TOLERATION: JsonDict = {"key": nodeconfig.REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
SELECTOR: JsonDict = {nodeconfig.REAL_NODE_LABEL: "true"}


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
        "nodeSelector": SELECTOR,
        "tolerations": [TOLERATION],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [container],
    }
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body}


def job_on_node(manifest: JsonDict, *, memory: str = "1Gi", cpu: str = "100m") -> JsonDict:
    """A TrainingJob placed on the real node: it tolerates the taint and selects the node, and its
    workers ask for what the machine has (the examples ask for 8 CPUs and 32 GiB per worker). The
    backend stays as the job says: the reference trainer falls back from NCCL to Gloo without a GPU."""
    job = copy.deepcopy(manifest)
    spec = job["spec"]
    scheduling = spec.setdefault("scheduling", {})
    scheduling["nodeSelector"] = {**scheduling.get("nodeSelector", {}), **SELECTOR}
    scheduling["tolerations"] = [*scheduling.get("tolerations", []), TOLERATION]
    spec["resources"] = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}
    return job


def terminated(pod: JsonDict, container: str = "main") -> JsonDict | None:
    """The container's `state.terminated` as the kubelet reported it, or None while it runs."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            found = (status.get("state") or {}).get("terminated")
            return found if isinstance(found, dict) else None
    return None


def wait_terminated(
    kubectl: Kubectl, namespace: str, name: str, container: str = "main", timeout: float = 120
) -> JsonDict:
    def probe() -> JsonDict | None:
        pod = kubectl.get_or_none("pod", name, "-n", namespace)
        return terminated(pod, container) if pod else None

    try:
        return wait(f"pod {name}'s {container} to end", probe, timeout=timeout)
    except AssertionError as error:
        pod = kubectl.get_or_none("pod", name, "-n", namespace)
        raise AssertionError(f"{error}\nstatus: {json.dumps((pod or {}).get('status'), indent=1)}") from None


def wait_running(kubectl: Kubectl, namespace: str, name: str, timeout: float = 120) -> JsonDict:
    def probe() -> JsonDict | None:
        pod = kubectl.get_or_none("pod", name, "-n", namespace)
        ready = [
            c for c in ((pod or {}).get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"
        ]
        return pod if ready and ready[0].get("status") == "True" else None

    return wait(f"pod {name} Running and Ready", probe, timeout=timeout)
