"""Playing the kubelet for pods on kwok's fake nodes: ending a pod, losing and restoring a node.

Why: no kubelet runs kwok's nodes (kwok only moves pods to Running and removes deleted ones), so how a
training container ends is the test's decision. `end_pod` writes what a kubelet writes when a container
exits: the phase, the container's terminated state with exit code and reason (e.g. OOMKilled), and
optionally a DisruptionTarget condition (preemption, eviction, node drain); the patch is podstatus's,
which the chaos run and the soak send too. `lose_node` makes a node behave like one whose kubelet died.
Everything goes through the cluster's kubectl, the client users use. Standard library only.

Usage::

    from testbed import Cluster, end_pod, lose_node
    kubectl = Cluster.default().kubectl
    end_pod(kubectl, "ns", "job-worker-1", exit_code=137, reason="OOMKilled")
    lose_node(kubectl, "gpu-node-3")
"""

from __future__ import annotations

import json
from typing import Any

from testbed.cluster.kubectl import Kubectl
from testbed.cluster.nodes import KWOK_NODE_LABEL, NodeShape, node_manifest
from testbed.cluster.podstatus import disruption_condition, now_rfc3339, terminated_status_patch


def fake_node(name: str, *, gpus: int = 8, cpu: str = "64", memory: str = "512Gi") -> dict[str, Any]:
    """A fake GPU node that kwok manages (it turns Ready and "runs" pods bound to it), shaped like the
    cluster's own (`gpu-node-N`), for a test that needs a node of its own."""
    return node_manifest(name, NodeShape(1, gpus, cpu, memory, "A100-SXM4-80GB"))


def end_pod(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    *,
    exit_code: int = 0,
    reason: str | None = None,
    message: str | None = None,
    disruption: str | None = None,
    container: str | None = None,
) -> dict[str, Any]:
    """Ends a pod's containers the way a kubelet reports it, and returns the patched pod.

    exit_code 0 ends the pod Succeeded, anything else Failed. `reason` is the container's terminated
    reason (default Completed or Error; e.g. OOMKilled). `disruption` adds the DisruptionTarget
    condition with that reason (PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager,
    TerminationByKubelet). `container` ends only that container's state (the others keep theirs); by
    default every container ends with the same code. The patch is podstatus's.
    """
    pod = kubectl.get_json("pod", name, "-n", namespace)
    patch = terminated_status_patch(
        pod,
        exit_code=exit_code,
        reason=reason,
        message=message,
        disruption=disruption,
        container=container,
    )
    return patch_pod_status(kubectl, namespace, name, patch)


def add_disruption_condition(kubectl: Kubectl, namespace: str, name: str, reason: str) -> None:
    """Adds DisruptionTarget=True without ending the pod (what the scheduler or eviction API does first)."""
    patch_pod_status(kubectl, namespace, name, {"status": {"conditions": [disruption_condition(reason)]}})


def patch_pod_status(kubectl: Kubectl, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    """Strategic-merge patches the pod's status subresource (as a kubelet would); returns the pod."""
    out = kubectl.run(
        "patch",
        "pod",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=strategic",
        "-p",
        json.dumps(patch),
        "-o",
        "json",
    )
    patched = json.loads(out)
    assert isinstance(patched, dict)
    return patched


def lose_node(kubectl: Kubectl, node: str) -> None:
    """Makes `node` behave like one whose kubelet died: kwok stops managing it (no lease renewals, pods
    deleted on it stay Terminating), and its Ready condition turns Unknown as the node lifecycle
    controller would report after the grace period."""
    kubectl.run("label", "node", node, f"{KWOK_NODE_LABEL}=false", "--overwrite")
    now = now_rfc3339()
    patch = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ]
        }
    }
    kubectl.run("patch", "node", node, "--subresource=status", "--type=strategic", "-p", json.dumps(patch))


def restore_node(kubectl: Kubectl, node: str) -> None:
    """Gives a lost node back to kwok, which marks it Ready again."""
    kubectl.run("label", "node", node, f"{KWOK_NODE_LABEL}=true", "--overwrite")
    kubectl.run(
        "taint", "node", node, "node.kubernetes.io/unreachable-", "node.kubernetes.io/not-ready-", check=False
    )
