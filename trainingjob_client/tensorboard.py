"""The TensorBoard viewer of a TrainingJob: the Pod `kubectl trainingjob tensorboard` runs, decided purely.

Why: with monitoring.tensorboardEnabled the trainer writes event files to TENSORBOARD_LOG_DIR inside its
pods; to see them, a person needs TensorBoard running where that directory is readable, which is on
the cluster, next to the job's storage, not on their laptop. What that Pod is (which volume holds the
log directory, where it may be scheduled, which image has TensorBoard, how it is labelled and owned)
follows from the TrainingJob alone, so it is built here by pure functions the unit tests call directly;
trainingjob_client/viewer.py creates it, waits for it and port-forwards to it.

- The log directory is the one the operator gives the trainer (builders.env.tensorboard_log_dir). It is
  readable from another pod only on shared storage: the job's checkpoint volume (a pvc claim or an
  nfs export), or a pvc or nfs volume spec.podTemplate mounts into the trainer. That volume is mounted
  read-only at the same path; a directory on neither (the /tmp fallback) is refused, saying what to set.
- The image is the job's own (spec.image, defaulted): a trainer that writes event files has the
  `tensorboard` package, whose console script serves them. `--image` overrides it.
- The pod may go where the job's pods may go (their node selector, affinity and tolerations), and a
  claim's PersistentVolume adds its own node affinity (a local volume lives on one node), which the
  scheduler applies.
- Its labels are app.kubernetes.io/* only: none of the operator's (training-job, managed-by the
  operator), so the operator never counts it as a worker and `kubectl logs -l training-job=<job>`
  does not show it. A (non-controller) ownerReference to the TrainingJob deletes it with the job.
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from builders.env import tensorboard_log_dir
from builders.pods import scheduling_fields
from builders.podsecurity import template_trainer
from builders.storage import checkpoint_storage
from crd import contract
from crd.spec import TrainingJob
from trainingjob_client.errors import TrainingJobError

JsonDict = dict[str, Any]

PORT: Final = 6006
CONTAINER: Final = "tensorboard"
LOG_VOLUME: Final = "tensorboard-logs"
# TensorBoard keeps a file about itself in the temporary directory: one it can write in any image.
SCRATCH_VOLUME: Final = "tmp"
SCRATCH_PATH: Final = "/tmp"  # noqa: S108 - an emptyDir of the pod's own
NAME_SUFFIX: Final = "-tensorboard"
APP_NAME: Final = "tensorboard"
COMPONENT: Final = "viewer"
MANAGED_BY: Final = "kubectl-trainingjob"
INSTANCE_LABEL: Final = "app.kubernetes.io/instance"
PART_OF_LABEL: Final = "app.kubernetes.io/part-of"
# TensorBoard's own server: a few hundred MB for a run's scalars, more for images and histograms.
REQUESTS: Final = {"cpu": "100m", "memory": "256Mi"}
LIMITS: Final = {"memory": "2Gi"}
# How a container ends whose command the image does not have: the runtime could not start it, or a
# shell said "not found" (127) or "not executable" (126).
NOT_STARTED: Final = ("StartError", "ContainerCannotRun")
NOT_FOUND_EXIT_CODES: Final = (126, 127)
# Volume types another pod can mount beside the trainer's and see its files.
SHARED_VOLUME_TYPES: Final = ("persistentVolumeClaim", "nfs")


class TensorBoardUnavailable(TrainingJobError):
    """The job's TensorBoard logs cannot be viewed from another pod (not enabled, not on shared storage),
    or the viewer pod did not become ready; the message says why and what to do."""


@dataclass(frozen=True)
class LogVolume:
    """Where a viewer finds the log directory: a volume and its read-only mount at the trainer's path."""

    log_dir: str
    volume: JsonDict
    mount: JsonDict


def viewer_name(job_name: str) -> str:
    return f"{job_name}{NAME_SUFFIX}"


def viewer_labels(job_name: str) -> dict[str, str]:
    return {
        contract.APP_NAME_LABEL: APP_NAME,
        INSTANCE_LABEL: viewer_name(job_name),
        contract.COMPONENT_LABEL: COMPONENT,
        PART_OF_LABEL: contract.APP_NAME_VALUE,
        contract.MANAGED_BY_LABEL: MANAGED_BY,
    }


def _under(path: str, directory: str) -> bool:
    path, directory = posixpath.normpath(path), posixpath.normpath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _template_volumes(job: TrainingJob) -> list[tuple[JsonDict, JsonDict]]:
    """spec.podTemplate's shared volumes the trainer mounts, each with the trainer's mount."""
    spec = (job.spec.pod_template or {}).get("spec") or {}
    volumes = {volume.get("name"): volume for volume in spec.get("volumes") or []}
    found = []
    for mount in template_trainer(job).get("volumeMounts") or []:
        volume = volumes.get(mount.get("name"))
        if volume is not None and any(kind in volume for kind in SHARED_VOLUME_TYPES):
            found.append((dict(volume), dict(mount)))
    return found


def _checkpoint_volume(job: TrainingJob) -> tuple[JsonDict, JsonDict] | None:
    storage = checkpoint_storage(job)
    if storage is None or not storage.is_volume:
        return None
    if storage.type == "pvc":
        source: JsonDict = {"persistentVolumeClaim": {"claimName": storage.claim_name, "readOnly": True}}
    else:
        source = {"nfs": {"server": storage.nfs_server, "path": storage.nfs_path, "readOnly": True}}
    return {"name": contract.CHECKPOINT_VOLUME, **source}, {"mountPath": storage.mount_path}


def log_volume(job: TrainingJob) -> LogVolume:
    """The volume holding the job's TensorBoard log directory; TensorBoardUnavailable says why not."""
    where = f"TrainingJob {job.namespace}/{job.name}"
    if not job.spec.monitoring.tensorboard_enabled:
        raise TensorBoardUnavailable(
            f"{where} writes no TensorBoard logs: set spec.monitoring.tensorboardEnabled=true"
        )
    log_dir = tensorboard_log_dir(job, checkpoint_storage(job))
    candidates = [
        *([found] if (found := _checkpoint_volume(job)) else []),
        *_template_volumes(job),
    ]
    holding = [(volume, mount) for volume, mount in candidates if _under(log_dir, mount["mountPath"])]
    if not holding:
        raise TensorBoardUnavailable(
            f"{where} writes its TensorBoard logs to {log_dir}, which is inside its pods and no other pod "
            "can read: use pvc or nfs checkpoint storage (the logs go to <mountPath>/tensorboard) or set "
            "spec.monitoring.tensorboardLogDir to a directory on a pvc or nfs volume the trainer mounts"
        )
    # The innermost mount holds it (a volume mounted inside another one's directory hides that part).
    volume, mount = max(holding, key=lambda pair: len(posixpath.normpath(pair[1]["mountPath"])))
    read_only_mount = {"name": LOG_VOLUME, "mountPath": mount["mountPath"], "readOnly": True}
    if mount.get("subPath"):
        read_only_mount["subPath"] = mount["subPath"]
    return LogVolume(log_dir, {**copy.deepcopy(volume), "name": LOG_VOLUME}, read_only_mount)


def _placement(job: TrainingJob) -> JsonDict:
    """The job's pods' node selector, affinity and tolerations (spec.scheduling, then the template's)."""
    fields = {
        key: value
        for key, value in scheduling_fields(job).items()
        if key in ("nodeSelector", "affinity", "tolerations")
    }
    template = (job.spec.pod_template or {}).get("spec") or {}
    if template.get("nodeSelector"):
        fields["nodeSelector"] = {**fields.get("nodeSelector", {}), **template["nodeSelector"]}
    if template.get("affinity"):
        fields["affinity"] = copy.deepcopy(template["affinity"])
    if template.get("tolerations"):
        fields["tolerations"] = [*fields.get("tolerations", []), *copy.deepcopy(template["tolerations"])]
    if template.get("imagePullSecrets"):
        fields["imagePullSecrets"] = copy.deepcopy(template["imagePullSecrets"])
    return fields


def _identity(job: TrainingJob) -> JsonDict:
    """The user the viewer reads as: the template's (whoever wrote the files can read them), else an
    ordinary user (files a trainer writes are readable by others unless its umask says otherwise)."""
    template = (job.spec.pod_template or {}).get("spec") or {}
    pod_context = template.get("securityContext") or {}
    trainer_context = template_trainer(job).get("securityContext") or {}
    stated = {
        **{field: pod_context[field] for field in contract.NON_ROOT_POD_FIELDS if field in pod_context},
        **{
            field: trainer_context[field]
            for field in contract.NON_ROOT_CONTAINER_FIELDS
            if field in trainer_context
        },
    }
    if stated:
        return stated
    return {"runAsNonRoot": True, "runAsUser": contract.NON_ROOT_USER, "runAsGroup": contract.NON_ROOT_GROUP}


def tensorboard_args(log_dir: str, port: int = PORT) -> list[str]:
    """TensorBoard's command line: the log directory, on every address of the pod (port-forward reaches
    it on the pod's loopback), at `port`."""
    return ["tensorboard", f"--logdir={log_dir}", "--host=0.0.0.0", f"--port={port}"]


def viewer_pod(job: TrainingJob, *, image: str | None = None) -> JsonDict:
    """The viewer Pod of a job (as the API server stored it: defaulted, with uid and namespace)."""
    logs = log_volume(job)
    owner = {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": job.name, "uid": job.uid}
    metadata: JsonDict = {
        "name": viewer_name(job.name),
        "labels": viewer_labels(job.name),
        "ownerReferences": [owner],
    }
    if job.namespace:
        metadata["namespace"] = job.namespace
    container: JsonDict = {
        "name": CONTAINER,
        "image": image or job.spec.image,
        "command": tensorboard_args(logs.log_dir),
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/", "port": PORT},
            "periodSeconds": 2,
            "failureThreshold": 3,
        },
        "resources": {"requests": dict(REQUESTS), "limits": dict(LIMITS)},
        "volumeMounts": [logs.mount, {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_PATH}],
        "securityContext": {
            "allowPrivilegeEscalation": contract.ALLOW_PRIVILEGE_ESCALATION,
            "capabilities": {"drop": list(contract.DROPPED_CAPABILITIES)},
        },
    }
    spec: JsonDict = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "seccompProfile": {"type": contract.SECCOMP_PROFILE_TYPE},
            **_identity(job),
        },
        "containers": [container],
        "volumes": [logs.volume, {"name": SCRATCH_VOLUME, "emptyDir": {}}],
        **_placement(job),
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


# ------------------------------------------------------------------------------- an existing viewer


class Existing(Enum):
    """What to do with a pod that already has the viewer's name."""

    REUSE = "reuse"  # a live viewer of this job with the wanted image
    REPLACE = (
        "replace"  # a viewer, but finished, terminating, of an earlier job of the name, or another image
    )
    FOREIGN = "foreign"  # someone else's pod: left alone


def _is_viewer(pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return (
        labels.get(contract.MANAGED_BY_LABEL) == MANAGED_BY
        and labels.get(contract.APP_NAME_LABEL) == APP_NAME
    )


def _owner_uids(pod: Mapping[str, Any]) -> set[str]:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return {str(owner.get("uid")) for owner in owners if owner.get("kind") == contract.KIND}


def existing_viewer(pod: Mapping[str, Any], wanted: Mapping[str, Any]) -> Existing:
    """Reuse a running viewer of the same job and image; replace a stale one; never touch another pod."""
    if not _is_viewer(pod):
        return Existing.FOREIGN
    metadata = pod.get("metadata") or {}
    images = [c.get("image") for c in (pod.get("spec") or {}).get("containers") or []]
    wanted_images = [c.get("image") for c in wanted["spec"]["containers"]]
    phase = (pod.get("status") or {}).get("phase")
    if (
        metadata.get("deletionTimestamp")
        or phase in ("Succeeded", "Failed")
        or _owner_uids(pod) != _owner_uids(wanted)
        or images != wanted_images
    ):
        return Existing.REPLACE
    return Existing.REUSE


# ------------------------------------------------------------------------------------ the pod's state


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _container_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == CONTAINER), {})


def progress(pod: Mapping[str, Any]) -> str:
    """One line on where the pod is on its way to Ready: its phase, and why it waits."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if is_ready(pod):
        return "Ready"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            reason = condition.get("reason") or "not scheduled"
            return f"{phase}: {reason}: {' '.join(str(condition.get('message') or '').split())}".rstrip(": ")
    state = _container_status(pod).get("state") or {}
    waiting = state.get("waiting")
    if waiting:
        message = " ".join(str(waiting.get("message") or "").split())
        return f"{phase}: {waiting.get('reason') or 'waiting'}{': ' + message if message else ''}"
    if "running" in state:
        return f"{phase}: TensorBoard is starting"
    return phase


def failure(pod: Mapping[str, Any], image: str) -> str | None:
    """Why the viewer ended (it never does by itself while it serves), or None while it may still serve."""
    status = pod.get("status") or {}
    if status.get("phase") not in ("Failed", "Succeeded"):
        return None
    terminated = (_container_status(pod).get("state") or {}).get("terminated") or {}
    said = " ".join(str(terminated.get("message") or status.get("message") or "").split())
    reason = terminated.get("reason") or status.get("reason") or status.get("phase")
    code = terminated.get("exitCode")
    exited = f" (exit code {code})" if code is not None else ""
    detail = f": {said[-300:]}" if said else ""
    text = f"TensorBoard ended in pod {viewer_name_of(pod)}: {reason}{exited}{detail}"
    if reason in NOT_STARTED or code in NOT_FOUND_EXIT_CODES:
        text += f"; does image {image} have the tensorboard package? choose another with --image"
    return text


def viewer_name_of(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}"
