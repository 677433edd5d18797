"""controller.planner.plan through in-place gang restarts (spec.failurePolicy.restartStrategy InPlace) in
the fake cluster (tests.unit.lifecycle_world): the Stopping and Starting orders in status, no pod
written, the restart counted once, and each fallback to recreating the pods.

The supervisors' side is played here by writing each pod's run annotation as the supervisor patches
it (trainer/trainingjob_progress/supervise.py; its own tests run real processes).
"""

from __future__ import annotations

import copy
import itertools
import json
from datetime import timedelta
from typing import Any

import pytest

from controller.planner import podstate
from controller.planner.model import Guards
from controller.runtime.clock import parse_time, rfc3339
from crd import contract
from tests.unit.lifecycle_steps import W0, W1, assert_steady, created_pod_names, pod_creates
from tests.unit.lifecycle_world import World, names, world

IN_PLACE = {"spec.failurePolicy.restartStrategy": "InPlace"}
GRACE = contract.TERMINATION_GRACE_SECONDS
STOP_DEADLINE = GRACE + contract.IN_PLACE_STOP_MARGIN_SECONDS


def report(w: World, index: int, attempt: int, state: str, code: int | None = None) -> None:
    """Rank `index`'s supervisor patches its pod's run annotation."""
    body: dict[str, Any] = {"attempt": attempt, "state": state, "at": rfc3339(w.now)}
    if code is not None:
        body["exitCode"] = code
    w.pod(index)["metadata"].setdefault("annotations", {})[contract.RUN_ANNOTATION] = json.dumps(body)


def running(changes: dict[str, Any] | None = None, workers: int = 2) -> World:
    """An InPlace job whose ranks all run attempt 0 under their supervisors."""
    w = world({**IN_PLACE, **(changes or {})}, workers=workers)
    w.run_to_running()
    for index in range(workers):
        report(w, index, 0, "Running")
    assert_steady(w, 0)
    return w


def order(w: World) -> dict[str, Any]:
    return dict(w.status["inPlaceRestart"])


def event_reasons(w: World, since: int = 0) -> list[tuple[str, str]]:
    return [(event.type, event.reason) for event in w.events[since:]]


def stopped(w: World) -> World:
    """Rank 1's process failed (exit 1); the restart is ordered in place; rank 0 stops (SIGTERM)."""
    report(w, 1, 0, "Exited", 1)
    w.step()
    report(w, 0, 0, "Exited", 143)
    return w


def restarted(w: World) -> World:
    """Stopped, then stepped to restartAt: the next attempt is started in place."""
    stopped(w)
    restart_at = parse_time(w.status["restartAt"])
    w.advance((restart_at - w.now).total_seconds())
    w.step()
    return w


def test_a_rank_whose_process_exits_1_orders_the_ranks_to_stop_and_deletes_no_pod() -> None:
    w = running()
    report(w, 1, 0, "Exited", 1)
    pods_before = copy.deepcopy(w.pods)
    result = w.step()
    assert result.deletes == []
    assert result.creates == []
    assert w.pods == pods_before
    status = w.status
    assert status["state"] == "Restarting"
    assert status["restarts"] == {"failure": 1}
    assert status["restartCount"] == 1
    assert status["lastRestartReason"] == "PodFailed"
    assert order(w) == {"attempt": 1, "phase": "Stopping", "since": rfc3339(w.now)}
    assert "pod mnist-worker-1, container trainer, exit code 1" in status["message"]
    assert "restarting the whole gang in place in" in status["message"]
    assert "lastRestartKind" not in status  # said when the kind is known: at Starting or a fallback
    assert [(event.type, event.reason) for event in result.events] == [("Warning", "PodFailed")]
    assert 10 <= (parse_time(status["restartAt"]) - w.now).total_seconds() <= 11
    # Planned again, nothing more is written and the restart is not counted again.
    assert_steady(w)


def test_the_same_inputs_planned_again_give_the_same_writes() -> None:
    """An operator restarted before its status write landed plans the same step from the same inputs."""
    w = running()
    report(w, 1, 0, "Exited", 1)
    first, second = w.plan(), w.plan()
    assert first == second
    assert first.status["restarts"] == {"failure": 1}


def test_the_next_attempt_waits_for_every_rank_to_stop_and_for_the_backoff() -> None:
    w = running()
    report(w, 1, 0, "Exited", 1)
    w.step()
    w.advance(20)  # past the backoff; rank 0 still runs attempt 0
    result = w.step()
    assert result.deletes == []
    assert result.creates == []
    assert w.state == "Restarting"
    assert "restarting the whole gang in place in" in w.status["message"]
    assert result.requeue_after == pytest.approx(STOP_DEADLINE - 20)
    assert_steady(w)


def test_without_a_backoff_the_next_attempt_starts_as_soon_as_the_last_rank_stopped() -> None:
    """No restartAt when the backoff is zero: a time rounded up to the second would hold the Starting
    order for up to a second after every rank had stopped."""
    w = running({"spec.failurePolicy.restartBackoff": {"initialDelaySeconds": 0, "maxDelaySeconds": 0}})
    w.advance(0.25)
    report(w, 1, 0, "Exited", 1)
    w.step()
    assert order(w)["phase"] == "Stopping"
    assert "restartAt" not in w.status
    assert "restarting the whole gang in place in 0s" in w.status["message"]
    w.advance(0.1)
    report(w, 0, 0, "Exited", 143)
    result = w.step()
    assert result.creates == []
    assert result.deletes == []
    assert (order(w)["phase"], order(w)["attempt"], w.status["attempt"]) == ("Starting", 1, 1)
    assert w.status["restarts"] == {"failure": 1}


def test_every_rank_stopped_and_the_backoff_passed_starts_the_next_attempt_in_place() -> None:
    w = running()
    stopped(w)
    restart_at = parse_time(w.status["restartAt"])
    assert w.step().creates == []  # stopped, but the backoff is not over
    assert w.state == "Restarting"
    w.job["status"]["checkpoint"] = {"latest": "/checkpoints/epoch-3"}
    w.advance((restart_at - w.now).total_seconds())
    events_before = len(w.events)
    result = w.step()
    assert result.creates == []
    assert result.deletes == []
    status = w.status
    assert status["attempt"] == 1
    assert status["restartCount"] == 1
    assert status["restarts"] == {"failure": 1}
    assert "restartAt" not in status
    assert status["lastRestartKind"] == "InPlace"
    assert order(w) == {
        "attempt": 1,
        "phase": "Starting",
        "since": rfc3339(w.now),
        "resumeFrom": "/checkpoints/epoch-3",
    }
    assert status["state"] == "Initializing"
    starting = "restarting the training processes in place for attempt 1, resuming from /checkpoints/epoch-3"
    assert status["message"] == starting
    assert event_reasons(w, events_before) == [("Normal", "RestartedInPlace")]
    assert "resuming from /checkpoints/epoch-3" in w.events[-1].message
    restarting = w.condition("Restarting")
    assert restarting is not None
    assert restarting["status"] == "False"
    assert result.requeue_after == pytest.approx(contract.IN_PLACE_START_SECONDS)
    assert_steady(w)


def test_a_relative_resume_from_reaches_the_supervisors_as_a_recreated_pods_environment_has_it() -> None:
    """spec.checkpoint.resumeFrom relative to the checkpoint volume (no checkpoint reported yet): the
    Starting order carries the absolute path, as RESUME_FROM in a recreated pod would."""
    w = running({"spec.checkpoint.enabled": True, "spec.checkpoint.resumeFrom": "epoch-1"})
    restarted(w)
    assert order(w)["resumeFrom"] == "/checkpoints/epoch-1"


def test_the_attempt_runs_once_every_rank_reports_it_running() -> None:
    w = restarted(running())
    report(w, 0, 1, "Running")
    assert_steady(w, 0)  # one rank's report changes nothing written
    assert w.state == "Initializing"
    assert w.status["message"] == "restarting the training processes in place for attempt 1"
    report(w, 1, 1, "Running")
    result = w.step()
    assert result.creates == []
    assert result.deletes == []
    assert w.state == "Running"
    assert w.status["message"] == "2/2 workers running"
    running_condition = w.condition("Running")
    assert running_condition is not None
    assert running_condition["status"] == "True"
    assert w.status["restartCount"] == 1
    assert_steady(w)
    # The order stays (the supervisors ignore an order for an attempt they run) and times nothing.
    assert order(w)["phase"] == "Starting"
    later = w.plan().requeue_after
    assert later is None or later > contract.IN_PLACE_START_SECONDS


def test_a_rank_failing_again_while_the_attempt_starts_is_a_new_failure_counted_once() -> None:
    w = restarted(running())
    report(w, 0, 1, "Running")
    report(w, 1, 1, "Exited", 2)
    result = w.step()
    assert result.deletes == []
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"failure": 2}
    assert w.status["restartCount"] == 2
    assert order(w) == {"attempt": 2, "phase": "Stopping", "since": rfc3339(w.now)}
    assert "exit code 2" in w.status["message"]
    assert_steady(w)


def test_the_previous_attempts_exit_is_no_failure_of_the_new_one() -> None:
    w = restarted(running())
    report(w, 0, 1, "Running")
    w.step(5)  # rank 1 still shows attempt 0's Exited 1
    assert w.state == "Initializing"
    assert w.status["restarts"] == {"failure": 1}


def test_success_is_every_process_exiting_0_and_the_containers_completing() -> None:
    w = restarted(running())
    report(w, 0, 1, "Running")
    report(w, 1, 1, "Running")
    w.step()
    for index in (0, 1):
        report(w, index, 1, "Exited", 0)
    w.step()
    assert w.state == "Running"  # the supervisors exit 0 next: the containers' ends decide, as today
    w.succeed()
    result = w.step()
    assert w.state == "Completed"
    assert result.creates == []


def assert_recreated(w: World, result: Any, why: str, *, restarts: dict[str, int] | None = None) -> None:
    """The fallback: a Warning Event saying why, every live pod deleted, the restart not counted again."""
    fallbacks = [event for event in result.events if event.reason == "InPlaceRestartFallback"]
    assert len(fallbacks) == 1, result.events
    assert fallbacks[0].type == "Warning"
    assert why in fallbacks[0].message
    assert "recreating the gang's pods instead of restarting them in place" in fallbacks[0].message
    assert w.state == "Restarting"
    assert w.status["lastRestartKind"] == "Recreate"
    assert "inPlaceRestart" not in w.status
    assert w.status["restarts"] == (restarts or {"failure": 1})
    assert w.status["restartCount"] == sum((restarts or {"failure": 1}).values())


def recreated_next(w: World, attempt: int) -> None:
    """Today's path goes on: once the backoff has passed the next attempt's pods are created."""
    w.advance(max(0.0, (parse_time(w.status.get("restartAt") or rfc3339(w.now)) - w.now).total_seconds()))
    result = w.step()
    assert created_pod_names(result) == [W0, W1]
    assert all(
        pod["metadata"]["labels"][contract.ATTEMPT_LABEL] == str(attempt) for pod in pod_creates(result)
    )


def test_a_rank_silent_past_the_stop_deadline_falls_back_to_recreating() -> None:
    w = running()
    report(w, 1, 0, "Exited", 1)
    w.step()
    w.advance(STOP_DEADLINE - 1)
    assert w.step().deletes == []
    w.advance(1)
    result = w.step()
    assert names(result.deletes) == [W0, W1]
    assert_recreated(
        w, result, f"pod {W0} did not report its training process stopped within {STOP_DEADLINE}s"
    )
    recreated_next(w, 1)


def test_a_rank_silent_past_the_start_deadline_falls_back_to_recreating() -> None:
    w = restarted(running())
    report(w, 0, 1, "Running")
    w.advance(contract.IN_PLACE_START_SECONDS)
    result = w.step()
    assert names(result.deletes) == [W0, W1]
    assert_recreated(w, result, f"pod {W1} did not report attempt 1 running within")
    assert w.status["attempt"] == 1
    recreated_next(w, 2)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("deleted", f"pod {W0} is missing"),
        ("evicted", f"pod {W0} is being deleted"),
        ("terminated", f"the trainer container of pod {W0} is not running (its supervisor ended)"),
        ("resized", "numWorkers changed to 3"),
        ("strategy", "spec.failurePolicy.restartStrategy is no longer InPlace"),
    ],
)
def test_a_pod_lost_or_a_changed_spec_while_stopping_falls_back_to_recreating(change: str, why: str) -> None:
    w = running()
    report(w, 1, 0, "Exited", 1)
    w.step()
    if change == "deleted":
        del w.pods[W0]
    elif change == "evicted":
        w.disrupt(0, "EvictionByEvictionAPI")
    elif change == "terminated":
        w.exit(0, 137)
    elif change == "resized":
        w.update_spec(numWorkers=3)
    else:
        w.update_spec(**{"failurePolicy.restartStrategy": "Recreate"})
    result = w.step()
    assert_recreated(w, result, why)
    assert W1 in names(result.deletes)


def test_a_pod_deleted_while_the_attempt_starts_falls_back_without_a_second_count() -> None:
    w = restarted(running())
    report(w, 1, 1, "Running")
    del w.pods[W0]
    result = w.step()
    assert names(result.deletes) == [W1]
    assert_recreated(w, result, f"pod {W0} is missing")
    recreated_next(w, 2)


def test_an_evicted_rank_restarts_by_recreating_as_a_disruption() -> None:
    w = running()
    w.disrupt(1, "EvictionByEvictionAPI")
    result = w.step()
    assert_recreated(w, result, "a disruption took a pod away", restarts={"disruption": 1})
    assert W0 in names(result.deletes)


def test_a_rank_whose_container_ended_after_its_supervisor_reported_restarts_by_recreating() -> None:
    w = running()
    w.exit(1, 137)  # the supervisor itself was killed: its last report stands
    result = w.step()
    assert_recreated(w, result, f"the trainer container of pod {W1} is not running")
    assert names(result.deletes) == [W0, W1]


def test_an_elastic_job_always_recreates_and_says_why() -> None:
    w = world({**IN_PLACE, "spec.elastic": {"minWorkers": 2, "maxWorkers": 4}}, workers=3)
    w.run_to_running()
    assert not any("supervise" in str(pod["spec"]["containers"][0].get("command")) for pod in w.pods.values())
    w.exit(2, 1)
    result = w.step()
    assert_recreated(w, result, "an elastic job's torchrun restarts its workers by its own rendezvous rules")


def test_an_mpi_job_always_recreates_and_says_why() -> None:
    from tests.unit.test_lifecycle_mpi import mpi_world, run_to_running  # noqa: PLC0415 - its world

    w = mpi_world(IN_PLACE)
    run_to_running(w)
    assert not any("supervise" in str(pod["spec"]["containers"][0].get("command")) for pod in w.pods.values())
    w.exit(1, 1)
    result = w.step()
    assert_recreated(w, result, "an MPI job's launcher drives its workers over SSH")
    assert len(result.deletes) == 3


def test_a_stall_restarts_in_place() -> None:
    w = running({"spec.monitoring.progressDeadlineSeconds": 60, "spec.monitoring.restartOnStall": True})
    w.advance(61)
    result = w.step()
    assert result.deletes == []
    assert w.status["restarts"] == {"stall": 1}
    assert order(w)["phase"] == "Stopping"


def test_a_recreate_job_writes_no_in_place_field() -> None:
    w = world()
    w.run_to_running()
    w.exit(1, 1)
    result = w.step()
    assert not [event for event in result.events if event.reason == "InPlaceRestartFallback"]
    assert "lastRestartKind" not in w.status
    assert "inPlaceRestart" not in w.status
    w.advance(timedelta(seconds=11).total_seconds())
    w.step()
    assert "lastRestartKind" not in w.status


def test_suspending_during_an_in_place_restart_drops_the_order() -> None:
    w = running()
    report(w, 1, 0, "Exited", 1)
    w.step()
    w.update_spec(suspend=True)
    result = w.step()
    assert "inPlaceRestart" not in w.status
    assert names(result.deletes) == [W0, W1]


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1]",
        '{"attempt": "1", "state": "Running"}',
        '{"attempt": -1, "state": "Running"}',
        '{"attempt": 1, "state": "Paused"}',
        '{"attempt": 1, "state": "Exited"}',
        '{"attempt": true, "state": "Running"}',
        json.dumps({"attempt": 1, "state": "Running", "at": "x" * 2000}),
    ],
)
def test_a_malformed_run_annotation_is_no_report(text: str) -> None:
    pod = {
        "metadata": {"labels": {contract.ATTEMPT_LABEL: "0"}, "annotations": {contract.RUN_ANNOTATION: text}}
    }
    assert podstate.run(pod) is None
    assert podstate.attempt(pod) == 0


def test_the_attempt_a_pod_runs_is_its_supervisors_when_later_than_its_label() -> None:
    def pod(label: str, attempt: int) -> dict[str, Any]:
        run = json.dumps({"attempt": attempt, "state": "Running", "at": "2026-03-01T12:00:00.000Z"})
        return {
            "metadata": {
                "labels": {contract.ATTEMPT_LABEL: label},
                "annotations": {contract.RUN_ANNOTATION: run},
            }
        }

    assert podstate.attempt(pod("1", 3)) == 3
    assert podstate.attempt(pod("4", 3)) == 4  # a report of an earlier attempt does not lower it


def test_a_supervisors_report_is_an_urgent_pod_update() -> None:
    w = running()
    old = copy.deepcopy(w.pod(1))
    report(w, 1, 0, "Exited", 1)
    assert podstate.changes_the_gang(old, w.pod(1), list(w.pods.values()))
    assert not podstate.changes_the_gang(w.pod(1), copy.deepcopy(w.pod(1)), list(w.pods.values()))


def test_a_large_gang_restarts_in_place_with_a_few_status_writes_and_no_pod_write() -> None:
    """Each rank's report is reconciled on its own (the worst case): only the restart, the start of the
    next attempt and its running again change the status; no pod is created or deleted."""
    workers = 16
    w = running(workers=workers)
    plans_before = len(w.plans)
    report(w, 7, 0, "Exited", 1)
    w.step()
    for index in range(workers):
        if index != 7:
            report(w, index, 0, "Exited", 143)
            w.step()
    w.advance((parse_time(w.status["restartAt"]) - w.now).total_seconds())
    w.step()
    for index in range(workers):
        report(w, index, 1, "Running")
        w.step()
    assert w.state == "Running"
    assert w.status["attempt"] == 1
    plans = w.plans[plans_before:]
    assert not any(plan.creates or plan.deletes for plan in plans)
    statuses = [w.plans[plans_before - 1].status, *(plan.status for plan in plans)]
    changed = sum(1 for before, after in itertools.pairwise(statuses) if before != after)
    assert changed == 3, changed


def test_a_resize_recreates_the_pods_and_says_why() -> None:
    w = running()
    w.update_spec(numWorkers=3)
    result = w.step()
    fallbacks = [event for event in result.events if event.reason == "InPlaceRestartFallback"]
    assert [event.message.split(";")[0] for event in fallbacks] == ["the gang is resized"]
    assert w.status["lastRestartKind"] == "Recreate"
    assert names(result.deletes) == [W0, W1]


def test_without_the_trainers_admission_policy_a_restart_recreates_at_once() -> None:
    """The operator takes the trainers' rights away while the policy is missing: no supervisor could
    report or watch, so the restart does not wait for their deadline."""
    w = running()
    w.guards = Guards(missing={contract.TRAINER_POLICY: f"{contract.TRAINER_POLICY} is not installed"})
    report(w, 1, 0, "Exited", 1)
    result = w.step()
    assert_recreated(w, result, f"while the admission policy {contract.TRAINER_POLICY} is missing")


def test_a_permanent_failure_keeps_the_failed_ranks_pod_for_its_logs() -> None:
    """As without a supervisor: the running rank is stopped, the failed one kept (its supervisor ends
    its container once the job is Failed)."""
    w = running({"spec.failurePolicy.restartPolicy": "Never"})
    report(w, 1, 0, "Exited", 2)
    result = w.step()
    assert w.state == "Failed"
    assert "exit code 2" in w.status["message"]
    assert names(result.deletes) == [W0]
