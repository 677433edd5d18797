"""What a chaos run does, decided before it starts: the jobs, the rounds of faults, and the accounting
each fault must leave in its job's status.

Pure and seeded, so a run can be repeated and the rules are tested without a cluster
(testbed/tests/test_chaos_plan.py). The rules are the operator's (docs/accounting.md): a failed rank is
one `failure` restart; a preemption, an eviction, a lost node or a rank deleted by someone is one
`disruption` restart, and it is the root cause when the other ranks fail because their peer is gone.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final


class FaultKind(StrEnum):
    FAIL = "fail"  # rank 1's trainer exits 1
    FAIL_IN_PLACE = "fail-in-place"  # an InPlace job: rank 1's supervisor reports its process Exited 1
    PREEMPT = "preempt"  # rank 1 marked DisruptionTarget (PreemptionByScheduler) and deleted
    EVICT_IN_PLACE = "evict-in-place"  # rank 1 marked DisruptionTarget (TerminationByKubelet), Failed, kept
    PREEMPT_PEER_FAILS = "preempt-peer-fails"  # rank 1 preempted and deleted, then rank 0 exits 1
    FORCE_DELETE = "force-delete"  # rank 1 deleted with grace period 0 by someone
    DELETE_JOB = "delete-job"  # the job is deleted while it restarts (after a failure of rank 1)


class Disturbance(StrEnum):
    KILL9 = "kill-9"  # the leading replica is killed with SIGKILL
    SIGTERM = "sigterm"  # the leading replica is stopped with SIGTERM
    APISERVER = "apiserver-restart"
    NODE_LOSS = "node-loss"  # a node's kubelet dies: its pods' jobs restart as a disruption


# What each fault costs its job: (restarts.failure, restarts.disruption).
COST: Final[dict[FaultKind, tuple[int, int]]] = {
    FaultKind.FAIL: (1, 0),
    FaultKind.FAIL_IN_PLACE: (1, 0),
    FaultKind.PREEMPT: (0, 1),
    FaultKind.EVICT_IN_PLACE: (0, 1),
    FaultKind.PREEMPT_PEER_FAILS: (0, 1),
    FaultKind.FORCE_DELETE: (0, 1),
    FaultKind.DELETE_JOB: (1, 0),
}
# Faults a job with backoffLimit 0 may get and survive: only disruptions. (The preemption whose peer
# fails a second later needs a second without a leader: the first fault of every kill -9 round.)
DISRUPTIONS: Final = (FaultKind.PREEMPT, FaultKind.EVICT_IN_PLACE, FaultKind.FORCE_DELETE)


@dataclass(frozen=True)
class JobPlan:
    name: str
    # A strict job has backoffLimit 0: a disruption charged as a failure would fail it.
    strict: bool
    # An in-place job (restartStrategy InPlace) restarts its processes, not its pods; its faults are
    # `fail-in-place` (its supervisors are played by the run: testbed/harness/chaos/supervisors.py).
    in_place: bool = False


@dataclass(frozen=True)
class Fault:
    job: str
    kind: FaultKind


@dataclass(frozen=True)
class Round:
    """One disturbance, then faults injected at once (while no leader runs, for a kill), then a wait
    until every job is where its accounting says."""

    disturbance: Disturbance | None
    faults: tuple[Fault, ...]


@dataclass(frozen=True)
class ChaosPlan:
    jobs: tuple[JobPlan, ...]
    rounds: tuple[Round, ...]


def make_plan(
    seed: int,
    jobs: int,
    *,
    leader_kills: int,
    sigterm_kills: int,
    apiserver_restarts: int,
    node_losses: int,
    faults_per_round: int,
    job_deletions: int,
    in_place_every: int = 4,
) -> ChaosPlan:
    """A seeded plan: every third job strict, every `in_place_every`th of the others in place (0: none);
    one round per disturbance (kills spread among the others), each with `faults_per_round` faults on
    distinct live jobs, the first of every kill -9 round the nasty case (preempt and delete, then the
    peer fails) on a job that recreates; an in-place job always fails in place and is never deleted;
    `job_deletions` jobs deleted mid-restart in the last rounds."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
    planned = tuple(
        JobPlan(
            f"chaos-{index:03d}",
            strict=index % 3 == 0,
            in_place=in_place_every > 0 and index % in_place_every == 1 and index % 3 != 0,
        )
        for index in range(jobs)
    )
    in_place = {job.name for job in planned if job.in_place}
    disturbances: list[Disturbance | None] = [
        *([Disturbance.KILL9] * leader_kills),
        *([Disturbance.SIGTERM] * sigterm_kills),
        *([Disturbance.APISERVER] * apiserver_restarts),
        *([Disturbance.NODE_LOSS] * node_losses),
    ]
    rng.shuffle(disturbances)
    if not disturbances:
        disturbances = [None]
    live = [job.name for job in planned]
    strict = {job.name for job in planned if job.strict}
    rounds: list[Round] = []
    deletions_left = job_deletions
    for number, disturbance in enumerate(disturbances):
        remaining_rounds = len(disturbances) - number
        picked = rng.sample(live, min(faults_per_round, len(live)))
        picked.sort(key=lambda job: job in in_place)  # stable: a recreating job first, when one is
        faults: list[Fault] = []
        for position, job in enumerate(picked):
            if job in in_place:
                kind = FaultKind.FAIL_IN_PLACE
            elif position == 0 and disturbance is Disturbance.KILL9:
                kind = FaultKind.PREEMPT_PEER_FAILS
            elif deletions_left and job not in strict and rng.random() < deletions_left / remaining_rounds:
                kind = FaultKind.DELETE_JOB
                deletions_left -= 1
                live.remove(job)
            elif job in strict:
                kind = rng.choice(DISRUPTIONS)
            else:
                kind = rng.choice((FaultKind.FAIL, *DISRUPTIONS))
            faults.append(Fault(job, kind))
        rounds.append(Round(disturbance, tuple(faults)))
    return ChaosPlan(planned, tuple(rounds))


@dataclass
class Ledger:
    """What each job's status must say, kept as the run goes: faults and node losses add to it."""

    failure: Counter[str] = field(default_factory=Counter)
    disruption: Counter[str] = field(default_factory=Counter)
    deleted: set[str] = field(default_factory=set)
    faults: Counter[str] = field(default_factory=Counter)

    def fault(self, fault: Fault) -> None:
        failures, disruptions = COST[fault.kind]
        self.failure[fault.job] += failures
        self.disruption[fault.job] += disruptions
        self.faults[fault.kind.value] += 1
        if fault.kind is FaultKind.DELETE_JOB:
            self.deleted.add(fault.job)

    def node_lost(self, jobs: Iterable[str]) -> None:
        for job in jobs:
            self.disruption[job] += 1
            self.faults[Disturbance.NODE_LOSS.value] += 1

    def expected(self, job: str) -> dict[str, int]:
        """The job's status.restarts as the operator writes it (causes that never happened absent)."""
        counts = {"failure": self.failure[job], "disruption": self.disruption[job]}
        return {cause: count for cause, count in counts.items() if count}


def restarts_of(status: Mapping[str, Any]) -> dict[str, int]:
    restarts = status.get("restarts")
    if not isinstance(restarts, dict):
        return {}
    return {str(cause): int(count) for cause, count in restarts.items() if cause in ("failure", "disruption")}


def settled(ledger: Ledger, statuses: Mapping[str, Mapping[str, Any]], jobs: Sequence[str]) -> list[str]:
    """The jobs among `jobs` not yet where the ledger says: restarts counted, and Running again."""
    behind = []
    for job in jobs:
        if job in ledger.deleted:
            if job in statuses:
                behind.append(job)
            continue
        status = statuses.get(job) or {}
        if restarts_of(status) != ledger.expected(job) or status.get("state") != "Running":
            behind.append(job)
    return behind
