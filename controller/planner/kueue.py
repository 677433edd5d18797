"""Kueue's objects as the planner reads them: a job's Workload, its priority, its admission's placement.

A Workload is Kueue's JSON; decisions need a few facts from it (is quota reserved, is it admitted,
was it evicted and why, where was it admitted, what does it ask for). `WorkloadView` reads them once.
The Workload's priority comes from classes Kueue does not resolve for a kind it does not know:
`workload_priority` does, as Kueue's integrations do (a WorkloadPriorityClass label, else the pods'
PriorityClass, else the cluster's default PriorityClass, else 0). `placement` turns an admission
into the node labels and tolerations of the flavors it assigned, and with topology-aware scheduling
the domain (node) of each pod (builders/placement.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from builders.placement import Placement
from builders.workload import WorkloadPriority, pod_set, workload_name
from controller.planner.model import Queueing
from crd import contract
from crd.spec import TrainingJob

JsonDict = dict[str, Any]
Condition = Mapping[str, Any]


@dataclass(frozen=True)
class WorkloadView:
    """One Workload as the cache shows it."""

    raw: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.raw["metadata"]["name"])

    @property
    def uid(self) -> str:
        return str(self.raw["metadata"].get("uid", ""))

    @property
    def resource_version(self) -> str:
        return str(self.raw["metadata"].get("resourceVersion", ""))

    @property
    def deleting(self) -> bool:
        return bool(self.raw["metadata"].get("deletionTimestamp"))

    @property
    def spec(self) -> Mapping[str, Any]:
        spec = self.raw.get("spec")
        return spec if isinstance(spec, Mapping) else {}

    @property
    def status(self) -> Mapping[str, Any]:
        status = self.raw.get("status")
        return status if isinstance(status, Mapping) else {}

    @property
    def active(self) -> bool:
        return self.spec.get("active") is not False

    def condition(self, type_: str) -> Condition | None:
        for entry in self.status.get("conditions") or []:
            if isinstance(entry, Mapping) and entry.get("type") == type_:
                return entry
        return None

    def holds(self, type_: str) -> bool:
        entry = self.condition(type_)
        return entry is not None and entry.get("status") == "True"

    @property
    def reserved(self) -> bool:
        """Quota is reserved in a ClusterQueue (the admission is set, and counted against the quota)."""
        return self.holds("QuotaReserved")

    @property
    def admitted(self) -> bool:
        """Quota reserved and every admission check ready: the job may run."""
        return self.holds("Admitted") and self.reserved

    @property
    def finished(self) -> bool:
        return self.holds("Finished")

    @property
    def evicted(self) -> Condition | None:
        """The Evicted condition while it holds (preemption, deactivation, a stopped queue, ...)."""
        entry = self.condition("Evicted")
        return entry if entry is not None and entry.get("status") == "True" else None

    @property
    def cluster_queue(self) -> str:
        admission = self.status.get("admission") or {}
        return str(admission.get("clusterQueue") or "")

    def assignment(self) -> Mapping[str, Any]:
        """The admission's assignment for the workers pod set."""
        admission = self.status.get("admission") or {}
        for entry in admission.get("podSetAssignments") or []:
            if isinstance(entry, Mapping) and entry.get("name") == contract.WORKLOAD_POD_SET:
                return entry
        return {}

    @property
    def flavors(self) -> dict[str, str]:
        """Resource name -> the ResourceFlavor assigned to it."""
        flavors = self.assignment().get("flavors") or {}
        return {str(resource): str(flavor) for resource, flavor in flavors.items()}

    def pod_set_updates(self) -> list[Mapping[str, Any]]:
        """What the admission checks ask to add to the workers' pods."""
        updates: list[Mapping[str, Any]] = []
        for check in self.status.get("admissionChecks") or []:
            for update in (check or {}).get("podSetUpdates") or []:
                if isinstance(update, Mapping) and update.get("name") == contract.WORKLOAD_POD_SET:
                    updates.append(update)
        return updates

    @property
    def pod_set(self) -> Mapping[str, Any]:
        pod_sets = self.spec.get("podSets") or []
        first = pod_sets[0] if pod_sets else {}
        return first if isinstance(first, Mapping) else {}

    def checks_pending(self) -> list[str]:
        """Admission checks not Ready yet, as `name (state): message`."""
        pending = []
        for check in self.status.get("admissionChecks") or []:
            if isinstance(check, Mapping) and check.get("state") != "Ready":
                message = f": {check['message']}" if check.get("message") else ""
                pending.append(f"{check.get('name')} ({check.get('state')}){message}")
        return pending


def workloads_of(owned: Mapping[tuple[str, str], JsonDict]) -> list[WorkloadView]:
    return [WorkloadView(obj) for (kind, _), obj in sorted(owned.items()) if kind == "Workload"]


def current_workload(job: TrainingJob, owned: Mapping[tuple[str, str], JsonDict]) -> WorkloadView | None:
    """The job's Workload (by the name the operator gives it), as the cache shows it."""
    found = owned.get(("Workload", workload_name(job)))
    return WorkloadView(found) if found is not None else None


def _requests(pod_set_: Mapping[str, Any]) -> list[tuple[str, Any]]:
    spec = (pod_set_.get("template") or {}).get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    return sorted(
        (str(c.get("name")), c.get("resources") or {}) for c in containers if isinstance(c, Mapping)
    )


def asks_for_other_pods(job: TrainingJob, workload: WorkloadView) -> str | None:
    """What the job asks for now that its Workload does not (another count, other requests), or None.
    Only this makes an admitted Workload stale: the rest of the pod set (node selector, tolerations)
    matters to the next admission, not to pods already running."""
    wanted = pod_set(job)
    count = workload.pod_set.get("count")
    if count != wanted["count"]:
        return f"numWorkers changed from {count} to {wanted['count']}"
    if _requests(workload.pod_set) != _requests(wanted):
        return "the pods' resource requests changed"
    return None


# ------------------------------------------------------------------------------------- priority


def _value(obj: Mapping[str, Any]) -> int:
    value = obj.get("value")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def workload_priority(job: TrainingJob, kueue: Queueing) -> WorkloadPriority | str:
    """The Workload's priority, or what is missing to know it (a class that does not exist)."""
    wanted = job.workload_priority_class
    if wanted:
        found = kueue.workload_priority_classes.get(wanted)
        if found is None:
            return (
                f"WorkloadPriorityClass {wanted} (label {contract.WORKLOAD_PRIORITY_CLASS_LABEL}) not found"
            )
        return WorkloadPriority(wanted, contract.WORKLOAD_PRIORITY_CLASS_REF, _value(found))
    pod_class = job.spec.scheduling.priority
    if pod_class:
        found = kueue.priority_classes.get(pod_class)
        if found is None:
            return f"PriorityClass {pod_class} (spec.scheduling.priority) not found"
        return WorkloadPriority(pod_class, contract.POD_PRIORITY_CLASS_REF, _value(found))
    defaults = sorted(
        (_value(obj), name)
        for name, obj in kueue.priority_classes.items()
        if obj.get("globalDefault") is True
    )
    if defaults:
        value, name = defaults[0]
        return WorkloadPriority(name, contract.POD_PRIORITY_CLASS_REF, value)
    return WorkloadPriority(None, None, 0)


# ------------------------------------------------------------------------------------ placement


def placement(workload: WorkloadView, kueue: Queueing) -> Placement | str:
    """What the admission adds to the pods, or the name of an assigned ResourceFlavor not in the cache."""
    node_selector: dict[str, str] = {}
    tolerations: list[Mapping[str, Any]] = []
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for name in sorted(set(workload.flavors.values())):
        flavor = kueue.flavors.get(name)
        if flavor is None:
            return name
        spec = flavor.get("spec") or {}
        node_selector.update(spec.get("nodeLabels") or {})
        tolerations.extend(spec.get("tolerations") or [])
    for update in workload.pod_set_updates():
        node_selector.update(update.get("nodeSelector") or {})
        tolerations.extend(update.get("tolerations") or [])
        labels.update(update.get("labels") or {})
        annotations.update(update.get("annotations") or {})
    annotations.update(topology_annotations(workload.pod_set))
    slots = slot_node_selectors(workload.assignment().get("topologyAssignment"))
    return Placement(node_selector, tuple(tolerations), labels, annotations, slots)


def topology_annotations(pod_set_: Mapping[str, Any]) -> dict[str, str]:
    """The pod-set annotation of Kueue's TAS for the pod set's topology request (none without one):
    on the pods, it makes Kueue count them as the Topology's own, not as other use of the nodes."""
    request = pod_set_.get("topologyRequest") or {}
    if request.get("required"):
        return {contract.PODSET_REQUIRED_TOPOLOGY_ANNOTATION: str(request["required"])}
    if request.get("preferred"):
        return {contract.PODSET_PREFERRED_TOPOLOGY_ANNOTATION: str(request["preferred"])}
    return {}


def slot_node_selectors(assignment: Any) -> tuple[dict[str, str], ...]:
    """The node labels of the topology domain of each pod of the pod set, in order, from Kueue's
    topologyAssignment (v1beta2: `levels`, and `slices` of `domainCount` domains, each level's values
    one `universal` value or `individual` roots between a prefix and a suffix, and the pods per
    domain, `universal` or `individual`): a domain's pods take the next slots."""
    if not isinstance(assignment, Mapping):
        return ()
    levels = [str(level) for level in assignment.get("levels") or []]
    selectors: list[dict[str, str]] = []
    for part in assignment.get("slices") or []:
        if not isinstance(part, Mapping):
            continue
        domains = int(part.get("domainCount") or 0)
        values = [_level_values(entry, domains) for entry in part.get("valuesPerLevel") or []]
        counts = _pod_counts(part.get("podCounts") or {}, domains)
        for index in range(domains):
            selector = {
                level: level_values[index] for level, level_values in zip(levels, values, strict=False)
            }
            selectors.extend(dict(selector) for _ in range(counts[index]))
    return tuple(selectors)


def _level_values(entry: Mapping[str, Any], domains: int) -> list[str]:
    if entry.get("universal") is not None:
        return [str(entry["universal"])] * domains
    individual = entry.get("individual") or {}
    prefix, suffix = str(individual.get("prefix") or ""), str(individual.get("suffix") or "")
    roots = [f"{prefix}{root}{suffix}" for root in individual.get("roots") or []]
    return (roots + [""] * domains)[:domains]


def _pod_counts(counts: Mapping[str, Any], domains: int) -> list[int]:
    if counts.get("universal") is not None:
        return [int(counts["universal"])] * domains
    individual = [int(count) for count in counts.get("individual") or []]
    return (individual + [0] * domains)[:domains]


def admitted_placement(
    job: TrainingJob, kueue: Queueing | None, owned: Mapping[tuple[str, str], JsonDict]
) -> Placement | None:
    """The placement of a queued job's current admission (None for a job Kueue does not queue)."""
    if job.queue_name is None or kueue is None:
        return None
    workload = current_workload(job, owned)
    if workload is None or not workload.admitted:
        return None
    found = placement(workload, kueue)
    return found if isinstance(found, Placement) else None
