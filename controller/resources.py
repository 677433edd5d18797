"""The Kubernetes API as the operator uses it: every resource it watches, creates or deletes, how it
finds out which gang scheduler the cluster runs, and the client it connects with.

One catalogue, so that the watches (controller/watches.py), the writes (controller/executor.py) and
the RBAC the operator is deployed with (deploy/) can be checked against a single list.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Final

from builders.podgroup import GangScheduler
from controller.runtime.client import DEFAULT_POOL_SIZE, KubeClient, RestMetrics
from controller.runtime.errors import KubeError
from controller.runtime.kubeconfig import from_kubeconfig as _client_from_kubeconfig
from controller.runtime.resource import (
    CONFIGMAPS,
    CRDS,
    EVENTS,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITYCLASSES,
    PVCS,
    ROLEBINDINGS,
    ROLES,
    SECRETS,
    SERVICEACCOUNTS,
    SERVICES,
    Resource,
)
from crd import contract

__all__ = [
    "ADMISSION_POLICIES",
    "ADMISSION_POLICY_BINDINGS",
    "CONFIGMAPS",
    "CRDS",
    "EVENTS",
    "LEASES",
    "NAMESPACES",
    "NODES",
    "OWNED",
    "PODS",
    "POD_GROUPS",
    "PRIORITYCLASSES",
    "PVCS",
    "ROLEBINDINGS",
    "ROLES",
    "SECRETS",
    "SERVICEACCOUNTS",
    "SERVICES",
    "TRAININGJOBS",
    "Resource",
    "detect_gang_scheduler",
    "from_kubeconfig",
    "resource_for",
]

TRAININGJOBS: Final = Resource(contract.GROUP, contract.VERSION, contract.PLURAL, contract.KIND)

# The objects a TrainingJob owns besides its pods (builders/), watched so that a deleted or changed
# one is repaired; each is created through the resource of its kind.
OWNED: Final = (SERVICES, CONFIGMAPS, SERVICEACCOUNTS, ROLES, ROLEBINDINGS, PVCS)
_BY_KIND: Final[Mapping[str, Resource]] = {resource.kind: resource for resource in (PODS, *OWNED)}

# The trainers' admission policy (crd/) and its binding, checked at start-up (controller/preflight.py).
ADMISSION_POLICIES: Final = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", False
)
ADMISSION_POLICY_BINDINGS: Final = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding",
    False,
)

# The PodGroup API of each gang scheduler, by the apiVersion its PodGroups are built with.
POD_GROUPS: Final[Mapping[GangScheduler, Resource]] = {
    contract.GANG_COSCHEDULING: Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup"),
    contract.GANG_VOLCANO: Resource("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup"),
}


def resource_for(api_version: str, kind: str) -> Resource:
    """The resource to create or patch an object of `kind` through (PodGroups by their API group)."""
    if kind == "PodGroup":
        return next(resource for resource in POD_GROUPS.values() if resource.api_version == api_version)
    return _BY_KIND[kind]


def detect_gang_scheduler(client: KubeClient) -> GangScheduler | None:
    """Which gang scheduler's PodGroup API the cluster serves (discovery), preferring scheduler-plugins."""
    for scheduler, resource in POD_GROUPS.items():
        try:
            listing = client.request("GET", f"/apis/{resource.api_version}")
        except KubeError:
            continue
        if any(entry.get("name") == resource.plural for entry in listing.get("resources", [])):
            return scheduler
    return None


def user_agent() -> str:
    """`trainingjob-operator/<version>`: how the API server's audit log and field managers name us."""
    try:
        installed = version(contract.OPERATOR_NAME)
    except PackageNotFoundError:
        installed = "dev"
    return f"{contract.OPERATOR_NAME}/{installed}"


def from_kubeconfig(
    path: str | None = None,
    context: str | None = None,
    qps: float = 20.0,
    burst: int = 30,
    *,
    pool_size: int = DEFAULT_POOL_SIZE,
    metrics: RestMetrics | None = None,
) -> KubeClient:
    """A client of the cluster named by `path` (else in-cluster, else the default kubeconfig) that
    introduces itself as the operator (see `controller.runtime.kubeconfig.from_kubeconfig`)."""
    return _client_from_kubeconfig(
        path, context, qps, burst, user_agent=user_agent(), pool_size=pool_size, metrics=metrics
    )
