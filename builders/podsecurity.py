"""A worker pod's security settings: the "restricted" Pod Security Standard wherever it costs the trainer
nothing, and the pod's ServiceAccount token in the trainer container alone.

Why apart from builders/pods.py: each default gives way to spec.podTemplate, and some give way as a
group or depend on the pod as merged, so the rules that decide them are kept together, pure, where
one reads what a worker pod runs with (docs/security.md, "Trainer pods"). The values are crd/contract.py's,
which the admission policy judging pods against a namespace's Pod Security level reads too.

- Defaults set before the merge, each replaced by the template's own value of the same field: the pod's
  seccomp profile (RuntimeDefault); the trainer's allowPrivilegeEscalation (false, unless the template
  makes the trainer privileged, which the Pod API allows only with escalation) and capabilities.drop
  (ALL).
- The trainer's user, decided on the merged pod: runAsNonRoot with a fixed non-root user and group when
  the operator knows the trainer works that way (its reference trainer in a framework's default image,
  writing only to volumes any user may write to) and the template states no user or group of its own.
- The token: the pod says automountServiceAccountToken false and carries the projection the kubelet
  would have made (a token bound to the pod, the cluster's CA, the namespace) as a volume mounted into
  the trainer container only, where the progress helper reads it. A template that sets
  automountServiceAccountToken keeps Kubernetes' own behaviour instead: true mounts the token into
  every container, false into none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crd import contract
from crd.spec import TrainingJob

JsonDict = dict[str, Any]
AUTOMOUNT = "automountServiceAccountToken"
# The Pod API refuses allowPrivilegeEscalation false beside either of these.
ESCALATING_CAPABILITY = "CAP_SYS_ADMIN"


def _template_spec(job: TrainingJob) -> Mapping[str, Any]:
    return (job.spec.pod_template or {}).get("spec") or {}


def template_trainer(job: TrainingJob) -> Mapping[str, Any]:
    """The template's entry for the trainer container, or an empty one."""
    containers = _template_spec(job).get("containers") or []
    return next((c for c in containers if c.get("name") == contract.CONTAINER_NAME), {})


def _trainer_context(job: TrainingJob) -> Mapping[str, Any]:
    return template_trainer(job).get("securityContext") or {}


def pod_security_context() -> JsonDict:
    """The container runtime's default seccomp profile, which "restricted" requires."""
    return {"seccompProfile": {"type": contract.SECCOMP_PROFILE_TYPE}}


def _privileged_by_template(job: TrainingJob) -> bool:
    context = _trainer_context(job)
    added = (context.get("capabilities") or {}).get("add") or []
    return context.get("privileged") is True or ESCALATING_CAPABILITY in added


def container_security_context(job: TrainingJob) -> JsonDict:
    """The trainer's (and any container the operator adds): every capability dropped (RDMA adds IPC_LOCK
    back, to pin memory) and no privilege escalation, unless the template makes the trainer privileged:
    the Pod API refuses the two together, and the template's choice wins."""
    capabilities: JsonDict = {"drop": list(contract.DROPPED_CAPABILITIES)}
    if job.spec.networking.rdma_enabled:
        capabilities["add"] = list(contract.RDMA_CAPABILITIES)
    context: JsonDict = {"capabilities": capabilities}
    if not _privileged_by_template(job):
        context["allowPrivilegeEscalation"] = contract.ALLOW_PRIVILEGE_ESCALATION
    return context


# --------------------------------------------------------------------------------- the trainer's user


def template_states_identity(job: TrainingJob) -> bool:
    """spec.podTemplate says which user or group the trainer runs as (on the pod or the trainer)."""
    pod_context = _template_spec(job).get("securityContext") or {}
    return any(field in pod_context for field in contract.NON_ROOT_POD_FIELDS) or any(
        field in _trainer_context(job) for field in contract.NON_ROOT_CONTAINER_FIELDS
    )


def runs_reference_trainer_in_default_image(job: TrainingJob) -> bool:
    return job.spec.image in contract.NON_ROOT_IMAGES and job.spec.command in contract.NON_ROOT_COMMANDS


def _volume_type(volume: Mapping[str, Any]) -> str:
    return next((key for key in volume if key != "name"), "")


def writes_only_where_anyone_may(pod: Mapping[str, Any]) -> bool:
    """Every volume the pod's trainer mounts writable is of a type any user may write to (emptyDir) or
    cannot be written at all; a claim, an NFS export or a CSI volume belongs to whoever made it."""
    spec = pod["spec"]
    types = {volume["name"]: _volume_type(volume) for volume in spec.get("volumes") or []}
    trainer = next(c for c in spec["containers"] if c["name"] == contract.CONTAINER_NAME)
    return all(
        mount.get("readOnly") is True or types.get(mount["name"]) in contract.NON_ROOT_VOLUME_TYPES
        for mount in trainer.get("volumeMounts") or []
    )


def runs_as_non_root(job: TrainingJob, pod: Mapping[str, Any]) -> bool:
    """Whether the operator gives the trainer of `pod` (merged with the template) a non-root user. An
    MPI job's pods always (unless the template says): their SSH server can run without privileges
    only as an ordinary user (builders/mpi.py)."""
    if job.spec.mpi is not None:
        return not template_states_identity(job)
    return (
        runs_reference_trainer_in_default_image(job)
        and not template_states_identity(job)
        and writes_only_where_anyone_may(pod)
    )


def with_trainer_user(job: TrainingJob, pod: JsonDict) -> JsonDict:
    """`pod` (merged with the template; changed in place) with the non-root user, where it applies."""
    if runs_as_non_root(job, pod):
        trainer = next(c for c in pod["spec"]["containers"] if c["name"] == contract.CONTAINER_NAME)
        trainer.setdefault("securityContext", {}).update(
            runAsNonRoot=True, runAsUser=contract.NON_ROOT_USER, runAsGroup=contract.NON_ROOT_GROUP
        )
    return pod


# ------------------------------------------------------------------------------------------ the token


def template_sets_token(job: TrainingJob) -> bool:
    """spec.podTemplate chooses Kubernetes' own token mounting (automountServiceAccountToken)."""
    return AUTOMOUNT in _template_spec(job)


def token_volume() -> JsonDict:
    """What the kubelet's automount projects: a token of the pod's ServiceAccount bound to the pod, with
    the kubelet's lifetime; the cluster's CA; the pod's namespace."""
    return {
        "name": contract.TOKEN_VOLUME,
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "expirationSeconds": contract.TOKEN_EXPIRATION_SECONDS,
                        "path": contract.TOKEN_FILE,
                    }
                },
                {
                    "configMap": {
                        "name": contract.ROOT_CA_CONFIGMAP,
                        "items": [{"key": contract.ROOT_CA_KEY, "path": contract.ROOT_CA_KEY}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {"path": contract.NAMESPACE_FILE, "fieldRef": {"fieldPath": "metadata.namespace"}}
                        ]
                    }
                },
            ]
        },
    }


def token_mount() -> JsonDict:
    return {"name": contract.TOKEN_VOLUME, "mountPath": contract.TOKEN_MOUNT_PATH, "readOnly": True}
