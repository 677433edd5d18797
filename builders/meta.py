"""Labels, owner references and object metadata shared by every object the operator creates.

Every object of one job carries the same two labels (so informers select them and users can find
them with `kubectl get all -l training-job=<job>`) and a controller ownerReference to its TrainingJob
(so the garbage collector deletes them with the job and the controller maps events back to the job).
The objects a namespace's jobs share get `shared_meta`: the operator's labels, no job, no owner.
"""

from __future__ import annotations

from typing import Any

from crd import contract
from crd.spec import TrainingJob


def common_labels(job: TrainingJob) -> dict[str, str]:
    """The labels of every object of the job."""
    return {
        contract.JOB_NAME_LABEL: job.name,
        contract.MANAGED_BY_LABEL: contract.MANAGED_BY_VALUE,
    }


def selector_labels(job: TrainingJob) -> dict[str, str]:
    """The labels that select the job's pods: the labels every object of the job carries."""
    return common_labels(job)


def owner_reference(job: TrainingJob) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(
    job: TrainingJob,
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if job.namespace:
        meta["namespace"] = job.namespace
    meta["labels"] = {**common_labels(job), **(labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    meta["ownerReferences"] = [owner_reference(job)]
    return meta


def shared_meta(job: TrainingJob, name: str) -> dict[str, Any]:
    """Metadata of an object every job of the namespace uses: the operator's labels and the shared
    component's, no job label and no owner (builders/shared.py says who deletes it)."""
    meta: dict[str, Any] = {"name": name}
    if job.namespace:
        meta["namespace"] = job.namespace
    meta["labels"] = {
        contract.MANAGED_BY_LABEL: contract.MANAGED_BY_VALUE,
        contract.APP_NAME_LABEL: contract.APP_NAME_VALUE,
        contract.COMPONENT_LABEL: contract.SHARED_COMPONENT,
    }
    return meta
