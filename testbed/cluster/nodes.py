"""The dev cluster's fake GPU nodes: kwok-managed Node objects that look like real GPU nodes.

Why: the operator schedules onto GPU capacity and node labels (`nvidia.com/gpu`, the GPU product),
so the nodes carry what the NVIDIA device plugin and GPU feature discovery would report. Tests build
extra nodes from the same manifest (tests/e2e/jobs.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from testbed.cluster.processes import kubectl

KWOK_NODE_LABEL: Final = "kwok.x-k8s.io/managed"


@dataclass(frozen=True)
class NodeShape:
    count: int
    gpus: int
    cpu: str
    memory: str
    gpu_product: str


def node_manifest(name: str, shape: NodeShape) -> dict[str, Any]:
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": "110",
        "nvidia.com/gpu": str(shape.gpus),
        "ephemeral-storage": "1Ti",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                KWOK_NODE_LABEL: "true",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "node-type": "gpu",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": shape.gpu_product,
                "nvidia.com/gpu.count": str(shape.gpus),
                "nvidia.com/gpu.memory": "81920",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def create_nodes(bin_dir: Path, shape: NodeShape) -> None:
    nodes = [node_manifest(f"gpu-node-{index}", shape) for index in range(shape.count)]
    kubectl(
        bin_dir, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
    )


def ready_nodes(bin_dir: Path) -> int:
    """Nodes that are Ready and no longer carry the not-ready taint (pods can land on them)."""
    out = kubectl(bin_dir, "get", "nodes", "-o", "json", check=False)
    try:
        items = json.loads(out).get("items", [])
    except ValueError:
        return 0
    ready = 0
    for node in items:
        conditions = node.get("status", {}).get("conditions", [])
        taints = node.get("spec", {}).get("taints", [])
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and not any(
            t.get("key") == "node.kubernetes.io/not-ready" for t in taints
        ):
            ready += 1
    return ready
