"""Putting TrainingJobs on the local cluster's real node, and waiting for what its kubelet did.

Why apart: the tests of training in containers and of the operator deployed from its image need the
same few things on top of the testbed's pods on the node (`testbed.pod_on_node`, `REAL_NODE`): a job
that tolerates the node's taint and asks for it, with resources that fit a 2-core machine, the
reference trainer paced for it, and waits for a pod's state that ride out API server restarts.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from testbed import REAL_NODE, REGISTRY, Kubectl, is_ready, terminated
from tests.e2e.jobs import job_manifest, wait

JsonDict = dict[str, Any]

NODE = REAL_NODE.name
TOLERATION: JsonDict = REAL_NODE.toleration
SELECTOR: JsonDict = dict(REAL_NODE.selector)
# The reference trainer with real torch, paced for 2 busy cores: 5 steps of a small model on
# synthetic data per epoch, each step held to at least TRAIN_STEP_SECONDS (long enough to look at a
# running trainer), every report sent at once.
PACE = {"TRAIN_STEPS_PER_EPOCH": "5", "TRAIN_STEP_SECONDS": "0.2", "TRAIN_PROGRESS_INTERVAL": "0"}


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


def create_pull_secret(kubectl: Kubectl, namespace: str, name: str, *, password: str | None = None) -> None:
    """A pull Secret for the local cluster's registry, made as its users make one (`kubectl create secret
    docker-registry`, the examples' and deploy/README.md's command), with its credentials or a wrong
    `password`."""
    user, own = REGISTRY.credentials()
    kubectl.run(
        *("create", "secret", "docker-registry", name, "-n", namespace, f"--docker-server={REGISTRY.host}"),
        *(f"--docker-username={user}", f"--docker-password={own if password is None else password}"),
    )


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
        return pod if pod and is_ready(pod) else None

    return wait(f"pod {name} Running and Ready", probe, timeout=timeout)


def evict(kubectl: Kubectl, namespace: str, pod: str) -> None:
    """The Eviction API on `pod`, as `kubectl drain` calls it."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
    }
    kubectl.run(
        "create",
        "--raw",
        f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction",
        "-f",
        "-",
        stdin=json.dumps(eviction),
    )
