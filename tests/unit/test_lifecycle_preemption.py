"""No work lost to a preemption, as the planner sees it (controller/planner/reports.py, tracking.py): a
rank 0 told to stop saves a checkpoint in its grace period and reports it from its pod being deleted;
that report reaches the status whatever the job is doing (restarting, suspended), the pod is kept
(tracking finalizer) until its trainer has stopped, and the next attempt starts from that checkpoint.
A rank 0 killed at the end of its grace period leaves the previous checkpoint as the latest, and
status.checkpoint.interrupted says so.
"""

from __future__ import annotations

from datetime import timedelta

from controller.planner import tracking
from controller.runtime.clock import rfc3339
from tests.unit.lifecycle_steps import W0, W1, pod_creates
from tests.unit.lifecycle_world import World, env_of, world

EPOCH_2 = "/checkpoints/epoch-2"
STOPPED = "/checkpoints/epoch-2-step-57"


def running(changes: dict[str, object] | None = None) -> World:
    """A running job with checkpoints, epoch 2's reported, in a world where deletions take the grace
    period (a kubelet that waits for the trainer) and pods keep their tracking finalizer."""
    w = world(
        {
            "spec.checkpoint.enabled": True,
            "spec.failurePolicy.restartBackoff": {"initialDelaySeconds": 0},
            **(changes or {}),
        },
        graceful=True,
        tracking=True,
    )
    w.run_to_running()
    w.report(0, epoch=2, step=40, checkpoint=EPOCH_2)
    w.step(10)
    assert w.status["checkpoint"]["latest"] == EPOCH_2
    return w


def test_rank_zeros_checkpoint_saved_in_its_grace_period_is_where_the_next_attempt_starts() -> None:
    w = running()
    w.disrupt(1, "EvictionByEvictionAPI")  # worker 1 evicted: the gang restarts (a disruption)
    w.step(1)
    assert w.state == "Restarting"
    assert w.pod(0)["metadata"].get("deletionTimestamp"), "rank 0 is being deleted too"
    # Rank 0's trainer got SIGTERM: it saves at the step it was at and reports it; the report waits for
    # the progress rate limit while the trainer runs, and its pod is held, so it cannot be lost.
    w.report(0, epoch=2, step=57, checkpoint=STOPPED)
    held = w.step(1)
    assert W0 not in {release.name for release in held.releases}, "its trainer still runs"
    w.advance(5)
    w.step()
    assert w.status["checkpoint"]["latest"] == STOPPED
    assert w.status["step"] == 57
    w.exit(0, 143)  # and exits
    w.finish_terminating()
    released = w.step()
    assert W0 in {release.name for release in released.releases}
    w.settle()
    assert w.status["restarts"] == {"disruption": 1}, "a preemption uses no backoffLimit"
    assert w.status["attempt"] == 1
    assert {env_of(w.pod(index))["RESUME_FROM"] for index in (0, 1)} == {STOPPED}


def test_a_report_that_came_with_the_pods_last_state_is_not_lost() -> None:
    """The report and the trainer's end arrive together (the operator looked only after both): the
    status takes the report in the plan that lets the pod go."""
    w = running()
    w.update_spec(suspend=True)
    w.step(1)
    assert w.state == "Suspended"
    w.report(0, epoch=2, step=57, checkpoint=STOPPED)
    w.exit(0, 143)
    w.exit(1, 143)
    result = w.step(1)
    assert w.status["checkpoint"]["latest"] == STOPPED
    assert sorted(release.name for release in result.releases) == [W0, W1]
    w.finish_terminating()
    w.update_spec(suspend=False)
    w.step()
    w.settle()
    assert {env_of(pod)["RESUME_FROM"] for pod in w.live_pods()} == {STOPPED}


def test_a_rank_zero_killed_at_the_end_of_its_grace_period_leaves_the_previous_checkpoint() -> None:
    w = running()
    w.exit(1, 1)  # worker 1 fails: the gang restarts, rank 0 is deleted with a 60 s grace period
    w.step(1)
    deleted = w.now
    # Rank 0 started saving on SIGTERM, but the save outlasts the grace period: SIGKILL, exit 137, and
    # the checkpoint is never reported.
    w.exit(0, 137, finished_at=deleted + timedelta(seconds=60))
    w.advance(60)
    result = w.step()
    checkpoint = w.status["checkpoint"]
    assert checkpoint["latest"] == EPOCH_2
    assert checkpoint["interrupted"] == (
        "rank 0 (mnist-worker-0) was killed at the end of its 60s grace period (exit code 137) before its "
        "trainer exited: a checkpoint it was saving then was not reported; the next attempt resumes from "
        f"{EPOCH_2}"
    )
    assert [(event.type, event.reason) for event in result.events] == [("Warning", "CheckpointInterrupted")]
    assert W0 in {release.name for release in result.releases}
    w.finish_terminating()
    w.step()
    w.settle()
    assert env_of(w.pod(0))["RESUME_FROM"] == EPOCH_2
    assert w.status["checkpoint"]["interrupted"], "said once, and kept until a newer checkpoint"
    # A newer checkpoint clears it.
    w.start()
    w.report(0, epoch=3, step=60, checkpoint="/checkpoints/epoch-3")
    w.step(10)
    assert w.status["checkpoint"]["latest"] == "/checkpoints/epoch-3"
    assert "interrupted" not in w.status["checkpoint"]


def test_a_rank_zero_killed_after_it_reported_its_stop_checkpoint_lost_nothing() -> None:
    w = running()
    w.exit(1, 1)
    w.step(1)
    w.advance(5)
    w.report(0, epoch=2, step=57, checkpoint=STOPPED, checkpointTime=rfc3339(w.now))
    w.step()
    assert w.status["checkpoint"]["latest"] == STOPPED
    # Then it hangs on its way out, and SIGKILL ends it: the checkpoint was saved and reported.
    w.exit(0, 137, finished_at=w.now + timedelta(seconds=55))
    result = w.step(55)
    assert "interrupted" not in w.status["checkpoint"]
    assert "CheckpointInterrupted" not in [event.reason for event in result.events]


def test_an_oom_kill_is_not_a_grace_period_overrun() -> None:
    w = running()
    w.exit(1, 1)
    w.step(1)
    w.exit(0, 137, reason="OOMKilled", finished_at=w.now + timedelta(seconds=5))
    w.step(5)
    assert "interrupted" not in w.status["checkpoint"]


def test_a_pod_being_deleted_is_held_while_its_trainer_may_report() -> None:
    w = running()
    pod = w.pod(0)
    deadline = w.now + timedelta(seconds=60)
    pod["metadata"]["deletionTimestamp"] = rfc3339(deadline)
    pod["metadata"]["deletionGracePeriodSeconds"] = 60
    assert tracking.releases([pod], w.now) == ()
    assert tracking.releases([pod], deadline) != (), "its grace period is over"
    w.exit(0, 143)
    assert tracking.releases([w.pod(0)], w.now) != (), "its trainer stopped"
    # Without a clock (the old rule): any pod being deleted.
    assert tracking.releases([pod]) != ()


def test_a_restart_creates_the_new_gang_only_after_rank_zero_reported() -> None:
    w = running()
    w.exit(1, 1)
    w.step(1)
    w.advance(30)
    assert not pod_creates(w.step()), "the old gang is still there"
    w.report(0, epoch=2, step=51, checkpoint="/checkpoints/epoch-2-step-51")
    w.exit(0, 143)
    w.finish_terminating()
    w.step()  # the report recorded, the pod let go
    w.settle()
    assert env_of(w.pod(0))["RESUME_FROM"] == "/checkpoints/epoch-2-step-51"
    assert w.status["restarts"] == {"failure": 1}
