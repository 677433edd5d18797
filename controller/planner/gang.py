"""A TrainingJob's pods seen as one gang: which ranks exist, which are stale, and how far they got.

The planner never reasons about single pods: a rank restarted alone cannot rejoin the collective,
so every decision is about the gang. This module turns the job's owned pods (from the cache) into
a `Gang` once per reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from controller.planner import podstate
from controller.planner.failures import PodFailure, classify

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Gang:
    """The pods of one job by role: a live pod per rank, the extra ones, those going away, and the
    failures among them (including ranks deleted since the cache last held them)."""

    num_workers: int
    ranks: dict[int, JsonDict] = field(default_factory=dict)
    terminating: list[JsonDict] = field(default_factory=list)
    out_of_range: list[JsonDict] = field(default_factory=list)
    stale: list[JsonDict] = field(default_factory=list)
    failures: list[PodFailure] = field(default_factory=list)

    @property
    def live(self) -> list[JsonDict]:
        return [*self.ranks.values(), *self.out_of_range]

    @property
    def all_pods(self) -> list[JsonDict]:
        return [*self.live, *self.terminating]

    @property
    def missing(self) -> list[int]:
        return [index for index in range(self.num_workers) if index not in self.ranks]

    def count(self, *phases: str) -> int:
        """Ranks whose worker (its trainer container, podstate.worker_phase) is in one of `phases`."""
        return sum(1 for pod in self.ranks.values() if podstate.worker_phase(pod) in phases)

    @property
    def unscheduled(self) -> list[JsonDict]:
        return [pod for pod in self.ranks.values() if not podstate.is_scheduled(pod)]

    @property
    def holding(self) -> list[JsonDict]:
        """The live pods still running or about to (they hold nodes and GPUs, podstate.holds_node): a
        pod whose trainer is done but whose sidecar still runs holds its node too, one whose containers
        have all ended does not. Finished ones are kept for inspection unless cleanPodPolicy says
        otherwise."""
        return [pod for pod in self.live if podstate.holds_node(pod)]

    @property
    def allocated(self) -> int:
        """Pods, terminating ones included, that a scheduler has placed or may place (status.resources)."""
        return sum(1 for pod in self.all_pods if podstate.phase(pod) in ("Pending", "Running"))

    def formed(self, attempt: int) -> bool:
        """True once any rank of gang attempt `attempt` got past Pending: from then on a missing rank
        breaks the collective. Its ranks being deleted count (every pod deleted at once broke it as
        surely as one); pods of an earlier attempt, still terminating after a suspend, do not."""
        deleted = (
            pod
            for pod in self.terminating
            if podstate.attempt(pod) == attempt and podstate.replica_index(pod) in range(self.num_workers)
        )
        return any(podstate.phase(pod) != "Pending" for pod in (*self.ranks.values(), *deleted))

    def workers(self) -> dict[str, int]:
        return {
            "pending": self.count("Pending", "Unknown"),
            "active": self.count("Running"),
            "succeeded": self.count("Succeeded"),
            "failed": self.count("Failed"),
        }


def observe(
    pods: Sequence[JsonDict],
    num_workers: int,
    nodes: Mapping[str, JsonDict],
    nodes_known: bool,
    *,
    now: datetime | None = None,
    node_grace: float = 0.0,
) -> Gang:
    """The gang as the cache shows it. A pod being deleted is no longer a rank, but it still says how
    its rank ended (the tracking finalizer keeps it until the status says so: planner/tracking.py):
    preempted or evicted (a disruption), or failed before anyone deleted it (a failure). Any other
    deletion leaves its rank missing, which the planner judges as such."""
    gang = Gang(num_workers=num_workers)
    for pod in sorted(pods, key=lambda item: str(item.get("metadata", {}).get("name", ""))):
        if podstate.is_terminating(pod):
            gang.terminating.append(pod)
            # Preemption, API eviction and taint-manager deletion mark the pod DisruptionTarget and
            # delete it: the rank then goes missing, and this is why.
            if podstate.disruption_reason(pod) is not None or podstate.failed_before_deletion(pod):
                failure = classify(pod, None, False)
                if failure is not None:
                    gang.failures.append(replace(failure, gone=True))
            continue
        index = podstate.replica_index(pod)
        if index is None or not 0 <= index < num_workers or index in gang.ranks:
            gang.out_of_range.append(pod)
            continue
        gang.ranks[index] = pod
        if podstate.built_for_another_size(pod, num_workers):
            gang.stale.append(pod)
        node = podstate.node_name(pod)
        failure = classify(
            pod, nodes.get(node) if node else None, nodes_known, now=now, node_grace=node_grace
        )
        if failure is not None:
            gang.failures.append(failure)
    return gang


def root_cause(failures: Sequence[PodFailure], pods_by_name: Mapping[str, JsonDict]) -> PodFailure:
    """The failure that most likely broke the gang: a disruption first (the other ranks' errors are
    its consequences), else the worker whose container (the trainer, or what kept it from running)
    terminated first."""
    disruptions = [failure for failure in failures if failure.disruption]
    if disruptions:
        return disruptions[0]

    def finished_at(failure: PodFailure) -> str:
        return podstate.finished_at(pods_by_name.get(failure.pod, {}), failure.container) or "9999"

    return sorted(failures, key=lambda failure: (finished_at(failure), failure.pod))[0]
