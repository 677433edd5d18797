"""The pods a TrainingJob is made of, by replica role: which roles, how many of each, in which order.

A job's pods are its workers (spec.numWorkers), and for a TensorFlow job with spec.tensorflow also a
chief, parameter servers and an evaluator (Kubeflow TFJob's replica roles); an XGBoost job also has a
master (Kubeflow XGBoostJob's), which runs the tracker. Builders name and configure each pod by its role
and its index within the role; the planner sees the pods as one gang in which every pod has a slot. The
slot order is fixed: the chief, the master, the workers, the parameter servers, the evaluator, an MPI
job's launcher. So slot 0 is the chief or the master when there is one, else worker 0: the pod
MASTER_ADDR names, that reports progress and whose success RankZero means. A job without TensorFlow
roles has only workers, and a worker's slot is its index: everything about such a job is as it was
before roles.

Pure arithmetic over the typed spec, in one place, so the names, the environment, the Services and
the planner cannot disagree about which pod is which.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from crd.contract import ReplicaType


@dataclass(frozen=True)
class Replica:
    """One pod of the job: its role, its index within the role and its slot in the job."""

    type: ReplicaType
    index: int
    slot: int


@dataclass(frozen=True)
class Replicas:
    """How many pods of each role a job has (spec.numWorkers workers; spec.tensorflow's roles)."""

    chief: int = 0
    master: int = 0
    workers: int = 1
    ps: int = 0
    evaluator: int = 0
    # An MPI job's launcher (0 or 1), after the workers: worker 0 stays slot 0, where MPI's rank 0 runs.
    launcher: int = 0

    def count(self, role: ReplicaType) -> int:
        return {
            ReplicaType.CHIEF: self.chief,
            ReplicaType.MASTER: self.master,
            ReplicaType.WORKER: self.workers,
            ReplicaType.PS: self.ps,
            ReplicaType.EVALUATOR: self.evaluator,
            ReplicaType.LAUNCHER: self.launcher,
        }[role]

    @cached_property
    def all(self) -> tuple[Replica, ...]:
        """Every pod of the job, in slot order."""
        found: list[Replica] = []
        for role in ReplicaType:
            found += [Replica(role, index, len(found) + index) for index in range(self.count(role))]
        return tuple(found)

    @property
    def size(self) -> int:
        """Pods in the job."""
        return len(self.all)

    @property
    def has_roles(self) -> bool:
        """Whether the job has pods other than workers (TensorFlow roles)."""
        return self.size != self.workers

    def at(self, slot: int) -> Replica:
        """The pod in `slot`. In a job of workers only, a slot past the last is the worker of that index
        (pods left from a larger numWorkers, or an elastic job's after a scale down, are named so)."""
        if slot >= self.size and not self.has_roles:
            return Replica(ReplicaType.WORKER, slot, slot)
        return self.all[slot]

    def slot(self, role: ReplicaType, index: int) -> int | None:
        """The slot of `role`'s pod `index`, None when the job has no such pod."""
        if not 0 <= index < self.count(role):
            return None
        order = list(ReplicaType)
        return sum(self.count(earlier) for earlier in order[: order.index(role)]) + index

    def slots(self, *roles: ReplicaType) -> tuple[int, ...]:
        return tuple(replica.slot for replica in self.all if replica.type in roles)

    @property
    def training(self) -> tuple[int, ...]:
        """The slots of the training cluster (every pod but the evaluator): they form TF_CONFIG's
        cluster, and a gang breaks when one of them is lost."""
        return self.slots(
            ReplicaType.CHIEF, ReplicaType.MASTER, ReplicaType.WORKER, ReplicaType.PS, ReplicaType.LAUNCHER
        )

    @property
    def hosts(self) -> tuple[int, ...]:
        """The slots whose pods get a stable DNS name (hostname and subdomain): TF_CONFIG's cluster,
        XGBoost's master, an MPI job's workers (the hostfile). Not the evaluator nor the launcher, whose
        names may be longer than a hostname may be."""
        return self.slots(ReplicaType.CHIEF, ReplicaType.MASTER, ReplicaType.WORKER, ReplicaType.PS)

    @property
    def launcher_slot(self) -> int | None:
        """The slot of an MPI job's launcher (after the workers), None for other jobs."""
        return self.slot(ReplicaType.LAUNCHER, 0)

    @property
    def cluster_roles(self) -> tuple[ReplicaType, ...]:
        """The roles in TF_CONFIG's cluster, in slot order (the evaluator is not part of it)."""
        return tuple(
            role for role in (ReplicaType.CHIEF, ReplicaType.WORKER, ReplicaType.PS) if self.count(role)
        )
