"""The Kubernetes API as the operator uses it: every resource it watches, creates or deletes, how it
finds out which optional APIs (a gang scheduler's PodGroups, Kueue) the cluster serves, and the client
it connects with.

One catalogue, so that the watches (controller/watches.py), the writes (controller/executor.py) and
the RBAC the operator is deployed with (deploy/) can be checked against a single list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Final

from builders.podgroup import GangScheduler
from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError, NotFound
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
    SECRETS,
    SERVICEACCOUNTS,
    SERVICES,
    SUBJECTACCESSREVIEWS,
    TOKENREVIEWS,
    Resource,
)
from controller.runtime.transport import DEFAULT_POOL_SIZE, RestMetrics
from crd import contract

__all__ = [
    "ADMISSION_POLICIES",
    "ADMISSION_POLICY_BINDINGS",
    "CONFIGMAPS",
    "CRDS",
    "CREATED_ONLY",
    "EVENTS",
    "GUARD_POLICIES",
    "LEASES",
    "MULTIKUEUE_CLUSTERS",
    "NAMED",
    "NAMESPACES",
    "NODES",
    "OWNED",
    "PODS",
    "POD_GROUPS",
    "PRIORITYCLASSES",
    "PVCS",
    "RESOURCE_FLAVORS",
    "REVIEWS",
    "ROLEBINDINGS",
    "SECRETS",
    "SERVICEACCOUNTS",
    "SERVICES",
    "SUBJECTACCESSREVIEWS",
    "TOKENREVIEWS",
    "TRAININGJOBS",
    "WORKLOADS",
    "WORKLOAD_PRIORITY_CLASSES",
    "Apis",
    "Resource",
    "discover",
    "follow_answers",
    "from_kubeconfig",
    "name_selector",
    "resource_for",
]

TRAININGJOBS: Final = Resource(contract.GROUP, contract.VERSION, contract.PLURAL, contract.KIND)

# The objects a TrainingJob owns besides its pods (builders/), watched so that a deleted or changed
# one is repaired; each is created through the resource of its kind. (No Roles: the trainers' rights
# are a ClusterRole shipped in crd/, which the operator binds per namespace; builders/shared.py.)
OWNED: Final = (SERVICES, CONFIGMAPS, SERVICEACCOUNTS, ROLEBINDINGS, PVCS)

# The kinds of those objects that only ever have one name (the namespace's trainer account and its
# RoleBinding): their informers ask for that name alone, with a field selector, which is what lets the
# deployed RBAC grant list, watch, get, patch and delete on them by resourceNames (deploy/).
NAMED: Final[Mapping[str, str]] = {
    SERVICEACCOUNTS.kind: contract.TRAINER_ACCOUNT,
    ROLEBINDINGS.kind: contract.TRAINER_ACCOUNT,
}


def name_selector(name: str) -> str:
    """The field selector of one object by name; the API server authorizes a list or a watch that carries
    it as a request for that name, so resourceNames in RBAC apply to it."""
    return f"metadata.name={name}"


# The admission policies the operator's guarantees rest on (crd/), each with a binding of its name: the
# operator watches them by name (controller/guards_watch.py) and withholds what each guards while it is
# missing (controller/planner/guards.py).
GUARD_POLICIES: Final = (contract.TRAINER_POLICY, contract.ESCALATION_POLICY)
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
# Volcano's Queues (cluster-scoped), watched while Volcano is the gang scheduler: a job's pods wait while
# its queue does not exist or is not open (controller/volcano_watches.py).
VOLCANO_QUEUES: Final = Resource("scheduling.volcano.sh", "v1beta1", "queues", "Queue", namespaced=False)
# --gang-scheduler: which gang scheduler the operator uses when the cluster serves both PodGroup APIs,
# or the only one it uses; auto prefers scheduler-plugins.
GANG_SCHEDULER_CHOICES: Final[Mapping[str, tuple[GangScheduler, ...]]] = {
    "auto": (contract.GANG_COSCHEDULING, contract.GANG_VOLCANO),
    contract.GANG_COSCHEDULING: (contract.GANG_COSCHEDULING,),
    contract.GANG_VOLCANO: (contract.GANG_VOLCANO,),
}


# Kueue (docs/shared-clusters.md): the job's Workload, and what its priority and its admission's
# placement are read from.
WORKLOADS: Final = Resource(contract.KUEUE_GROUP, contract.KUEUE_VERSION, "workloads", "Workload")
RESOURCE_FLAVORS: Final = Resource(
    contract.KUEUE_GROUP, contract.KUEUE_VERSION, "resourceflavors", "ResourceFlavor", namespaced=False
)
WORKLOAD_PRIORITY_CLASSES: Final = Resource(
    contract.KUEUE_GROUP,
    contract.KUEUE_VERSION,
    "workloadpriorityclasses",
    "WorkloadPriorityClass",
    namespaced=False,
)
KUEUE: Final = (WORKLOADS, RESOURCE_FLAVORS, WORKLOAD_PRIORITY_CLASSES)
# MultiKueue's worker clusters: whether the one running a dispatched job's copy is reachable.
MULTIKUEUE_CLUSTERS: Final = Resource(
    contract.KUEUE_GROUP, contract.KUEUE_VERSION, "multikueueclusters", "MultiKueueCluster", namespaced=False
)

# What the metrics endpoint asks the API server of each requester (controller/runtime/authfilter.py):
# who its token belongs to, and whether that user may get /metrics. Created only, cluster-scoped.
REVIEWS: Final = (TOKENREVIEWS, SUBJECTACCESSREVIEWS)
# Secrets: an MPI job's SSH key, created only (never read, listed or watched: planner/transitions.py).
CREATED_ONLY: Final = (SECRETS,)
_BY_KIND: Final[Mapping[str, Resource]] = {
    resource.kind: resource for resource in (PODS, *OWNED, *CREATED_ONLY, WORKLOADS)
}


def resource_for(api_version: str, kind: str) -> Resource:
    """The resource to create or patch an object of `kind` through (PodGroups by their API group)."""
    if kind == "PodGroup":
        return next(resource for resource in POD_GROUPS.values() if resource.api_version == api_version)
    return _BY_KIND[kind]


@dataclass(frozen=True)
class Apis:
    """The optional APIs the cluster serves: a gang scheduler's PodGroups (the first of --gang-scheduler's
    choices served: scheduler-plugins before Volcano by default), and Kueue's Workloads,
    ResourceFlavors and WorkloadPriorityClasses."""

    gang_scheduler: GangScheduler | None = None
    kueue: bool = False


def _served(client: KubeClient, resources: tuple[Resource, ...]) -> bool | None:
    """Whether the group-version of `resources` serves them all; None when discovery did not answer
    (an unreachable API server is not an uninstalled API)."""
    try:
        listing = client.request("GET", f"/apis/{resources[0].api_version}")
    except NotFound:
        return False
    except KubeError:
        return None
    names = {entry.get("name") for entry in listing.get("resources", [])}
    return all(resource.plural in names for resource in resources)


def follow_answers(
    known: Apis,
    pod_groups: Mapping[GangScheduler, bool | None],
    kueue: bool | None,
    preference: tuple[GangScheduler, ...] = GANG_SCHEDULER_CHOICES["auto"],
) -> Apis:
    """The optional APIs served, from discovery's answers (None: no answer). A gang scheduler is chosen
    only when every PodGroup API of `preference` answered (the first served of them); whatever did not
    answer keeps its `known` (last) value, since an unreachable API server is not an uninstalled API."""
    gang_scheduler = known.gang_scheduler
    if all(pod_groups.get(scheduler) is not None for scheduler in preference):
        gang_scheduler = next((scheduler for scheduler in preference if pod_groups.get(scheduler)), None)
    return Apis(gang_scheduler, known.kueue if kueue is None else kueue)


def discover(
    client: KubeClient,
    known: Apis = Apis(),
    preference: tuple[GangScheduler, ...] = GANG_SCHEDULER_CHOICES["auto"],
) -> Apis:
    """Asks the API server's discovery which optional APIs it serves (follow_answers decides)."""
    pod_groups = {scheduler: _served(client, (POD_GROUPS[scheduler],)) for scheduler in preference}
    return follow_answers(known, pod_groups, _served(client, KUEUE), preference)


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
    fast_http_client: bool = True,
) -> KubeClient:
    """A client of the cluster named by `path` (else in-cluster, else the default kubeconfig) that
    introduces itself as the operator (see `controller.runtime.kubeconfig.from_kubeconfig`)."""
    return _client_from_kubeconfig(
        path,
        context,
        qps,
        burst,
        user_agent=user_agent(),
        pool_size=pool_size,
        metrics=metrics,
        fast_http_client=fast_http_client,
    )
