"""Kueue in the fake world of lifecycle_world.py: what its controllers write on a job's Workload.

`KueueWorld` holds the ResourceFlavors and priority classes the operator's caches would, and plays
Kueue's scheduler and workload controller on the Workload the operator created: reserve quota and
admit it into a flavor, keep it pending for quota or as inadmissible, evict it (preemption,
deactivation). The conditions and admission written are the ones Kueue v0.17 writes (reasons,
messages, fields), so the planner is tested against the shapes it meets on a cluster.
"""

from __future__ import annotations

from typing import Any

from builders.workload import workload_name
from controller.planner.model import Queueing
from controller.runtime.clock import rfc3339
from crd import contract
from crd.spec import parse
from tests.unit.lifecycle_world import World, make_job

JsonDict = dict[str, Any]

QUEUE = "team-a"
CLUSTER_QUEUE = "gpus"
FLAVOR = "a100"
FLAVOR_LABELS = {"gpu-type": "a100"}
FLAVOR_TOLERATION = {"key": "gpu-type", "operator": "Equal", "value": "a100", "effect": "NoSchedule"}
QUOTA_MESSAGE = (
    "couldn't assign flavors to pod set workers: insufficient unused quota for nvidia.com/gpu in flavor "
    "a100, 2 more needed"
)
PREEMPTED = (
    "Preempted to accommodate a workload (UID: 0b1c, JobUID: 9f8e) due to prioritization in the ClusterQueue"
)


def flavor(name: str = FLAVOR) -> JsonDict:
    return {
        "apiVersion": contract.KUEUE_API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": dict(FLAVOR_LABELS), "tolerations": [dict(FLAVOR_TOLERATION)]},
    }


def queued_job(
    changes: dict[str, Any] | None = None, *, queue: str | None = QUEUE, labels: dict[str, str] | None = None
) -> JsonDict:
    job = make_job(changes)
    job["metadata"]["labels"] = {**({contract.QUEUE_NAME_LABEL: queue} if queue else {}), **(labels or {})}
    return job


class KueueWorld(World):
    """A World whose cluster runs Kueue (`installed`) and whose job is queued in QUEUE."""

    def default(self, obj: JsonDict) -> None:
        """A stored Workload gets its schema's defaults (an empty template metadata), which must not
        read as a difference."""
        if obj["kind"] == "Workload":
            for pod_set in obj["spec"].get("podSets") or []:
                pod_set["template"].setdefault("metadata", {})

    def install(self) -> None:
        self.kueue = Queueing(flavors={FLAVOR: flavor()})

    @property
    def workload_key(self) -> tuple[str, str]:
        return ("Workload", workload_name(parse(self.job)))

    @property
    def workload(self) -> JsonDict:
        return self.owned[self.workload_key]

    def has_workload(self) -> bool:
        return self.workload_key in self.owned

    def _conditions(self, *entries: tuple[str, str, str, str]) -> None:
        status = self.workload.setdefault("status", {})
        conditions = [c for c in status.get("conditions", []) if c["type"] not in {e[0] for e in entries}]
        for type_, value, reason, message in entries:
            conditions.append(
                {
                    "type": type_,
                    "status": value,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": rfc3339(self.now),
                }
            )
        status["conditions"] = conditions
        self._written()

    def _written(self) -> None:
        meta = self.workload["metadata"]
        meta["resourceVersion"] = f"{meta.get('resourceVersion')}k"

    def pending(self, message: str = QUOTA_MESSAGE, reason: str = "Pending") -> None:
        """Kueue's scheduler could not reserve quota (or the queue does not exist: Inadmissible)."""
        self._conditions(("QuotaReserved", "False", reason, message))

    def admit(
        self,
        cluster_queue: str = CLUSTER_QUEUE,
        flavor_name: str = FLAVOR,
        topology: JsonDict | None = None,
    ) -> None:
        """Quota reserved and admitted (no admission checks): status.admission names the flavor (and
        `topology`, the topologyAssignment of a flavor with a Topology)."""
        count = self.workload["spec"]["podSets"][0]["count"]
        assignment: JsonDict = {
            "name": contract.WORKLOAD_POD_SET,
            "count": count,
            "flavors": {contract.GPU_RESOURCE: flavor_name},
            "resourceUsage": {contract.GPU_RESOURCE: str(count)},
        }
        if topology is not None:
            assignment["topologyAssignment"] = topology
        self.workload.setdefault("status", {})["admission"] = {
            "clusterQueue": cluster_queue,
            "podSetAssignments": [assignment],
        }
        self._conditions(
            ("QuotaReserved", "True", "QuotaReserved", f"Quota reserved in ClusterQueue {cluster_queue}"),
            ("Admitted", "True", "Admitted", "The workload is admitted"),
            ("Evicted", "False", "QuotaReserved", "Previously: evicted"),
        )

    def evict(self, reason: str = "Preempted", message: str = PREEMPTED) -> None:
        """Kueue evicts the admitted Workload; the admission stays until the operator releases it."""
        self._conditions(("Evicted", "True", reason, message))

    def deactivate(self) -> None:
        self.workload["spec"]["active"] = False
        self._written()
        self.evict("Deactivated", "The workload is deactivated")


def kueue_world(
    changes: dict[str, Any] | None = None,
    *,
    installed: bool = True,
    queue: str | None = QUEUE,
    labels: dict[str, str] | None = None,
) -> KueueWorld:
    world = KueueWorld(queued_job(changes, queue=queue, labels=labels))
    if installed:
        world.install()
    return world
