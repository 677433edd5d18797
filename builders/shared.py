"""What every TrainingJob of a namespace shares: the trainers' identity and the reference trainer.

Why shared: a per-job ServiceAccount, Role and RoleBinding, and a per-job copy of the trainer's
sources, were four objects (and tens of KiB) per job for things that do not depend on the job. Now:

- the ServiceAccount `trainingjob-trainer` runs every worker of a job without spec.serviceAccountName.
  A RoleBinding of the same name grants it the ClusterRole `trainingjob-trainer`
  (crd/trainer-clusterrole.yaml): `patch` on the namespace's pods, which RBAC cannot narrow to "the
  caller's own pod"; the ValidatingAdmissionPolicy of crd/trainer-progress-policy.yaml does: a
  trainer's token is bound to its pod, the API server puts that pod's name and UID into the request's
  user, and the policy lets the request through only for that pod and only for a change of the
  progress annotation (no labels, no other annotation, no spec). No `get`: the pods of other jobs stay
  unreadable to trainers. The operator binds that one ClusterRole (it holds `bind` on it by name) and
  never writes a Role; it leaves the RoleBinding out while the policy is missing
  (controller/planner/guards.py).
- the ConfigMap `trainingjob-trainer-<hash>` holds the reference trainer (train.py and the package
  reference_trainer) and the progress helper (the package trainingjob_progress),
  builders.configmap.TRAINER_FILES. Its name carries a hash of their paths and content, so an operator
  with other sources makes a new one and never changes the files under a running pod. The pod mounts
  them at /etc/trainingjob, each file at its path (builders/configmap.py).

They have no owner (no single job owns them): the operator creates what a job needs before its pods,
and deletes a namespace's shared objects once its last TrainingJob is gone (controller/reconciler.py).
"""

from __future__ import annotations

from typing import Any

from builders.configmap import build_trainer_sources
from builders.meta import shared_meta
from crd import contract
from crd.spec import TrainingJob


def build_service_account(job: TrainingJob) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": shared_meta(job, contract.TRAINER_ACCOUNT),
    }


def build_role_binding(job: TrainingJob) -> dict[str, Any]:
    """The namespace's trainer account bound to the shipped ClusterRole (crd/trainer-clusterrole.yaml)."""
    meta = shared_meta(job, contract.TRAINER_ACCOUNT)
    subject = {"kind": "ServiceAccount", "name": contract.TRAINER_ACCOUNT}
    if "namespace" in meta:
        subject["namespace"] = meta["namespace"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": contract.TRAINER_CLUSTER_ROLE,
        },
        "subjects": [subject],
    }


def build_rbac(job: TrainingJob, *, trainer_rights: bool = True) -> list[dict[str, Any]]:
    """The trainers' ServiceAccount and, unless `trainer_rights` is False (the admission policy that
    narrows them is missing), its RoleBinding, in creation order; empty when the job brings its own
    account."""
    if job.spec.service_account_name:
        return []
    if not trainer_rights:
        return [build_service_account(job)]
    return [build_service_account(job), build_role_binding(job)]


def build_shared(job: TrainingJob, *, trainer_rights: bool = True) -> list[dict[str, Any]]:
    """The namespace's shared objects this job needs, in creation order (see `build_rbac`)."""
    return [build_trainer_sources(job), *build_rbac(job, trainer_rights=trainer_rights)]


def is_shared(obj: dict[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return (
        labels.get(contract.COMPONENT_LABEL) == contract.SHARED_COMPONENT
        and labels.get(contract.MANAGED_BY_LABEL) == contract.MANAGED_BY_VALUE
    )
