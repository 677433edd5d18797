"""One chaos run: a cluster of its own, two replicas, the jobs, the planned rounds, the end, the audit.

Each round applies one disturbance (the leader killed or stopped, the API server restarted, a node
lost), injects its faults at once (so after a kill they land while no replica leads), then waits until
every job is Running with the restarts the ledger says. At the end every job is completed and then
deleted, and the run checks that no pod is left behind or held.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.resources import NAMESPACES, TRAININGJOBS
from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError
from testbed.common import JsonDict, Say, ToolError, wait_until
from testbed.harness.base import HarnessCluster
from testbed.harness.chaos import audit
from testbed.harness.chaos.cluster import (
    NAMESPACE,
    Faults,
    Observer,
    complete_and_delete,
    fallback_messages,
    job_manifest,
    lose_node,
    node_with_most_pods,
    pods_by_job,
    rank_uids,
    restore_node,
)
from testbed.harness.chaos.options import Options
from testbed.harness.chaos.plan import (
    ChaosPlan,
    Disturbance,
    Fault,
    FaultKind,
    Ledger,
    Round,
    make_plan,
    settled,
)
from testbed.harness.chaos.replicas import Replicas
from testbed.harness.chaos.supervisors import SupervisorStandIn

say = Say("chaos")


@dataclass
class Chaos:
    options: Options
    plan: ChaosPlan = field(init=False)
    ledger: Ledger = field(default_factory=Ledger)
    handovers: dict[str, list[float]] = field(default_factory=lambda: {"kill-9": [], "sigterm": []})
    unconverged: set[str] = field(default_factory=set)
    skipped: int = 0
    first_writes: list[float] = field(default_factory=list)
    in_place_findings: list[str] = field(default_factory=list)
    _replicas: Replicas | None = None
    _observer: Observer | None = None
    _supervisors: SupervisorStandIn | None = None
    cluster: HarnessCluster = field(init=False)

    def __post_init__(self) -> None:
        options = self.options
        self.cluster = HarnessCluster("chaos", options.dev_dir, say)
        self.plan = make_plan(
            options.seed,
            options.jobs,
            leader_kills=options.leader_kills,
            sigterm_kills=options.sigterm_kills,
            apiserver_restarts=options.apiserver_restarts,
            node_losses=options.node_losses,
            faults_per_round=options.faults_per_round,
            job_deletions=options.job_deletions,
            in_place_every=options.in_place_every,
        )

    @property
    def client(self) -> KubeClient:
        return self.cluster.client

    @property
    def replicas(self) -> Replicas:
        if self._replicas is None:
            raise ToolError("the replicas are not started")
        return self._replicas

    @property
    def supervisors(self) -> SupervisorStandIn:
        if self._supervisors is None:
            raise ToolError("the supervisors' stand-in is not started")
        return self._supervisors

    @property
    def in_place_jobs(self) -> list[str]:
        return [job.name for job in self.plan.jobs if job.in_place]

    @property
    def observer(self) -> Observer:
        if self._observer is None:
            raise ToolError("the observer is not started")
        return self._observer

    # ------------------------------------------------------------------------------- the run

    def run(self) -> JsonDict:
        started, load = time.monotonic(), os.getloadavg()[0]
        self.up()
        names = [job.name for job in self.plan.jobs]
        for job in self.plan.jobs:
            manifest = job_manifest(job.name, strict=job.strict, in_place=job.in_place)
            self.client.create(TRAININGJOBS, NAMESPACE, manifest)
        self.wait_settled(names, "every job Running")
        self.audit_in_place({})  # and every in-place rank's supervisor reported its process Running
        for number, planned in enumerate(self.plan.rounds, start=1):
            say(
                f"round {number}/{len(self.plan.rounds)}: {planned.disturbance or 'no disturbance'}, "
                f"{len(planned.faults)} fault(s)"
            )
            self.play(planned)
        live = [name for name in names if name not in self.ledger.deleted]
        self.observer.look()
        statuses = self.observer.snapshot()
        findings = audit.Findings(
            mismatches=audit.accounting(self.ledger, statuses, live),
            restart_count=[
                *audit.restart_counts(self.observer.history),
                *audit.final_counts(self.ledger, statuses, live),
            ],
            unconverged=sorted(self.unconverged),
            in_place=self.in_place_findings,
        )
        findings.held, findings.orphans = self.finish(live)
        end = time.time()
        leaderships = self.replicas.leaderships(end)
        writes = self.replicas.writes()
        findings.writers = [
            *audit.leaders_overlap(leaderships),
            *audit.writes_outside_leadership(writes, leaderships),
        ]
        self.first_writes = audit.first_writes(writes, leaderships)
        return write_report(self, findings, started, load)

    def play(self, planned: Round) -> None:
        faults = [fault for fault in planned.faults if fault.job not in self.unconverged]
        self.skipped += len(planned.faults) - len(faults)
        lost: tuple[str, list[str]] | None = None
        handover: tuple[str, float] | None = None
        kept: dict[str, dict[str, str]] = {}
        early: list[Fault] = []
        match planned.disturbance:
            case Disturbance.KILL9 | Disturbance.SIGTERM:
                in_place = [fault for fault in faults if fault.kind is FaultKind.FAIL_IN_PLACE]
                faults = [fault for fault in faults if fault not in in_place]
                kept = rank_uids(self.client, [fault.job for fault in in_place])
                early = self._stop_in_place(in_place)
                how = signal.SIGKILL if planned.disturbance is Disturbance.KILL9 else signal.SIGTERM
                stopped, at = self.replicas.stop_leader(how)
                say(f"{stopped.name} ({'killed' if how is signal.SIGKILL else 'stopped'}) led; injecting")
                handover = (planned.disturbance.value, at)
            case Disturbance.APISERVER:
                self.cluster.restart("kube-apiserver")
                wait_until("the API server", self._api_answers, timeout=120, interval=0.5)
            case Disturbance.NODE_LOSS:
                node, jobs = node_with_most_pods(self.client)
                lost = (node, jobs)
                say(f"losing node {node}: {len(jobs)} job(s) have pods there")
                lose_node(self.client, node)
                self.ledger.node_lost(jobs)
                faults = [fault for fault in faults if fault.job not in jobs]
        kept.update(rank_uids(self.client, [f.job for f in faults if f.kind is FaultKind.FAIL_IN_PLACE]))
        injected = early + self._inject(faults)
        self.supervisors.release()  # the ranks stopping in place answer, while no replica leads
        if handover is not None:
            kind, at = handover
            seconds = self.replicas.handover(at)
            self.handovers[kind].append(seconds)
            say(f"a replica took over after {seconds:.1f}s; starting a replacement")
            self.replicas.start()
        for fault in injected:
            if fault.kind is FaultKind.DELETE_JOB:
                Faults(self.client).delete_job_once_restarting(fault.job)
        waited = [fault.job for fault in injected] + (lost[1] if lost else [])
        self.wait_settled(waited, "the faulted jobs to settle")
        self.audit_in_place({job: uids for job, uids in kept.items() if job not in self.unconverged})
        if lost is not None:
            restore_node(self.client, lost[0])

    def _stop_in_place(self, faults: list[Fault]) -> list[Fault]:
        """A kill round's in-place failures, injected while the leader still leads: once it ordered
        their ranks to stop, the other ranks are held there, so the leader is killed in the middle of
        the in-place restart and the next one must finish it."""
        if not faults:
            return []
        jobs = [fault.job for fault in faults]
        self.supervisors.hold(jobs)
        injected = self._inject(faults)
        wait_for_stopping_orders(self._statuses, jobs)
        return injected

    def audit_in_place(self, kept: dict[str, dict[str, str]]) -> None:
        """After a round: the in-place jobs' pods kept (or a fallback Event says why), and every rank of
        every in-place job on status.attempt (its supervisor answers within a look or two)."""
        jobs = [job for job in self.in_place_jobs if job not in self.unconverged | self.ledger.deleted]
        self.in_place_findings.extend(in_place_findings(self.client, self._statuses, kept, jobs))

    def _inject(self, faults: list[Fault]) -> list[Fault]:
        injected = []
        inject = Faults(self.client)
        for fault in faults:
            try:
                inject.inject(fault)
            except KubeError as error:
                say(f"could not inject {fault.kind} into {fault.job}: {error}")
                self.skipped += 1
                continue
            self.ledger.fault(fault)
            injected.append(fault)
        return injected

    def wait_settled(self, jobs: list[str], what: str) -> None:
        def behind() -> list[str]:
            return settled(self.ledger, self._statuses(), jobs)

        try:
            wait_until(
                what,
                lambda: not behind(),
                timeout=self.options.round_timeout,
                interval=0.5,
                progress=lambda: f"{len(behind())} job(s) not settled: {', '.join(behind()[:5])}",
                say=say,
                every=15,
            )
        except ToolError as error:
            say(f"unconverged: {error}")
            self.unconverged.update(behind())

    def _statuses(self) -> dict[str, JsonDict]:
        if self._observer is not None:
            return self.observer.snapshot()
        jobs = self.client.list(TRAININGJOBS, NAMESPACE)["items"]
        return {job["metadata"]["name"]: job.get("status") or {} for job in jobs}

    def _api_answers(self) -> bool:
        try:
            self.client.get(NAMESPACES, None, NAMESPACE)
        except (KubeError, OSError):
            return False
        return True

    # ------------------------------------------------------------------------------------ the end

    def finish(self, live: list[str]) -> tuple[list[str], list[str]]:
        """Completes every live job that converged, then deletes them all: (pods held by the finalizer
        after the jobs completed, pods left after they were deleted)."""
        converged = [job for job in live if job not in self.unconverged]
        say(f"completing {len(converged)} job(s)")
        return complete_and_delete(self.client, converged, live, timeout=self.options.round_timeout, say=say)

    # ------------------------------------------------------------------------------ up and down

    def up(self) -> None:
        dev_dir = self.options.dev_dir
        self.cluster.start(NAMESPACE)
        kubeconfig = self.cluster.kubeconfig
        logs = dev_dir / "replicas"
        shutil.rmtree(logs, ignore_errors=True)
        logs.mkdir(parents=True)
        self._replicas = Replicas(kubeconfig, logs)
        self.replicas.start()
        self.replicas.start()
        leader = self.replicas.leader()
        say(f"two replicas run; {leader.name} leads")
        self._observer = Observer(self.client)
        self.observer.start()
        self._supervisors = SupervisorStandIn(self.client, NAMESPACE, self.in_place_jobs)
        self.supervisors.start()

    def down(self) -> None:
        if self._supervisors is not None:
            self._supervisors.stop()
        if self._observer is not None:
            self._observer.stop()
        if self._replicas is not None:
            say("stopping the replicas")
            self._replicas.stop_all()
        self.cluster.stop()


def wait_for_stopping_orders(statuses: Callable[[], dict[str, JsonDict]], jobs: list[str]) -> None:
    """Until every one of `jobs` shows the Stopping order of an in-place restart (30 s at most)."""

    def ordered() -> bool:
        seen = statuses()
        return all(
            ((seen.get(job) or {}).get("inPlaceRestart") or {}).get("phase") == "Stopping" for job in jobs
        )

    try:
        wait_until("the in-place jobs' Stopping orders", ordered, timeout=30, interval=0.2)
    except ToolError as error:
        say(f"killing the leader anyway: {error}")


def in_place_findings(
    client: KubeClient,
    statuses: Callable[[], dict[str, JsonDict]],
    kept: dict[str, dict[str, str]],
    jobs: list[str],
) -> list[str]:
    """The in-place jobs' pods kept (`kept`: their ranks' UIDs before the round, or a fallback Event
    says why not), and every rank of `jobs` on its job's attempt (within a look or two of its
    supervisor's stand-in)."""
    found = audit.pods_replaced(kept, rank_uids(client, kept), fallback_messages(client, kept))

    def behind() -> list[str]:
        return audit.left_on_old_attempt(statuses(), pods_by_job(client, jobs), jobs)

    with contextlib.suppress(ToolError):
        wait_until("every in-place rank on its job's attempt", lambda: not behind(), timeout=15)
    return [*found, *behind()]


def write_report(chaos: Chaos, findings: audit.Findings, started: float, load: float) -> JsonDict:
    """The run's report (what the summary line and chaos-report.json say), written to the dev dir."""
    report: JsonDict = {
        "jobs": len(chaos.plan.jobs),
        "pods_created": len(chaos.observer.pod_uids),
        "rounds": len(chaos.plan.rounds),
        "leader_kills": len(chaos.handovers["kill-9"]),
        "sigterm_kills": len(chaos.handovers["sigterm"]),
        "apiserver_restarts": sum(1 for r in chaos.plan.rounds if r.disturbance is Disturbance.APISERVER),
        "faults": dict(chaos.ledger.faults),
        "skipped_faults": chaos.skipped,
        "handover_seconds": {kind: audit.distribution(values) for kind, values in chaos.handovers.items()},
        "first_write_after_takeover_seconds": audit.distribution(chaos.first_writes),
        "findings": {
            "mismatches": findings.mismatches,
            "restart_count": findings.restart_count,
            "unconverged": findings.unconverged,
            "orphans": findings.orphans,
            "held": findings.held,
            "two_writers": findings.writers,
            "in_place": findings.in_place,
        },
        "passed": findings.clean,
        "seconds": round(time.monotonic() - started),
        "load_average": round(load, 2),
        "seed": chaos.options.seed,
    }
    (chaos.options.dev_dir / "chaos-report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report
