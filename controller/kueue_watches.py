"""What the operator watches of Kueue while the cluster serves its API, and what a reconcile reads of it.

Started by discovery (controller/discovery.py) when Kueue's API appears, stopped when it goes:

- the jobs' Workloads, selected by the operator's label like every object it makes; a change or a
  delete wakes the job that owns the Workload (Kueue admitted, evicted or requeued it);
- ResourceFlavors (their node labels and tolerations go on admitted pods), WorkloadPriorityClasses
  and PriorityClasses (a Workload's priority), MultiKueueClusters (whether the worker running a
  dispatched job is reachable), cluster-wide, each cached as only what the planner reads. A change
  to one wakes every queued job: any of them may be waiting for it.

`queueing()` is the snapshot a reconcile hands the planner (`planner.Queueing`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controller.planner.model import Queueing
from controller.resources import (
    MULTIKUEUE_CLUSTERS,
    PRIORITYCLASSES,
    RESOURCE_FLAVORS,
    WORKLOAD_PRIORITY_CLASSES,
    WORKLOADS,
)
from controller.runtime.informer import Informer
from controller.runtime.resource import Resource
from controller.watches import Watches
from crd import contract

JsonDict = dict[str, Any]


def _metadata(obj: JsonDict) -> JsonDict:
    meta = obj.get("metadata") or {}
    return {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion")}


def flavor_essentials(flavor: JsonDict) -> JsonDict:
    """All the operator keeps of a ResourceFlavor: what goes on the pods admitted into it."""
    spec = flavor.get("spec") or {}
    kept = {key: spec[key] for key in ("nodeLabels", "tolerations") if key in spec}
    return {
        "apiVersion": flavor.get("apiVersion"),
        "kind": flavor.get("kind"),
        "metadata": _metadata(flavor),
        "spec": kept,
    }


def priority_essentials(priority_class: JsonDict) -> JsonDict:
    """All the operator keeps of a (Workload)PriorityClass: its value, and whether it is the default."""
    kept: JsonDict = {key: priority_class[key] for key in ("value", "globalDefault") if key in priority_class}
    return {
        "apiVersion": priority_class.get("apiVersion"),
        "kind": priority_class.get("kind"),
        "metadata": _metadata(priority_class),
        **kept,
    }


def cluster_essentials(cluster: JsonDict) -> JsonDict:
    """All the operator keeps of a MultiKueueCluster: its Active condition (planner/multikueue.py)."""
    conditions = (cluster.get("status") or {}).get("conditions") or []
    active = [
        dict(entry) for entry in conditions if isinstance(entry, dict) and entry.get("type") == "Active"
    ]
    return {
        "apiVersion": cluster.get("apiVersion"),
        "kind": cluster.get("kind"),
        "metadata": _metadata(cluster),
        "status": {
            "conditions": [
                {key: entry.get(key) for key in ("type", "status", "reason", "message")} for entry in active
            ]
        },
    }


def queued(job: JsonDict) -> bool:
    return bool(((job.get("metadata") or {}).get("labels") or {}).get(contract.QUEUE_NAME_LABEL))


class KueueWatch:
    """The informers of Kueue's objects and the PriorityClasses, built without I/O."""

    def __init__(self, watches: Watches) -> None:
        self.workloads = watches.watch_owned(WORKLOADS, optional=True)
        self.flavors = self._cluster_wide(watches, RESOURCE_FLAVORS, flavor_essentials)
        self.workload_priority_classes = self._cluster_wide(
            watches, WORKLOAD_PRIORITY_CLASSES, priority_essentials
        )
        self.priority_classes = self._cluster_wide(watches, PRIORITYCLASSES, priority_essentials)
        self.multikueue_clusters = self._cluster_wide(watches, MULTIKUEUE_CLUSTERS, cluster_essentials)

    @staticmethod
    def _cluster_wide(
        watches: Watches, resource: Resource, transform: Callable[[JsonDict], JsonDict]
    ) -> Informer:
        informer = watches.informer(
            resource, label_selector=None, cluster=True, transform=transform, optional=True
        )

        def wake(_obj: JsonDict) -> None:
            watches.wake_jobs(queued)

        def changed(old: JsonDict, new: JsonDict) -> None:
            if {**old, "metadata": None} != {**new, "metadata": None}:
                wake(new)

        informer.add_handler(on_add=wake, on_update=changed, on_delete=wake)
        return informer

    @property
    def informers(self) -> list[Informer]:
        return [
            self.workloads,
            self.flavors,
            self.workload_priority_classes,
            self.priority_classes,
            self.multikueue_clusters,
        ]

    def synced(self) -> bool:
        return all(informer.has_synced() for informer in self.informers)

    def queueing(self) -> Queueing:
        def by_name(informer: Informer) -> dict[str, JsonDict]:
            return {str(obj["metadata"]["name"]): obj for obj in informer.store.list()}

        return Queueing(
            flavors=by_name(self.flavors),
            priority_classes=by_name(self.priority_classes),
            workload_priority_classes=by_name(self.workload_priority_classes),
            multikueue_clusters=by_name(self.multikueue_clusters),
        )
