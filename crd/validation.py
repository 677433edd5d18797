"""Checks of a TrainingJob that only the operator can make, run before it builds anything.

Most validation happens at admission, where a bad manifest is rejected before it is stored. Each
check lives in exactly one place:

- OpenAPI schema (crd/schema_spec.py): types, required fields, enums, numeric bounds, string
  patterns and lengths, list/map sizes; unknown fields are rejected by kubectl's strict field
  validation or pruned.
  The core/v1 parts (podTemplate, scheduling.affinity, env[].valueFrom) have Kubernetes' own schema,
  generated from the API server's OpenAPI (crd/kube_openapi.py), so nothing in the spec is free-form.
- CEL rules (crd/schema_spec.py, crd/schema.py, crd/schema_podtemplate.py): metadata.name length and
  DNS-1035 syntax; immutability; reserved env names; env value/valueFrom exclusivity and exactly one
  valueFrom source; nvidia.com/gpu in
  resources equal to gpusPerWorker; requests not above limits; retryable/permanent exit codes
  disjoint and only with restartPolicy ExitCode; backoff delays ordered; storage type consistent
  with its settings (bucket present, short and long form not both, no settings of other types);
  checkpoint.mountPath not shadowing the operator's mounts; metricsPort != masterPort;
  restartOnStall needs progressDeadlineSeconds; toleration consistency; additionalParams keys; the
  podTemplate fields the operator owns, and its mounts, volume names and container names.
- Here: what the API server cannot judge: rules needing operator knowledge (accelerator resource
  names, how checkpoint paths map onto storage, operator defaults such as the backend, which
  containers the pod will have) and name collisions created by the operator's own transformations
  (additionalParams keys upper-cased into HP_* variables).

The controller runs `validate` on every reconcile; a non-empty result fails the job with the
messages instead of creating pods that could never work.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from crd import contract
from crd.defaults import storage_in_use, with_defaults
from crd.schema_mpi import MPI_REFUSAL

NVIDIA_PREFIX = "nvidia.com/"
OTHER_ACCELERATOR_PREFIXES = ("amd.com/gpu", "gpu.intel.com/", "habana.ai/", "aws.amazon.com/neuron")
OBJECT_STORE_SCHEMES = {"s3": "s3://", "gcs": "gs://"}


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def validate(job: dict[str, Any]) -> list[FieldError]:
    """Every operator-side problem of `job` (defaults are applied first; `job` is not modified)."""
    spec = with_defaults(job)["spec"]
    return [
        *_value_from_errors(spec),
        *_hyperparameter_errors(spec),
        *_accelerator_errors(spec),
        *_backend_errors(spec),
        *_resume_errors(spec),
        *_mount_path_errors(spec),
    ]


def _container_names(spec: dict[str, Any]) -> set[str]:
    template = spec.get("podTemplate", {}).get("spec", {})
    sidecars = template.get("containers", []) + template.get("initContainers", [])
    return {contract.CONTAINER_NAME, *(str(c.get("name")) for c in sidecars)}


def _value_from_errors(spec: dict[str, Any]) -> Iterator[FieldError]:
    names = _container_names(spec)
    for i, entry in enumerate(spec.get("env", [])):
        container = entry.get("valueFrom", {}).get("resourceFieldRef", {}).get("containerName")
        if container not in (None, "") and container not in names:
            yield FieldError(
                f"spec.env[{i}].valueFrom.resourceFieldRef.containerName",
                f"the worker pod has no container {container!r}; it has {', '.join(sorted(names))}",
            )


def _hyperparameter_errors(spec: dict[str, Any]) -> Iterator[FieldError]:
    params = spec.get("hyperparameters", {}).get("additionalParams", {})
    by_variable: dict[str, list[str]] = {}
    for key in sorted(params):
        by_variable.setdefault(f"HP_{key.upper()}", []).append(key)
    for variable, keys in sorted(by_variable.items()):
        if len(keys) > 1:
            yield FieldError(
                "spec.hyperparameters.additionalParams",
                f"keys {', '.join(keys)} would all become {variable}; keep one",
            )


def _resource_names(spec: dict[str, Any]) -> set[str]:
    resources = spec.get("resources", {})
    return set(resources.get("requests", {})) | set(resources.get("limits", {}))


def _accelerator_errors(spec: dict[str, Any]) -> Iterator[FieldError]:
    names = _resource_names(spec)
    gpus = int(spec["gpusPerWorker"])
    if gpus > 0:
        others = sorted(
            n
            for n in names
            if n != contract.GPU_RESOURCE and n.startswith((NVIDIA_PREFIX, *OTHER_ACCELERATOR_PREFIXES))
        )
        if others:
            yield FieldError(
                "spec.resources",
                f"gpusPerWorker={gpus} already requests {contract.GPU_RESOURCE}; with {', '.join(others)} "
                "each worker would need both kinds of device. Set gpusPerWorker: 0 to request other "
                "accelerators through resources",
            )
    if (
        spec["networking"]["backend"] == "nccl"
        and gpus == 0
        and not any(n.startswith(NVIDIA_PREFIX) for n in names)
    ):
        yield FieldError(
            "spec.networking.backend",
            "nccl needs NVIDIA GPUs, but the workers request none (gpusPerWorker is 0 and no nvidia.com/* "
            "resource is set); use gloo for CPU-only training",
        )


def _backend_errors(spec: dict[str, Any]) -> Iterator[FieldError]:
    """mpi, stored before admission refused it (crd/schema_spec.py says why)."""
    if spec["networking"]["backend"] == "mpi":
        yield FieldError("spec.networking.backend", f"mpi is not supported: {MPI_REFUSAL}")


def _resume_errors(spec: dict[str, Any]) -> Iterator[FieldError]:
    checkpoint = spec["checkpoint"]
    resume_from = checkpoint.get("resumeFrom")
    if not resume_from or not storage_in_use(spec):
        return
    path = "spec.checkpoint.resumeFrom"
    kind = checkpoint["storage"]["type"]
    scheme = OBJECT_STORE_SCHEMES.get(kind)
    if scheme is not None:
        if not resume_from.startswith(scheme) or len(resume_from) == len(scheme):
            yield FieldError(
                path, f"storage type {kind} resumes from {scheme}<bucket>/<key>, got {resume_from!r}"
            )
        return
    if "://" in resume_from:
        yield FieldError(
            path,
            f"storage type {kind} resumes from a path on the volume (relative to checkpoint.mountPath or "
            f"absolute under it), got the URL {resume_from!r}",
        )
        return
    mount_path = str(checkpoint["mountPath"]).rstrip("/")
    normalized = posixpath.normpath(posixpath.join(mount_path, resume_from))
    if normalized != mount_path and not normalized.startswith(mount_path + "/"):
        yield FieldError(path, f"{resume_from!r} is outside the checkpoint volume mounted at {mount_path}")


def _mount_path_errors(spec: dict[str, Any]) -> Iterator[FieldError]:
    """checkpoint.mountPath compared as the path it is, not as a string: admission refuses '.', '..' and
    '//' (crd/schema_storage.py), but a job stored before that rule could still mount over the
    operator's own mounts through `/checkpoints/../etc/trainingjob`."""
    mount_path = str(spec["checkpoint"]["mountPath"])
    normalized = posixpath.normpath(mount_path)
    if normalized != mount_path.rstrip("/") or mount_path.startswith("//"):
        yield FieldError(
            "spec.checkpoint.mountPath", f"{mount_path!r} is not a normalised absolute path ({normalized!r})"
        )
    for reserved in contract.RESERVED_MOUNT_PATHS:
        if normalized == reserved or normalized.startswith(reserved + "/"):
            yield FieldError(
                "spec.checkpoint.mountPath", f"{mount_path!r} is {normalized!r}, which the operator mounts"
            )
