"""PersistentVolumes for the local cluster: Rancher's local-path provisioner, with the real node's disk.

Why: without a provisioner every PersistentVolumeClaim stays Pending, and a TrainingJob's default
checkpoint storage is a claim (ReadWriteMany). The local-path provisioner is a real one (built from
its Go module by hack/kube-bins.sh): it watches claims of its StorageClass, makes a directory for
each with a helper pod, and creates a hostPath PersistentVolume for it; when the claim goes, a
helper pod removes the directory and the volume.

Its "shared filesystem" mode is the one that serves ReadWriteMany: the volumes live under one
directory (under the node's run directory) that every pod of the node sees, with no node affinity.
The helper pods run on the real node (busybox, built by testbed/images), since a kwok node would only
pretend to run them. The class is the cluster's default, so a claim without a class binds at once.
The provisioner runs as a process with the admin kubeconfig, like the other dev components.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

from testbed.cluster.processes import kubectl, spawn, wait_for
from testbed.cluster.state import KUBECONFIG, say
from testbed.node import nodeconfig
from testbed.node.nodeconfig import NODE_NAME, NodePaths

NAMESPACE: Final = "local-path-storage"
SERVICE_ACCOUNT: Final = "local-path-provisioner-service-account"
CONFIG_MAP: Final = "local-path-config"
STORAGE_CLASS: Final = "local-path"
PROVISIONER: Final = "rancher.io/local-path"


def configuration(node: NodePaths) -> dict[str, Any]:
    return {"sharedFileSystemPath": str(node.storage)}


def helper_pod(image: str) -> dict[str, Any]:
    """The helper pods' template: on the real node (the provisioner adds a toleration of every taint),
    the locally built busybox, never pulled."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "priorityClassName": "system-node-critical",
            "containers": [{"name": "helper-pod", "image": image, "imagePullPolicy": "Never"}],
        },
    }


def objects(node: NodePaths, image: str) -> list[dict[str, Any]]:
    """Its namespace, the ServiceAccount its helper pods run as, the ConfigMap with their scripts,
    and the default StorageClass."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
            "data": {
                "config.json": json.dumps(configuration(node)),
                "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n',
                "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n',
                "helperPod.yaml": json.dumps(helper_pod(image)),
            },
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        },
    ]


def provisioner_args(node: NodePaths) -> list[str]:
    return [
        "start",
        f"--config={node.run / 'local-path-config.json'}",
        f"--helper-pod-file={node.run / 'local-path-helper-pod.json'}",
        f"--kubeconfig={KUBECONFIG}",
        f"--namespace={NAMESPACE}",
        f"--service-account-name={SERVICE_ACCOUNT}",
        f"--configmap-name={CONFIG_MAP}",
        f"--provisioner-name={PROVISIONER}",
    ]


def start(state: dict[str, Any], build_dir: Path, node: NodePaths, image: str) -> None:
    bin_dir = Path(state["bin_dir"])
    node.storage.mkdir(parents=True, exist_ok=True)
    (node.run / "local-path-config.json").write_text(json.dumps(configuration(node)))
    (node.run / "local-path-helper-pod.json").write_text(json.dumps(helper_pod(image)))
    listing = {"apiVersion": "v1", "kind": "List", "items": objects(node, image)}
    kubectl(bin_dir, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(listing))
    processes: dict[str, Any] = state["processes"]
    spawn("local-path-provisioner", build_dir / "local-path-provisioner", provisioner_args(node), processes)
    log = Path(processes["local-path-provisioner"]["log"])
    wait_for(
        "the local-path provisioner", lambda: "Provisioner started" in _text(log) or _started(log), processes
    )
    say(f"storage: StorageClass {STORAGE_CLASS} (default, ReadWriteMany) on {nodeconfig.NODE_NAME}")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _started(log: Path) -> bool:
    """The provisioner's controller logs that it started its workers once it has synced its caches."""
    text = _text(log).split("=====")[-1]
    return "Started provisioner controller" in text
