"""The worker Pod: one per slot of the job (crd/replicas.py: its workers, and a TensorFlow job's chief,
parameter servers and evaluator), created and deleted by the controller as a gang.

Pods are bare (no Job or StatefulSet in between) because the controller restarts the whole gang
itself: restartPolicy is Never so the kubelet never restarts a single trainer that could not rejoin
the collective. Each pod gets a stable DNS name (hostname + the headless Service as subdomain), the
training environment, the trainer's sources (builders/configmap.py), checkpoint
storage and a memory-backed /dev/shm, and records the world size and spec generation it was built for
so stale pods can be recognised. Its security settings (the "restricted" Pod Security Standard where it
costs the trainer nothing, the token in the trainer alone) are builders/podsecurity.py's. Last,
spec.podTemplate is merged onto it (builders/podtemplate.py), then, for a job Kueue admitted, the
admission's node labels and tolerations (builders/placement.py).
"""

from __future__ import annotations

import copy
from typing import Any

from builders.configmap import trainer_sources_projection
from builders.env import distributed_env, termination_grace_seconds
from builders.meta import object_meta
from builders.mpi import with_mpi
from builders.names import headless_service_name, pod_name, service_account_name
from builders.placement import Placement, place
from builders.podgroup import GangScheduler, pod_decoration
from builders.podsecurity import (
    container_security_context,
    pod_security_context,
    template_sets_token,
    token_mount,
    token_volume,
    with_trainer_user,
)
from builders.podtemplate import merge_pod_template
from builders.storage import CheckpointStorage, checkpoint_storage
from builders.supervisor import supervised, supervised_command
from crd import contract
from crd.spec import TrainingJob

CONFIG_VOLUME = contract.CONFIG_VOLUME
SHM_VOLUME = contract.SHM_VOLUME
CHECKPOINT_VOLUME = contract.CHECKPOINT_VOLUME
GCS_CREDENTIALS_VOLUME = contract.GCS_CREDENTIALS_VOLUME
SECRET_FILE_MODE = 0o440


def quantity_text(value: object) -> str:
    return str(value)


def container_resources(job: TrainingJob) -> dict[str, Any]:
    """spec.resources with every quantity as a string, plus nvidia.com/gpu = gpusPerWorker when > 0."""
    configured = job.spec.resources
    requests = {k: quantity_text(v) for k, v in configured.requests.items()}
    limits = {k: quantity_text(v) for k, v in configured.limits.items()}
    gpus = job.spec.gpus_per_worker
    if gpus > 0:
        requests[contract.GPU_RESOURCE] = limits[contract.GPU_RESOURCE] = str(gpus)
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


def container_ports(job: TrainingJob) -> list[dict[str, Any]]:
    spec = job.spec
    ports = [
        {
            "name": contract.DIST_PORT_NAME,
            "containerPort": spec.networking.master_port,
            "protocol": "TCP",
        }
    ]
    if spec.monitoring.enabled:
        ports.append(
            {
                "name": contract.METRICS_PORT_NAME,
                "containerPort": spec.monitoring.metrics_port,
                "protocol": "TCP",
            }
        )
    if spec.elastic is not None:
        port = spec.elastic.rendezvous.port
        ports.append({"name": contract.RDZV_PORT_NAME, "containerPort": port, "protocol": "TCP"})
    return ports


def volumes_and_mounts(
    job: TrainingJob, storage: CheckpointStorage | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # The namespace's trainer sources, each file at its path under trainer/.
    volumes: list[dict[str, Any]] = [
        {"name": CONFIG_VOLUME, "configMap": trainer_sources_projection()},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": CONFIG_VOLUME, "mountPath": contract.CONFIG_MOUNT_PATH, "readOnly": True},
        {"name": SHM_VOLUME, "mountPath": contract.SHM_MOUNT_PATH},
    ]
    if storage is None:
        return volumes, mounts
    if storage.type == "pvc":
        volumes.append(
            {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": storage.claim_name}}
        )
    elif storage.type == "nfs":
        volumes.append(
            {"name": CHECKPOINT_VOLUME, "nfs": {"server": storage.nfs_server, "path": storage.nfs_path}}
        )
    if storage.is_volume:
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": storage.mount_path})
    if storage.type == "gcs" and storage.credentials_secret:
        volumes.append(
            {
                "name": GCS_CREDENTIALS_VOLUME,
                "secret": {"secretName": storage.credentials_secret, "defaultMode": SECRET_FILE_MODE},
            }
        )
        mounts.append(
            {
                "name": GCS_CREDENTIALS_VOLUME,
                "mountPath": contract.GCS_CREDENTIALS_MOUNT_PATH,
                "readOnly": True,
            }
        )
    return volumes, mounts


def trainer_container(
    job: TrainingJob, slot: int, *, attempt: int, resume_from: str | None, mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    spec = job.spec
    container: dict[str, Any] = {"name": contract.CONTAINER_NAME, "image": spec.image}
    if spec.command:
        container["command"] = (
            supervised_command(spec.command) if supervised(job, slot) else list(spec.command)
        )
    if spec.args:
        container["args"] = list(spec.args)
    container["env"] = distributed_env(job, slot, attempt=attempt, resume_from=resume_from)
    container["ports"] = container_ports(job)
    resources = container_resources(job)
    if resources:
        container["resources"] = resources
    container["volumeMounts"] = mounts
    container["securityContext"] = container_security_context(job)
    # The tail of the log becomes the termination message when the trainer dies without writing one,
    # so status can say why a worker failed.
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    return container


def scheduling_fields(job: TrainingJob) -> dict[str, Any]:
    scheduling = job.spec.scheduling
    fields: dict[str, Any] = {}
    if scheduling.node_selector:
        fields["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.affinity:
        fields["affinity"] = copy.deepcopy(dict(scheduling.affinity))
    if scheduling.tolerations:
        fields["tolerations"] = [copy.deepcopy(dict(toleration)) for toleration in scheduling.tolerations]
    if scheduling.priority:
        fields["priorityClassName"] = scheduling.priority
    if scheduling.scheduler_name:
        fields["schedulerName"] = scheduling.scheduler_name
    return fields


def pod_labels(job: TrainingJob, slot: int, attempt: int) -> dict[str, str]:
    """The pod's role and its index within the role (slot 0, which MASTER_ADDR names, is index 0 of the
    first role); the gang attempt it belongs to."""
    replica = job.spec.replicas.at(slot)
    return {
        contract.REPLICA_TYPE_LABEL: str(replica.type),
        contract.REPLICA_INDEX_LABEL: str(replica.index),
        contract.ATTEMPT_LABEL: str(attempt),
    }


def pod_annotations(job: TrainingJob) -> dict[str, str]:
    """The numWorkers the pod was built for (a pod of another size is stale, controller/planner), except
    for an elastic job, whose size changes while its pods run. Only what the operator reads back: every
    byte of a pod is paid on each of its writes and watch events."""
    if job.spec.elastic is not None:
        return {}
    return {contract.NUM_WORKERS_ANNOTATION: str(job.spec.num_workers)}


def with_default_container(pod: dict[str, Any]) -> dict[str, Any]:
    """A pod with sidecars (spec.podTemplate) names the trainer as the container `kubectl logs` and
    `kubectl exec` pick, unless the template names another; with one container kubectl picks it anyway."""
    if len(pod["spec"].get("containers") or []) > 1:
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations.setdefault(contract.DEFAULT_CONTAINER_ANNOTATION, contract.CONTAINER_NAME)
    return pod


def build_pod(
    job: TrainingJob,
    slot: int,
    *,
    attempt: int,
    resume_from: str | None,
    service_account: str | None = None,
    gang: GangScheduler | None = None,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """The pod in `slot` of a defaulted job (crd/replicas.py; worker `slot` of a job without TensorFlow
    roles) for gang attempt `attempt`.

    resume_from: the checkpoint the trainer starts from (RESUME_FROM), decided by the controller.
    service_account: the account to run under; None picks spec.serviceAccountName or the trainers' one.
    gang: the gang scheduler whose PodGroup the pod joins, or None.
    placement: what Kueue's admission adds (builders/placement.py), for a queued job.
    """
    storage = checkpoint_storage(job)
    volumes, mounts = volumes_and_mounts(job, storage)
    if not template_sets_token(job):
        volumes.append(token_volume())
        mounts.append(token_mount())
    account = service_account or service_account_name(job)
    labels = pod_labels(job, slot, attempt)
    annotations = pod_annotations(job)
    if supervised(job, slot):
        annotations[contract.SUPERVISED_ANNOTATION] = "true"
    # A stable DNS name for every pod of the training cluster (TF_CONFIG names them). The evaluator is not
    # in it, and its name, <job>-evaluator-0, may be longer than a hostname may be.
    hostname = {"hostname": pod_name(job, slot)} if slot in job.spec.replicas.hosts else {}
    pod_spec: dict[str, Any] = {
        **hostname,
        "subdomain": headless_service_name(job),
        "restartPolicy": "Never",
        "containers": [trainer_container(job, slot, attempt=attempt, resume_from=resume_from, mounts=mounts)],
        "volumes": volumes,
        "securityContext": pod_security_context(),
        "serviceAccountName": account,
        # The token goes into the trainer alone (the volume above), unless the template chooses.
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": termination_grace_seconds(job),
        "enableServiceLinks": False,
        **scheduling_fields(job),
    }
    if gang is not None:
        decoration = pod_decoration(job, gang)
        labels.update(decoration.labels)
        annotations.update(decoration.annotations)
        pod_spec["schedulerName"] = decoration.scheduler_name
    metadata = object_meta(job, pod_name(job, slot), labels=labels, annotations=annotations)
    # Held until the pod's end is in the job's status (controller/planner/tracking.py).
    metadata["finalizers"] = [contract.TRACKING_FINALIZER]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
    if job.spec.mpi is not None:
        pod = with_mpi(job, slot, pod)
    merged = with_trainer_user(job, merge_pod_template(pod, job.spec.pod_template))
    return with_default_container(place(merged, placement.for_slot(slot) if placement is not None else None))
