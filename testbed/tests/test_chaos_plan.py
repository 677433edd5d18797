"""make chaos's decisions without a cluster: the seeded plan, the ledger of what each job's status
must say, when a job has settled, and the audit's invariants."""

from __future__ import annotations

from pathlib import Path

from testbed.harness.bench.operator import Operator
from testbed.harness.chaos import audit
from testbed.harness.chaos.audit import Leadership, Write
from testbed.harness.chaos.plan import (
    DISRUPTIONS,
    ChaosPlan,
    Disturbance,
    Fault,
    FaultKind,
    Ledger,
    make_plan,
    settled,
)
from testbed.harness.chaos.replicas import Replica, log_time


def seeded(seed: int) -> ChaosPlan:
    return make_plan(
        seed,
        12,
        leader_kills=4,
        sigterm_kills=1,
        apiserver_restarts=2,
        node_losses=1,
        faults_per_round=4,
        job_deletions=3,
    )


def test_the_plan_is_reproducible_and_has_one_round_per_disturbance() -> None:
    first, second = seeded(7), seeded(7)
    assert first == second
    kinds = [round_.disturbance for round_ in first.rounds]
    assert kinds.count(Disturbance.KILL9) == 4
    assert kinds.count(Disturbance.SIGTERM) == 1
    assert kinds.count(Disturbance.APISERVER) == 2
    assert kinds.count(Disturbance.NODE_LOSS) == 1


def test_every_kill_round_starts_with_a_preemption_whose_peer_fails_while_no_replica_leads() -> None:
    chaos = make_plan(
        3,
        12,
        leader_kills=5,
        sigterm_kills=2,
        apiserver_restarts=1,
        node_losses=0,
        faults_per_round=3,
        job_deletions=0,
    )
    for round_ in chaos.rounds:
        nasty = [fault for fault in round_.faults if fault.kind is FaultKind.PREEMPT_PEER_FAILS]
        if round_.disturbance is Disturbance.KILL9:
            assert round_.faults[0].kind is FaultKind.PREEMPT_PEER_FAILS
        else:
            assert nasty == []  # with a leader up the gang restarts before the peer could fail


def test_strict_jobs_get_only_disruptions_and_a_deleted_job_gets_nothing_after() -> None:
    chaos = make_plan(
        11,
        30,
        leader_kills=6,
        sigterm_kills=0,
        apiserver_restarts=3,
        node_losses=0,
        faults_per_round=6,
        job_deletions=4,
    )
    strict = {job.name for job in chaos.jobs if job.strict}
    deleted: set[str] = set()
    for round_ in chaos.rounds:
        jobs = [fault.job for fault in round_.faults]
        assert len(jobs) == len(set(jobs)), "one fault per job per round"
        for fault in round_.faults:
            assert fault.job not in deleted
            if fault.job in strict and fault.kind is not FaultKind.PREEMPT_PEER_FAILS:
                assert fault.kind in DISRUPTIONS
            if fault.kind is FaultKind.DELETE_JOB:
                assert fault.job not in strict
                deleted.add(fault.job)
    assert len(deleted) == 4


def test_the_ledger_counts_each_fault_by_its_cause() -> None:
    ledger = Ledger()
    for kind in (FaultKind.FAIL, FaultKind.PREEMPT, FaultKind.PREEMPT_PEER_FAILS, FaultKind.FORCE_DELETE):
        ledger.fault(Fault("a", kind))
    ledger.node_lost(["a", "b"])
    ledger.fault(Fault("c", FaultKind.EVICT_IN_PLACE))
    assert ledger.expected("a") == {"failure": 1, "disruption": 4}
    assert ledger.expected("b") == {"disruption": 1}
    assert ledger.expected("c") == {"disruption": 1}
    assert ledger.expected("d") == {}


def test_a_job_has_settled_when_running_with_its_restarts_or_gone_when_deleted() -> None:
    ledger = Ledger()
    ledger.fault(Fault("a", FaultKind.FAIL))
    ledger.fault(Fault("gone", FaultKind.DELETE_JOB))
    running = {"state": "Running", "restarts": {"failure": 1}}
    assert settled(ledger, {"a": running}, ["a", "gone"]) == []
    assert settled(ledger, {"a": {"state": "Restarting", "restarts": {"failure": 1}}}, ["a"]) == ["a"]
    assert settled(ledger, {"a": {"state": "Running", "restarts": {"failure": 2}}}, ["a"]) == ["a"]
    assert settled(ledger, {"a": running, "gone": {}}, ["a", "gone"]) == ["gone"]


def test_the_audit_reports_a_cause_counted_wrongly_and_a_restart_count_going_back() -> None:
    ledger = Ledger()
    ledger.fault(Fault("a", FaultKind.PREEMPT))
    statuses = {"a": {"restarts": {"failure": 1}, "restartCount": 1}}
    assert audit.accounting(ledger, statuses, ["a"]) == [
        "a: restarts {'failure': 1}, expected {'disruption': 1}"
    ]
    assert audit.final_counts(ledger, statuses, ["a"]) == []
    assert audit.restart_counts({"a": [0, 1, 2], "b": [0, 2, 1]}) == ["b: restartCount went from 2 back to 1"]


def test_two_writers_are_found_from_overlapping_leaderships_and_writes_outside_them() -> None:
    leaderships = [Leadership("r0", 10.0, 20.0), Leadership("r1", 25.0, 40.0)]
    assert audit.leaders_overlap(leaderships) == []
    assert audit.leaders_overlap([*leaderships, Leadership("r2", 30.0, 50.0)]) == [
        "r1 led until 40.000 but r2 led from 30.000"
    ]
    writes = [Write("r0", 15.0, "create"), Write("r1", 26.0, "transition"), Write("r0", 21.0, "release")]
    assert audit.writes_outside_leadership(writes, leaderships) == [
        "r0 wrote (release) at 21.000 without leading"
    ]


def test_the_summary_line_says_pass_only_without_findings() -> None:
    report = {
        "jobs": 3,
        "pods_created": 12,
        "faults": {"fail": 1},
        "leader_kills": 1,
        "apiserver_restarts": 0,
        "findings": {"mismatches": [], "held": []},
        "handover_seconds": {
            "kill-9": audit.distribution([17.0, 18.0, 20.0]),
            "sigterm": audit.distribution([]),
        },
        "passed": True,
        "seconds": 60,
        "load_average": 1.5,
    }
    line = audit.summary_line(report)
    assert line.startswith("chaos PASS: jobs=3 pods=12 faults[fail=1]")
    assert "mismatches=0 held=0" in line
    assert "handover kill-9 median=18.0s max=20.0s" in line


def test_the_first_write_after_each_takeover_is_timed_from_that_leadership() -> None:
    leaderships = [Leadership("r0", 10.0, 20.0), Leadership("r1", 37.0, 60.0)]
    writes = [Write("r0", 11.0, "create"), Write("r1", 37.4, "transition"), Write("r1", 38.0, "release")]
    assert [round(value, 1) for value in audit.first_writes(writes, leaderships)] == [0.4]


def test_a_stopped_replica_leads_until_its_log_says_it_released_the_lease(tmp_path: Path) -> None:
    # As in a full run: the standby took the Lease 0.2 s after the release, before the stopped
    # replica's process exited; its leadership ends at the release, so the two do not overlap.
    log = tmp_path / "replica-12.log"
    log.write_text(
        "===== header line\n"
        '{"time": "2026-11-25T08:14:12.931Z", "message": "released lease default/trainingjob-operator"}\n'
        '{"time": "2026-11-25T08:14:13.111Z", "message": "stopped", "exit_code": 0}\n'
    )
    replica = Replica("replica-12", Operator(tmp_path / "kubeconfig", log, ()))
    released = replica.released_at()
    assert released == log_time("2026-11-25T08:14:12.931Z")
    standby = Leadership("replica-13", log_time("2026-11-25T08:14:13.139Z"), released + 60)
    assert audit.leaders_overlap([Leadership("replica-12", released - 60, released), standby]) == []
    assert (
        Replica("replica-14", Operator(tmp_path / "kubeconfig", tmp_path / "none.log", ())).released_at()
        is None
    )
