"""The Workload through which Kueue queues a TrainingJob.

Kueue queues a kind it does not know natively through a Workload that the kind's own controller
creates and owns (the model of Kueue's job integrations: batch Jobs, JobSets, Kubeflow's jobs). A
TrainingJob's Workload has one pod set, `workers`: every pod of the job (numWorkers, and a TensorFlow
job's chief, parameter servers and evaluator, which share the workers' template), with the requests of
the pods the operator builds, and the node selector, affinity and tolerations Kueue matches against its
ResourceFlavors, and with spec.scheduling.topology the pod set's `topologyRequest` (Kueue's TAS: the
gang in one domain of a level, required or preferred). Its priority is the value of the job's
WorkloadPriorityClass (label kueue.x-k8s.io/priority-class), else of the pods' PriorityClass
(resolved by the planner, which sees the classes). It is named as Kueue names the Workloads of its
own integrations,
`trainingjob-<name>-<hash>`, the hash taken from the job's kind, group, name and UID, so a job
deleted and created again under the same name never finds its predecessor's Workload.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from builders.meta import object_meta
from builders.pods import build_pod
from crd import contract
from crd.spec import TrainingJob

JsonDict = dict[str, Any]

HASH_LENGTH: Final = 5
# What of a worker pod Kueue reads when it admits: the requests (also of init containers and sidecars,
# and the runtime class's overhead) and what decides which ResourceFlavors fit.
CONTAINER_FIELDS: Final = ("name", "image", "resources", "restartPolicy")
POD_FIELDS: Final = ("nodeSelector", "affinity", "tolerations", "runtimeClassName", "overhead")


@dataclass(frozen=True)
class WorkloadPriority:
    """Workload.spec's priority fields: the class's name and (group, kind) (None: no class), and its
    value."""

    class_name: str | None
    source: tuple[str, str] | None
    value: int

    def fields(self) -> JsonDict:
        fields: JsonDict = {"priority": self.value}
        if self.class_name and self.source:
            group, kind = self.source
            fields["priorityClassRef"] = {"group": group, "kind": kind, "name": self.class_name}
        return fields


def workload_name(job: TrainingJob) -> str:
    """`trainingjob-<name>-<5 hex digits>`, as Kueue's jobframework names its integrations' Workloads;
    the Workload Kueue made for the job when it names one (MultiKueue's copy on a worker cluster)."""
    if job.prebuilt_workload:
        return job.prebuilt_workload
    digest = hashlib.sha1(  # noqa: S324 - a name suffix, as Kueue computes it, not a security hash
        "\n".join((contract.KIND, contract.GROUP, job.name, job.uid)).encode()
    ).hexdigest()
    return f"{contract.KIND.lower()}-{job.name}-{digest[:HASH_LENGTH]}"


def _slim_container(container: Mapping[str, Any]) -> JsonDict:
    return {key: copy.deepcopy(container[key]) for key in CONTAINER_FIELDS if key in container}


def pod_set(job: TrainingJob) -> JsonDict:
    """The Workload's one pod set: every pod of the job, shaped like slot 0, reduced to what Kueue reads."""
    pod = build_pod(job, 0, attempt=0, resume_from=None)
    spec = pod["spec"]
    template: JsonDict = {
        "restartPolicy": spec["restartPolicy"],
        "containers": [_slim_container(container) for container in spec["containers"]],
    }
    if spec.get("initContainers"):
        template["initContainers"] = [_slim_container(container) for container in spec["initContainers"]]
    for key in POD_FIELDS:
        if spec.get(key):
            template[key] = copy.deepcopy(spec[key])
    count = job.spec.replicas.size
    built: JsonDict = {"name": contract.WORKLOAD_POD_SET, "count": count, "template": {"spec": template}}
    topology = job.spec.scheduling.topology
    if topology is not None:
        built["topologyRequest"] = {"required" if topology.required else "preferred": topology.level}
    return built


def build_workload(job: TrainingJob, priority: WorkloadPriority) -> JsonDict:
    """The job's Workload in its LocalQueue (the job must have the queue-name label)."""
    labels = {contract.KUEUE_JOB_UID_LABEL: job.uid} if job.uid else {}
    return {
        "apiVersion": contract.KUEUE_API_VERSION,
        "kind": "Workload",
        "metadata": object_meta(job, workload_name(job), labels=labels),
        "spec": {"queueName": job.queue_name or "", "podSets": [pod_set(job)], **priority.fields()},
    }
