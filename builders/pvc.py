"""The checkpoint PersistentVolumeClaim the operator creates when a job asks for pvc storage without
naming an existing claim, and how it follows spec.checkpoint.storage.pvc.create.whenDeleted.

Checkpoints of a long training are worth more than the job object: by default (Retain) the claim has
no owner reference, so neither `kubectl delete tj` nor ttlSecondsAfterFinished nor the garbage
collector deletes it, and a new job resumes from it (by claimName, or by having the same name). With
Delete it is owned by the job, and goes with it. This is how StatefulSet's
persistentVolumeClaimRetentionPolicy works: deletion follows the owner references, which the
controller keeps in line with the policy.

A retained claim is found again by what it says about itself: its name (<job>-checkpoints) and the
labels the operator puts on everything it creates (`training-job`, `app.kubernetes.io/managed-by`).
A job reuses such a claim as it is (a job with the same name, created again); one owned by another
object is not the job's to use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from builders.meta import object_meta
from builders.names import pvc_name
from builders.storage import checkpoint_storage
from crd import contract
from crd.spec import TrainingJob


def build_checkpoint_pvc(job: TrainingJob) -> dict[str, Any] | None:
    """The claim to create for a defaulted job, or None when the job does not need one."""
    storage = checkpoint_storage(job)
    if storage is None or not storage.creates_claim:
        return None
    create = job.spec.checkpoint.storage["pvc"]["create"]
    claim_spec: dict[str, Any] = {
        "accessModes": list(create["accessModes"]),
        "resources": {"requests": {"storage": str(create["size"])}},
    }
    if create.get("storageClassName"):
        claim_spec["storageClassName"] = create["storageClassName"]
    metadata = object_meta(job, pvc_name(job))
    if storage.retains_claim:
        del metadata["ownerReferences"]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": claim_spec}


def reusable_claim(job_name: str, claim: Mapping[str, Any]) -> bool:
    """Whether `claim` is the checkpoint claim the operator made for a job named `job_name` (this one,
    or an earlier one of the same name) and nothing else controls it."""
    metadata = claim.get("metadata") or {}
    labels = metadata.get("labels") or {}
    return (
        claim.get("kind", "PersistentVolumeClaim") == "PersistentVolumeClaim"
        and metadata.get("name") == f"{job_name}{contract.CHECKPOINTS_SUFFIX}"
        and labels.get(contract.JOB_NAME_LABEL) == job_name
        and labels.get(contract.MANAGED_BY_LABEL) == contract.MANAGED_BY_VALUE
        and not any(owner.get("controller") for owner in metadata.get("ownerReferences") or [])
    )


def release_claim_patch(job: TrainingJob, claim: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that takes the job's owner reference off a claim it must retain (one created
    owned, before whenDeleted existed), or None when there is nothing to change."""
    storage = checkpoint_storage(job)
    if storage is None or not storage.retains_claim:
        return None
    owners = claim.get("metadata", {}).get("ownerReferences") or []
    kept = [owner for owner in owners if owner.get("uid") != job.uid]
    if len(kept) == len(owners):
        return None
    return {"metadata": {"ownerReferences": kept}}
