"""The status writes of an in-place gang restart (controller/planner/inplace.py says when): the Stopping
order beside a counted restart, the Starting order of the next attempt, and the fall back to
recreating the pods.

Why apart from transitions.py: these three steps are one concern (the in-place protocol's status
fields and Events) and transitions.py holds every other decision's step close to its size bar. None
of them creates or deletes a pod but the fallback, which deletes the gang's pods as a recreating
restart does; none counts a restart: transitions.restart counted it when it wrote the Stopping order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from builders.storage import checkpoint_storage, resume_path
from controller.planner import inplace
from controller.planner.change import Change, Step, moment
from controller.planner.facts import Facts, attempt_of, resume_from, state_of
from crd.contract import Condition, State

RECREATING = "recreating the gang's pods instead of restarting them in place"


def stop_in_place(change: Change, facts: Facts, status: Mapping[str, Any], text: str, reason: str) -> Step:
    """A restart counted in `change` keeps the pods: the supervisors are told to stop the current
    attempt's processes; `text` says why and when it restarts."""
    change.status[inplace.FIELD] = inplace.order_json(attempt_of(status) + 1, inplace.STOPPING, facts.stamp)
    change.set(Condition.RESTARTING, True, reason, text)
    change.set(Condition.RUNNING, False, "Restarting", text)
    change.move_to(State.RESTARTING, text, reason, warning=True)
    return change.step()


def recreated_instead(change: Change, why: str) -> None:
    """The restart of a job that asked for InPlace recreates its pods: said in status and an Event."""
    change.status.pop(inplace.FIELD, None)
    change.status[inplace.KIND_FIELD] = inplace.RECREATE
    change.note(
        "Warning",
        inplace.FALLBACK_REASON,
        f"{why}; {RECREATING}",
    )


def recreate_pods(facts: Facts, status: Mapping[str, Any], decision: inplace.RecreatePods) -> Step:
    """Falls back to today's path: the pods go, and the next attempt creates them again (after the
    backoff of the restart, which was counted when it began)."""
    change = Change(moment(facts), status)
    text = f"{decision.reason}; {RECREATING}"
    change.status.pop(inplace.FIELD, None)
    change.status[inplace.KIND_FIELD] = inplace.RECREATE
    if state_of(status) == State.RESTARTING:
        change.note("Warning", inplace.FALLBACK_REASON, text)
        change.status["message"] = text
    else:
        # The attempt was being started in place: it restarts again, at once (its backoff was served).
        change.set(Condition.RESTARTING, True, inplace.FALLBACK_REASON, text)
        change.set(Condition.RUNNING, False, "Restarting", text)
        change.move_to(State.RESTARTING, text, inplace.FALLBACK_REASON, warning=True)
    change.set(Condition.CREATED, False, "Restarting", "waiting for the previous attempt's pods to go")
    change.stop(facts.gang(status).live, f"gang restart: {decision.reason}")
    return change.step()


def next_attempt_in_place(facts: Facts, status: Mapping[str, Any]) -> Step:
    """Every rank stopped and the backoff has passed: the next attempt starts in the same pods."""
    change = Change(moment(facts), status)
    attempt = attempt_of(status) + 1
    # RESUME_FROM as a recreated pod's environment would have it (a volume's relative path made absolute).
    reported = resume_from(facts, status)
    resume = resume_path(checkpoint_storage(facts.job), reported) if reported else None
    change.status.pop("restartAt", None)
    change.status["attempt"] = attempt
    change.status["attemptStartTime"] = facts.stamp
    change.status[inplace.FIELD] = inplace.order_json(attempt, inplace.STARTING, facts.stamp, resume)
    change.status[inplace.KIND_FIELD] = inplace.IN_PLACE
    message = f"restarting the training processes in place for attempt {attempt}"
    message += f", resuming from {resume}" if resume else ""  # as inplace.starting_message says it
    kept = f"{facts.spec.replicas.size} pod(s) kept for attempt {attempt}"
    change.set(Condition.CREATED, True, inplace.RESTARTED_REASON, kept)
    for type_ in (Condition.RESTARTING, Condition.STALLED, Condition.EVALUATOR_FAILED):
        change.clear(type_, inplace.RESTARTED_REASON, f"attempt {attempt} started")
    change.move_to(State.INITIALIZING, message, inplace.RESTARTED_REASON)
    return change.step()
