"""One reconcile's view of a TrainingJob: the observation read once, in the terms decisions use.

`Facts` holds the typed job (crd.spec), the time (and the time as status writes it), what is wrong
with the spec beyond the API server's checks (plan.spec_errors), the create failures the reconciler
reported, and the job's pods seen as a gang. Decisions and transitions read it and never change it;
the only thing that varies within one reconcile is the status, which is passed beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Final

from builders.podgroup import GangScheduler
from controller.planner import podstate
from controller.planner.gang import Gang, observe
from controller.planner.model import CreateFailure, Observed, Settings
from controller.planner.progress import Report, parse_report
from controller.planner.timers import ceil_to_second
from controller.runtime.clock import parse_time, rfc3339
from crd.contract import ESCALATION_POLICY, PROGRESS_ANNOTATION, TRAINER_POLICY, State
from crd.escalation import escalations
from crd.spec import Spec, TrainingJob

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Facts:
    job: TrainingJob
    observed: Observed
    settings: Settings
    # What is wrong with the spec beyond the API server's checks, as "field: problem" lines.
    spec_errors: tuple[str, ...]
    # The gang, observed on first use (a frozen dataclass caches in a mutable field).
    _gang: list[Gang] = field(default_factory=list, repr=False, compare=False)

    @property
    def spec(self) -> Spec:
        return self.job.spec

    @property
    def now(self) -> datetime:
        return self.observed.now

    @property
    def being_deleted(self) -> bool:
        """The job has a deletionTimestamp: a foreground deletion keeps it until the garbage collector has
        deleted its pods and Services, and someone else's finalizer may keep it longer."""
        return bool(self.observed.job.get("metadata", {}).get("deletionTimestamp"))

    @property
    def trainer_reports_withheld(self) -> bool:
        """The job's trainers run under the namespace's trainer account and may not report progress: the
        admission policy that narrows that account's rights is missing, so the operator took them back
        (planner/guards.py). Stall detection waits meanwhile: no report can arrive."""
        return not self.spec.service_account_name and TRAINER_POLICY in self.observed.guards.missing

    @cached_property
    def held_back(self) -> str | None:
        """Why no pod of the job may be created: it asks for more than a tenant's ordinary rights (the
        findings of crd/escalation.py) while the admission policy that judges that against its creator's
        rights is missing, or not known to be installed (planner/guards.py). None: nothing holds it."""
        guards = self.observed.guards
        if guards.known and ESCALATION_POLICY not in guards.missing:
            return None
        found = escalations(self.observed.job.get("spec") or {})
        if not found:
            return None
        missing = guards.missing.get(
            ESCALATION_POLICY, f"the admission policy {ESCALATION_POLICY} is not known"
        )
        return (
            f"{missing}: not starting the job, whose {'; '.join(found)} need(s) the policy's check of its "
            "creator's rights; its pods are created once the policy is installed "
            "(kubectl apply --server-side -k crd/)"
        )

    @cached_property
    def stamp(self) -> str:
        """The time as status records it: whole seconds, rounded up, so that a time written now and
        read back later never makes a timer (backoff, deadline, schedule timeout, stall, TTL) fire early.
        Read by every transition of a reconcile; formatted once."""
        return rfc3339(ceil_to_second(self.observed.now))

    @property
    def gang_scheduler(self) -> GangScheduler | None:
        """The gang scheduler whose PodGroup the job's pods join: the cluster's, if the job asks."""
        return self.observed.gang_scheduler if self.spec.scheduling.gang_scheduling else None

    def gang(self, status: Mapping[str, Any]) -> Gang:
        """The job's pods as one gang (the same for every status the reconcile's steps go through: the
        pods do not change while it plans)."""
        if not self._gang:
            observed = self.observed
            self._gang.append(
                observe(
                    observed.pods,
                    self.spec.replicas,
                    observed.nodes,
                    observed.nodes_known,
                    now=observed.now,
                    node_grace=self.settings.node_lost_after,
                )
            )
        return self._gang[0]

    def reporter(self, status: Mapping[str, Any]) -> JsonDict | None:
        """The pod whose progress report counts: slot 0's (worker 0, or a TensorFlow job's chief), where
        rank 0 runs; when it is being deleted, still that pod while its trainer may report (a checkpoint
        saved on SIGTERM), as long as it belongs to the status's attempt. In an elastic job torchrun
        assigns ranks anew in every rendezvous round, so rank 0 may have moved: there it is the pod
        with the newest report (worker 0's while none has one)."""
        ranks = self.gang(status).ranks
        if self.spec.elastic is None or len(ranks) < 2:
            rank0 = ranks.get(0)
            return rank0 if rank0 is not None else self._departing_rank0(status)
        newest: tuple[str, int, int] | None = None
        chosen = ranks.get(0)
        for index, pod in ranks.items():
            report, _ = parse_report(pod["metadata"].get("annotations", {}).get(PROGRESS_ANNOTATION))
            if report is None:
                continue
            key = (report.time or "", report.step or 0, -index)
            if newest is None or key > newest:
                newest, chosen = key, pod
        return chosen

    def _departing_rank0(self, status: Mapping[str, Any]) -> JsonDict | None:
        """Slot 0's pod of the status's attempt among the pods being deleted, if there is one."""
        attempt = attempt_of(status)
        for pod in self.gang(status).terminating:
            if podstate.slot(pod, self.spec.replicas) == 0 and podstate.attempt(pod) == attempt:
                return pod
        return None

    def report(self, status: Mapping[str, Any]) -> tuple[Report | None, str | None]:
        """Rank 0's progress report (parse_report's answer), with the pod named in a problem."""
        pod = self.reporter(status)
        if pod is None:
            return None, None
        report, problem = parse_report(pod["metadata"].get("annotations", {}).get(PROGRESS_ANNOTATION))
        return report, f"{pod['metadata']['name']}: {problem}" if problem else None

    def rank0_finished(self, status: Mapping[str, Any]) -> bool:
        pod = self.reporter(status)
        return pod is not None and podstate.worker_phase(pod) in ("Succeeded", "Failed")

    def failures(self, verdict: str) -> list[CreateFailure]:
        """The refused creates of `verdict`; of the pods refused for a reason they all share (a quota, an
        invalid field), only the first: how many of them were tried in one batch (more when nothing
        said the job was blocked, one in a slow start) changes nothing the job should say."""
        found: list[CreateFailure] = []
        shared_pod_reason = False
        for failure in self.observed.create_failures:
            if failure.verdict != verdict:
                continue
            if failure.kind == "Pod" and not failure.alone:
                if shared_pod_reason:
                    continue
                shared_pod_reason = True
            found.append(failure)
        return found

    def elapsed(self, since: str) -> float:
        """Seconds from a status time to now."""
        return (self.now - parse_time(since)).total_seconds()


def attempt_of(status: Mapping[str, Any]) -> int:
    return int(status.get("attempt", 0))


_STATES: Final[Mapping[str, State]] = {state.value: state for state in State}


def state_of(status: Mapping[str, Any]) -> State | None:
    state = status.get("state")
    return _STATES.get(state) if isinstance(state, str) else None


def resume_from(facts: Facts, status: Mapping[str, Any]) -> str | None:
    """The checkpoint the next attempt starts from: the latest reported, else spec.checkpoint.resumeFrom."""
    latest = (status.get("checkpoint") or {}).get("latest")
    return str(latest) if latest else facts.spec.checkpoint.resume_from
