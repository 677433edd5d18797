"""Helpers for the Kueue end-to-end tests: a test's own queues, queued TrainingJobs, their Workloads.

Why: the Kueue tests run on the session's cluster next to every other test, so each brings its own
capacity and its own queues: `gpu_queue` makes a ResourceFlavor whose node labels and tolerations
are those of the test's private node pool (tests.e2e.lifecycle_support.node_pool), a ClusterQueue
with a GPU quota for the test's namespace only and a LocalQueue there, and deletes the cluster-scoped
ones afterwards. The jobs set no node selector or toleration of their own: only the admitted flavor's
placement puts their pods on the pool, which is what the tests check.
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from crd import contract
from testbed import Kubectl, end_pod, wait_for
from tests.e2e.jobs import extra_nodes, job_manifest, pods_of
from tests.e2e.lifecycle_support import POOL_KEY, retried, wait_state, wait_status

JsonDict = dict[str, Any]
GPU = contract.GPU_RESOURCE
KUEUE = contract.KUEUE_API_VERSION
LOCAL_QUEUE = "team"
# The levels of the topology-aware tests' racks (tests/e2e/test_kueue_topology_e2e.py).
BLOCK_LABEL = "topology.example.com/block"
RACK_LABEL = "topology.example.com/rack"
HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Queues:
    flavor: str
    cluster_queue: str
    local_queue: str = LOCAL_QUEUE


def is_true(obj: JsonDict | None, type_: str) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == type_ and c["status"] == "True" for c in conditions)


def pool_toleration(namespace: str) -> JsonDict:
    return {"key": POOL_KEY, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}


@contextlib.contextmanager
def gpu_queue(
    kubectl: Kubectl,
    namespace: str,
    gpus: int,
    *,
    node_labels: dict[str, str] | None = None,
    tolerations: list[JsonDict] | None = None,
    quota: dict[str, str] | None = None,
    topology: str | None = None,
) -> Iterator[Queues]:
    """A flavor for the namespace's node pool (or the nodes of `node_labels`, whose taints
    `tolerations` tolerate; with the Topology named `topology`), a ClusterQueue with `gpus` GPUs of
    it (and `quota` of other resources the jobs request, e.g. cpu and memory; preemption by priority
    within the queue) for that namespace, and LocalQueue `team` there."""
    quotas = {GPU: gpus, **(quota or {})}
    name = f"tj-e2e-{namespace[-6:]}-{uuid.uuid4().hex[:4]}"
    flavor = {
        "apiVersion": KUEUE,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {
            "nodeLabels": node_labels or {POOL_KEY: namespace},
            "tolerations": tolerations if tolerations is not None else [pool_toleration(namespace)],
            **({"topologyName": topology} if topology else {}),
        },
    }
    cluster_queue = {
        "apiVersion": KUEUE,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {
                    "coveredResources": list(quotas),
                    "flavors": [
                        {
                            "name": name,
                            "resources": [
                                {"name": key, "nominalQuota": value} for key, value in quotas.items()
                            ],
                        }
                    ],
                }
            ],
        },
    }
    local_queue = {
        "apiVersion": KUEUE,
        "kind": "LocalQueue",
        "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
        "spec": {"clusterQueue": name},
    }
    try:
        for manifest in (flavor, cluster_queue, local_queue):
            kubectl.run("create", "-f", "-", stdin=json.dumps(manifest))
        wait_for(
            f"ClusterQueue {name} active", lambda: is_true(kubectl.get_json("clusterqueue", name), "Active")
        )
        yield Queues(name, name)
    finally:
        for kind in ("clusterqueue", "resourceflavor"):
            retried(
                f"{kind} {name} deleted",
                functools.partial(kubectl.run, "delete", kind, name, "--ignore-not-found", "--wait=false"),
            )


@contextlib.contextmanager
def workload_priority_classes(kubectl: Kubectl, **values: int) -> Iterator[dict[str, str]]:
    """WorkloadPriorityClasses with unique names: yields {given name: the class's name}."""
    suffix = uuid.uuid4().hex[:6]
    names = {given: f"tj-e2e-{given}-{suffix}" for given in values}
    try:
        for given, value in values.items():
            manifest = {
                "apiVersion": KUEUE,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": names[given]},
                "value": value,
            }
            kubectl.run("create", "-f", "-", stdin=json.dumps(manifest))
        yield names
    finally:
        for name in names.values():
            retried(
                f"WorkloadPriorityClass {name} deleted",
                functools.partial(
                    kubectl.run, "delete", "workloadpriorityclass", name, "--ignore-not-found", "--wait=false"
                ),
            )


def queued_job(name: str, queue: str = LOCAL_QUEUE, *, priority: str | None = None, **spec: Any) -> JsonDict:
    """An 8-GPU TrainingJob (one worker unless `spec` says otherwise) in LocalQueue `queue`."""
    manifest = job_manifest(name, **{"numWorkers": 1, "gpusPerWorker": 8, **spec})
    labels = {contract.QUEUE_NAME_LABEL: queue}
    if priority:
        labels[contract.WORKLOAD_PRIORITY_CLASS_LABEL] = priority
    manifest["metadata"]["labels"] = labels
    return manifest


@contextlib.contextmanager
def racks(kubectl: Kubectl, namespace: str, count: int, nodes: int) -> Iterator[dict[str, str]]:
    """`count` racks of `nodes` 8-GPU kwok nodes of the namespace's pool, in one block, and a Topology
    of their block, rack and hostname levels: yields {node: rack}; the Topology's name is
    `topology_name(namespace)`."""
    name = topology_name(namespace)
    topology = {
        "apiVersion": KUEUE,
        "kind": "Topology",
        "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": level} for level in (BLOCK_LABEL, RACK_LABEL, HOSTNAME_LABEL)]},
    }
    taint = {"key": POOL_KEY, "value": namespace, "effect": "NoSchedule"}
    with contextlib.ExitStack() as stack:
        rack_of: dict[str, str] = {}
        for index in range(count):
            rack = f"rack-{index}"
            labels = {POOL_KEY: namespace, BLOCK_LABEL: "block-0", RACK_LABEL: rack}
            created = stack.enter_context(extra_nodes(kubectl, nodes, gpus=8, labels=labels, taint=taint))
            rack_of.update(dict.fromkeys(created, rack))
        kubectl.run("create", "-f", "-", stdin=json.dumps(topology))
        try:
            yield rack_of
        finally:
            for kind in ("trainingjobs", "pods"):
                retried(
                    f"{kind} in {namespace} deleted",
                    functools.partial(
                        kubectl.run, "delete", kind, "--all", "-n", namespace, "--wait=true", "--timeout=60s"
                    ),
                )
            retried(
                f"Topology {name} deleted",
                functools.partial(
                    kubectl.run, "delete", "topology", name, "--ignore-not-found", "--wait=false"
                ),
            )


def topology_name(namespace: str) -> str:
    return f"tj-e2e-{namespace[-6:]}"


def workload_of(kubectl: Kubectl, namespace: str, job: str) -> JsonDict | None:
    """The Workload the operator made for TrainingJob `job` (by its owner reference), in the API
    version the operator writes."""
    for workload in kubectl.items(
        f"workloads.{contract.KUEUE_VERSION}.{contract.KUEUE_GROUP}", "-n", namespace
    ):
        owners = workload["metadata"].get("ownerReferences") or []
        if any(owner["kind"] == contract.KIND and owner["name"] == job for owner in owners):
            return workload
    return None


def admitted_reason(status: JsonDict) -> str | None:
    for entry in status.get("conditions") or []:
        if entry["type"] == "Admitted":
            return str(entry["reason"])
    return None


def finish(kubectl: Kubectl, namespace: str, job: str) -> None:
    """Every worker of `job` exits 0, as the kubelet reports it; the job Completes."""
    for pod in pods_of(kubectl, namespace, job):
        end_pod(kubectl, namespace, pod["metadata"]["name"])
    wait_state(kubectl, namespace, job, "Completed")


def waiting(kubectl: Kubectl, namespace: str, name: str, reason: str, fragment: str = "") -> JsonDict:
    """Waits until the job is Queued with Admitted False for `reason` (and `fragment` in its message)."""
    return wait_status(
        kubectl,
        namespace,
        name,
        f"Queued ({reason})",
        lambda s: (
            s.get("state") == "Queued" and admitted_reason(s) == reason and fragment in s.get("message", "")
        ),
    )
