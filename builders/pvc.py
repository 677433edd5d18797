"""The checkpoint PersistentVolumeClaim the operator creates when a job asks for pvc storage without
naming an existing claim. It is owned by the job, so it (and the checkpoints) go when the job is deleted.
"""

from __future__ import annotations

from typing import Any

from builders.meta import object_meta
from builders.names import pvc_name
from builders.storage import checkpoint_storage
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
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": object_meta(job, pvc_name(job)),
        "spec": claim_spec,
    }
