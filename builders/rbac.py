"""Per-job identity for the workers: a ServiceAccount allowed to read and patch only the job's pods.

Rank 0 reports progress by patching an annotation on its own Pod (crd.contract.PROGRESS_ANNOTATION);
nothing else in the cluster is reachable with this account. The Role lists the job's pod names, so
the controller updates it when numWorkers changes. Not created when spec.serviceAccountName is set.
"""

from __future__ import annotations

from typing import Any

from builders.meta import object_meta
from builders.names import pod_names, role_binding_name, role_name, service_account_name
from crd.spec import TrainingJob


def build_service_account(job: TrainingJob) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_meta(job, service_account_name(job)),
    }


def build_role(job: TrainingJob) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": object_meta(job, role_name(job)),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "resourceNames": pod_names(job),
                "verbs": ["get", "patch"],
            }
        ],
    }


def build_role_binding(job: TrainingJob) -> dict[str, Any]:
    meta = object_meta(job, role_binding_name(job))
    subject = {"kind": "ServiceAccount", "name": service_account_name(job)}
    if "namespace" in meta:
        subject["namespace"] = meta["namespace"]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name(job)},
        "subjects": [subject],
    }


def build_rbac(job: TrainingJob) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding, in creation order; empty when the job brings its own account."""
    if job.spec.service_account_name:
        return []
    return [build_service_account(job), build_role(job), build_role_binding(job)]
