"""make chaos's in-place restarts without a cluster: which jobs restart in place and what faults they
get, what the supervisors' stand-in answers, and the audit's in-place invariants (pods kept unless a
fallback Event says why, no rank left on the old attempt)."""

from __future__ import annotations

import json
from typing import Any

from controller.planner import podstate
from crd import contract
from testbed.harness.chaos import audit
from testbed.harness.chaos.cluster import job_manifest
from testbed.harness.chaos.plan import Disturbance, Fault, FaultKind, Ledger, make_plan
from testbed.harness.chaos.supervisors import failed_report, reports_due

JsonDict = dict[str, Any]


def pod(
    name: str,
    *,
    attempt: int = 0,
    run: JsonDict | None = None,
    running: bool = True,
    deleting: bool = False,
    uid: str = "",
) -> JsonDict:
    metadata: JsonDict = {
        "name": name,
        "uid": uid or f"uid-{name}",
        "labels": {contract.ATTEMPT_LABEL: str(attempt)},
    }
    if run is not None:
        metadata["annotations"] = {contract.RUN_ANNOTATION: json.dumps(run)}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-29T17:00:00Z"
    state = {"running": {"startedAt": "2026-11-29T17:00:00Z"}} if running else {"terminated": {"exitCode": 0}}
    return {
        "metadata": metadata,
        "status": {"containerStatuses": [{"name": contract.CONTAINER_NAME, "state": state}]},
    }


def reported(patch: JsonDict) -> JsonDict:
    text = patch["metadata"]["annotations"][contract.RUN_ANNOTATION]
    report: JsonDict = json.loads(text)
    report.pop("at")
    return report


def plan(seed: int, jobs: int = 16, in_place_every: int = 4) -> Any:
    return make_plan(
        seed,
        jobs,
        leader_kills=6,
        sigterm_kills=2,
        apiserver_restarts=2,
        node_losses=1,
        faults_per_round=6,
        job_deletions=4,
        in_place_every=in_place_every,
    )


def test_every_fourth_recreating_job_restarts_in_place_and_only_ever_fails_in_place() -> None:
    chaos = plan(5)
    in_place = {job.name for job in chaos.jobs if job.in_place}
    assert in_place == {"chaos-001", "chaos-005", "chaos-013"}  # chaos-009 is strict
    assert not any(job.strict and job.in_place for job in chaos.jobs)
    seen = set()
    for round_ in chaos.rounds:
        for position, fault in enumerate(round_.faults):
            assert (fault.job in in_place) == (fault.kind is FaultKind.FAIL_IN_PLACE)
            seen.add(fault.job)
            if position == 0 and round_.disturbance is Disturbance.KILL9:
                assert fault.kind is FaultKind.PREEMPT_PEER_FAILS  # on a job that recreates
    assert in_place <= seen
    assert not any(job.in_place for job in plan(5, in_place_every=0).jobs)


def test_an_in_place_failure_is_one_failure_restart() -> None:
    ledger = Ledger()
    ledger.fault(Fault("a", FaultKind.FAIL_IN_PLACE))
    assert ledger.expected("a") == {"failure": 1}
    assert ledger.faults["fail-in-place"] == 1


def test_an_in_place_job_asks_for_it_and_keeps_the_default_command() -> None:
    spec = job_manifest("chaos-001", strict=False, in_place=True)["spec"]
    assert spec["failurePolicy"]["restartStrategy"] == "InPlace"
    assert "command" not in spec
    assert "restartStrategy" not in job_manifest("chaos-002", strict=False)["spec"]["failurePolicy"]


def test_the_stand_in_reports_a_new_pod_running_and_answers_stopping_then_starting() -> None:
    fresh = pod("new", attempt=2)
    running = pod("r0", attempt=1, run={"attempt": 1, "state": "Running"})
    failed = pod("r1", attempt=1, run={"attempt": 1, "state": "Exited", "exitCode": 1})
    gone = pod("r2", attempt=1, run={"attempt": 1, "state": "Running"}, deleting=True)
    ended = pod("r3", attempt=1, running=False)

    due = reports_due(None, [fresh, running, failed, gone, ended])
    assert {name: reported(patch) for name, patch in due.items()} == {
        "new": {"attempt": 2, "state": "Running"}
    }
    stopping = {"attempt": 2, "phase": "Stopping"}
    due = reports_due(stopping, [running, failed, gone])
    assert {name: reported(patch) for name, patch in due.items()} == {
        "r0": {"attempt": 1, "state": "Exited", "exitCode": 143}
    }
    starting = {"attempt": 2, "phase": "Starting"}
    due = reports_due(starting, [running, failed])
    assert {name: reported(patch) for name, patch in due.items()} == {
        "r0": {"attempt": 2, "state": "Running"},
        "r1": {"attempt": 2, "state": "Running"},
    }
    # An order it already answered is answered no more (a re-read replays it).
    started = pod("r0", attempt=1, run={"attempt": 2, "state": "Running"})
    assert reports_due(starting, [started]) == {}


def test_a_failure_in_place_is_reported_for_the_attempt_the_rank_runs() -> None:
    restarted = pod("r1", attempt=1, run={"attempt": 3, "state": "Running"})
    assert reported(failed_report(restarted)) == {"attempt": 3, "state": "Exited", "exitCode": 1}
    assert reported(failed_report(pod("r1", attempt=2))) == {"attempt": 2, "state": "Exited", "exitCode": 1}
    patched = pod("r1", attempt=1, run=reported(failed_report(restarted)))
    assert podstate.run(patched) == podstate.Run(3, "Exited", 1, "")


def test_pods_replaced_by_an_in_place_restart_need_a_fallback_event_that_says_why() -> None:
    before = {"a": {"a-worker-0": "u0", "a-worker-1": "u1"}, "b": {"b-worker-0": "v0"}}
    assert audit.pods_replaced(before, before, {}) == []
    after = {"a": {"a-worker-0": "u0", "a-worker-1": "u9"}, "b": {"b-worker-0": "v0"}}
    assert audit.pods_replaced(before, after, {}) == [
        "a: pods replaced by an in-place restart with no fallback Event saying why"
    ]
    assert audit.pods_replaced(before, after, {"a": [" "]}) != []
    reason = ["pod a-worker-1 did not report its training process stopped within 70s"]
    assert audit.pods_replaced(before, after, {"a": reason}) == []


def test_no_rank_of_an_in_place_job_may_stay_on_the_old_attempt() -> None:
    statuses: dict[str, JsonDict] = {
        "a": {"state": "Running", "attempt": 2},
        "done": {"state": "Completed", "attempt": 2},
    }
    on_time = [
        pod("a-worker-0", attempt=1, run={"attempt": 2, "state": "Running"}),
        pod("a-worker-1", attempt=2, run={"attempt": 2, "state": "Running"}),
        pod("a-worker-2", attempt=1, run={"attempt": 1, "state": "Running"}, deleting=True),
    ]
    assert audit.left_on_old_attempt(statuses, {"a": on_time}, ["a"]) == []
    behind = [
        pod("a-worker-0", attempt=1, run={"attempt": 1, "state": "Running"}),
        pod("a-worker-1", attempt=1, run={"attempt": 2, "state": "Exited", "exitCode": 1}),
        pod("a-worker-2", attempt=2),
    ]
    assert audit.left_on_old_attempt(statuses, {"a": behind, "done": behind}, ["a", "done"]) == [
        "a: pod a-worker-0 reports Running for attempt 1, status.attempt 2",
        "a: pod a-worker-1 reports Exited for attempt 2, status.attempt 2",
        "a: pod a-worker-2 reports nothing, status.attempt 2",
    ]
    assert not audit.Findings(in_place=["a: ..."]).clean
