"""A TrainingJob's pods seen as one gang: which ranks exist, which are stale, and how far they got.

The planner never reasons about single pods: a rank restarted alone cannot rejoin the collective, so
every decision is about the gang. This module turns the job's owned pods (from the cache) into a `Gang`
once per reconcile. A rank is a slot of the job (crd/replicas.py): the worker of that index in a job of
workers only; with TensorFlow roles, the chief, workers, parameter servers and evaluator in that order
(an MPI job's launcher after its workers), each pod found by its role label and its index within the
role; the launcher is created only once the workers are Ready (`held_launcher`). The evaluator is not
part of the training cluster: its failures are kept apart (`evaluator_failures`), because they neither
fail nor restart the job (controller/planner/roles.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from controller.planner import conditions as cond
from controller.planner import podstate
from controller.planner.failures import PodFailure, classify
from crd.contract import Condition, ReplicaType
from crd.replicas import Replicas

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Gang:
    """The pods of one job by role: a live pod per rank, the extra ones, those going away, and the
    failures among them (including ranks deleted since the cache last held them)."""

    replicas: Replicas
    ranks: dict[int, JsonDict] = field(default_factory=dict)
    terminating: list[JsonDict] = field(default_factory=list)
    out_of_range: list[JsonDict] = field(default_factory=list)
    stale: list[JsonDict] = field(default_factory=list)
    failures: list[PodFailure] = field(default_factory=list)
    # Failures (and losses) of the evaluator, which is not part of the training cluster.
    evaluator_failures: list[PodFailure] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Slots (pods) of the job: numWorkers, and a TensorFlow job's other roles."""
        return self.replicas.size

    @property
    def noun(self) -> str:
        """What the gang's pods are called in messages: workers, or pods when there are other roles."""
        return "pods" if self.replicas.has_roles else "workers"

    @property
    def live(self) -> list[JsonDict]:
        return [*self.ranks.values(), *self.out_of_range]

    @property
    def all_pods(self) -> list[JsonDict]:
        return [*self.live, *self.terminating]

    @property
    def missing(self) -> list[int]:
        return [slot for slot in range(self.size) if slot not in self.ranks]

    @property
    def missing_training(self) -> list[int]:
        """Missing slots of the training cluster (every role but the evaluator; not an MPI job's launcher
        while it waits for the workers)."""
        training = set(self.replicas.training)
        held = self.held_launcher
        return [slot for slot in self.missing if slot in training and slot != held]

    @property
    def held_launcher(self) -> int | None:
        """An MPI job's launcher slot while the launcher waits to be created: until every worker is
        Ready (its SSH server answers), so that mpirun never races the workers' SSH servers."""
        launcher = self.replicas.launcher_slot
        if launcher is None or launcher in self.ranks:
            return None
        workers = self.replicas.slots(ReplicaType.WORKER)
        ready = all(slot in self.ranks and podstate.is_ready(self.ranks[slot]) for slot in workers)
        return None if ready else launcher

    def to_create(self, status: Mapping[str, Any]) -> list[int]:
        """The missing slots the status's attempt still creates: all of them until its gang was created
        and formed; after that not the evaluator's (a lost evaluator is not replaced within an attempt,
        and a lost pod of the training cluster restarts the gang)."""
        created = cond.is_true(status.get("conditions"), Condition.CREATED)
        missing = [slot for slot in self.missing if slot != self.held_launcher]
        if created and self.formed(int(status.get("attempt", 0))):
            evaluators = set(self.replicas.slots(ReplicaType.EVALUATOR))
            return [slot for slot in missing if slot not in evaluators]
        return missing

    def count(self, *phases: str) -> int:
        """Ranks whose worker (its trainer container, podstate.worker_phase) is in one of `phases`."""
        return sum(1 for pod in self.ranks.values() if podstate.worker_phase(pod) in phases)

    def role_counts(self) -> dict[str, dict[str, int]]:
        """status.roles: each role's pods of the current attempt by phase."""
        counts: dict[str, dict[str, int]] = {}
        for role in ReplicaType:
            if self.replicas.count(role):
                pods = [self.ranks[slot] for slot in self.replicas.slots(role) if slot in self.ranks]
                counts[str(role)] = _phases(pods)
        return counts

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
            if podstate.attempt(pod) == attempt and podstate.slot(pod, self.replicas) is not None
        )
        return any(podstate.phase(pod) != "Pending" for pod in (*self.ranks.values(), *deleted))

    def workers(self) -> dict[str, int]:
        return _phases(list(self.ranks.values()))

    def record(self, failure: PodFailure, slot: int | None) -> None:
        """Adds a pod's failure to the training cluster's, or to the evaluator's."""
        evaluator = slot is not None and self.replicas.at(slot).type == ReplicaType.EVALUATOR
        (self.evaluator_failures if evaluator else self.failures).append(failure)


def _phases(pods: Sequence[JsonDict]) -> dict[str, int]:
    """status.workers' counts of `pods`, by the phase of their trainers (podstate.worker_phase)."""
    phases = [podstate.worker_phase(pod) for pod in pods]
    return {
        "pending": sum(phase in ("Pending", "Unknown") for phase in phases),
        "active": phases.count("Running"),
        "succeeded": phases.count("Succeeded"),
        "failed": phases.count("Failed"),
    }


def observe(
    pods: Sequence[JsonDict],
    replicas: Replicas | int,
    nodes: Mapping[str, JsonDict],
    nodes_known: bool,
    *,
    now: datetime | None = None,
    node_grace: float = 0.0,
) -> Gang:
    """The gang as the cache shows it. A pod being deleted is no longer a rank, but it still says how
    its rank ended (the tracking finalizer keeps it until the status says so: planner/tracking.py):
    preempted or evicted (a disruption), or failed before anyone deleted it (a failure). Any other
    deletion leaves its rank missing, which the planner judges as such. `replicas`: the job's pods by
    role, or for a job of workers only their number."""
    layout = replicas if isinstance(replicas, Replicas) else Replicas(workers=replicas)
    gang = Gang(replicas=layout)
    for pod in sorted(pods, key=lambda item: str(item.get("metadata", {}).get("name", ""))):
        slot = podstate.slot(pod, layout)
        if podstate.is_terminating(pod):
            gang.terminating.append(pod)
            # Preemption, API eviction and taint-manager deletion mark the pod DisruptionTarget and
            # delete it: the rank then goes missing, and this is why.
            if podstate.disruption_reason(pod) is not None or podstate.failed_before_deletion(pod):
                failure = classify(pod, None, False)
                if failure is not None:
                    gang.record(replace(failure, gone=True), slot)
            continue
        if slot is None or slot in gang.ranks:
            gang.out_of_range.append(pod)
            continue
        gang.ranks[slot] = pod
        if podstate.built_for_another_size(pod, layout.workers):
            gang.stale.append(pod)
        node = podstate.node_name(pod)
        failure = classify(
            pod, nodes.get(node) if node else None, nodes_known, now=now, node_grace=node_grace
        )
        if failure is not None:
            gang.record(failure, slot)
    return gang


def root_cause(failures: Sequence[PodFailure], pods_by_name: Mapping[str, JsonDict]) -> PodFailure:
    """The failure that most likely broke the gang: a disruption first (the other ranks' errors are
    its consequences), else the worker whose container (the trainer, or what kept it from running)
    terminated first."""
    disruptions = [failure for failure in failures if failure.disruption]
    if disruptions:
        return disruptions[0]

    def finished_at(failure: PodFailure) -> str:
        pod = pods_by_name.get(failure.pod, {})
        ended = podstate.finished_at(pod, failure.container)
        if ended is None:  # a supervised process that ended while its container runs on (inplace.py)
            report = podstate.run(pod)
            ended = report.at if report is not None and report.state == "Exited" else None
        return ended or "9999"

    return sorted(failures, key=lambda failure: (finished_at(failure), failure.pod))[0]
