"""Putting pods and TrainingJobs on the local cluster's real node, and reading what its kubelet did.

Why apart: every test of the real node (the node itself in testbed/tests/test_real_node.py, training in
containers, the operator deployed from its image) needs the same few things: a pod or a job that
tolerates the node's taint and asks for it, resources that fit a 2-core machine, the container
states the kubelet reports, the processes its containers run on this machine and the files a claim
of the local-path provisioner holds. The node's settings are testbed/node/nodeconfig.py's.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from testbed.node import nodeconfig
from tests.cluster import Kubectl
from tests.e2e.jobs import job_manifest, wait

JsonDict = dict[str, Any]

NODE = nodeconfig.NODE_NAME
# The base image (a Debian root filesystem with python3, built by testbed/images) and the trainer image
# (the same with torch), under the names the node imported them with.
PYTHON_IMAGE = "python:3.11-slim"
TOLERATION: JsonDict = {"key": nodeconfig.REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
SELECTOR: JsonDict = {nodeconfig.REAL_NODE_LABEL: "true"}
# The reference trainer with real torch, paced for 2 busy cores: 5 steps of a small model on
# synthetic data per epoch, each step held to at least TRAIN_STEP_SECONDS (long enough to look at a
# running trainer), every report sent at once.
PACE = {"TRAIN_STEPS_PER_EPOCH": "5", "TRAIN_STEP_SECONDS": "0.2", "TRAIN_PROGRESS_INTERVAL": "0"}


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


def on_node(*, memory: str = "1Gi", cpu: str = "100m") -> JsonDict:
    """The spec fields that place a TrainingJob on the real node (its scheduling and its workers'
    resources), for `job_on_node` and for the client's `submit(spec=...)`."""
    return {
        "scheduling": {"nodeSelector": dict(SELECTOR), "tolerations": [TOLERATION]},
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
    }


def job_on_node(manifest: JsonDict, *, memory: str = "1Gi", cpu: str = "100m") -> JsonDict:
    """A TrainingJob placed on the real node: it tolerates the taint and selects the node, and its
    workers ask for what the machine has (the examples ask for 8 CPUs and 32 GiB per worker). The
    backend stays as the job says: the reference trainer falls back from NCCL to Gloo without a GPU."""
    job = copy.deepcopy(manifest)
    spec = job["spec"]
    scheduling = spec.setdefault("scheduling", {})
    scheduling["nodeSelector"] = {**scheduling.get("nodeSelector", {}), **SELECTOR}
    scheduling["tolerations"] = [*scheduling.get("tolerations", []), TOLERATION]
    spec["resources"] = on_node(memory=memory, cpu=cpu)["resources"]
    return job


def training_job(name: str, epochs: int, *, env: dict[str, str] | None = None, **spec: Any) -> JsonDict:
    """Two workers of the reference trainer (real torch in the trainer image) on the real node, paced
    by PACE (and `env` on top)."""
    paced = {**PACE, **(env or {})}
    manifest = job_manifest(
        name,
        hyperparameters={"epochs": epochs, "batchSize": 16, "learningRate": 0.05},
        env=[{"name": key, "value": value} for key, value in paced.items()],
        **spec,
    )
    return job_on_node(manifest)


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


def is_ready(pod: JsonDict) -> bool:
    """The pod's Ready condition is True (its containers run, and pass their readiness probes)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def wait_running(kubectl: Kubectl, namespace: str, name: str, timeout: float = 120) -> JsonDict:
    def probe() -> JsonDict | None:
        pod = kubectl.get_or_none("pod", name, "-n", namespace)
        return pod if pod and is_ready(pod) else None

    return wait(f"pod {name} Running and Ready", probe, timeout=timeout)


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
