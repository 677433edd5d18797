"""The Scheduled condition: whether every pod of the job's current attempt is bound to a node.

Why a condition of its own: the state says how far the gang got (Pending, Initializing, Running), but
"are my pods placed?" is what `kubectl wait --for=condition=Scheduled` and dashboards ask, and it has a
reason of its own while it is not true: the scheduler's explanation ("0/4 nodes are available: ...").
It restates the pods, so it is derived once per reconcile from the final status (plan.py), like
status.workers, and never drives a decision.

Scheduled is True once every rank of the current attempt exists and is bound; False while a rank is
missing, unscheduled, or the gang is being replaced (a restart, a suspension), so a new attempt starts
from False. A finished job keeps what it last said.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.planner import podstate, volcano
from controller.planner.change import Change, moment
from controller.planner.facts import Facts, attempt_of, state_of
from controller.planner.summaries import unschedulable_summary
from crd.contract import FINISHED_STATES, Condition, State

JsonDict = dict[str, Any]


def scheduling(facts: Facts, status: Mapping[str, Any]) -> tuple[bool, str, str] | None:
    """(scheduled, reason, message) for the status's attempt, or None to leave the condition as it is."""
    state = state_of(status)
    if state is None or state in FINISHED_STATES:
        return None
    attempt = attempt_of(status)
    if state == State.SUSPENDED:
        return False, "Suspended", "spec.suspend is true: the job has no pods"
    if status.get("restartAt") or state == State.RESTARTING:
        return False, "Restarting", f"the pods of attempt {attempt} are being replaced"
    gang = facts.gang(status)
    total = gang.size
    missing = gang.to_create(status)
    if missing:
        created = total - len(missing)
        return False, "PodsNotCreated", f"{created}/{total} pods of attempt {attempt} created"
    if gang.unscheduled:
        # Volcano's explanation of the whole gang, when it gave one; else the pods' own.
        waiting = volcano.pod_group_wait(facts)
        unschedulable = any(podstate.unschedulable_message(pod) for pod in gang.unscheduled)
        reason, message = waiting or (
            "Unschedulable" if unschedulable else "PodsPending",
            unschedulable_summary(gang),
        )
        return False, reason, message
    bound = len(gang.ranks)
    return True, "AllPodsScheduled", f"{bound}/{bound} pods of attempt {attempt} are bound to nodes"


def show_scheduled(facts: Facts, status: Mapping[str, Any]) -> JsonDict:
    """`status` with the Scheduled condition set from the pods (unchanged when nothing differs)."""
    answer = scheduling(facts, status)
    if answer is None:
        return dict(status)
    change = Change(moment(facts), status)
    change.set(Condition.SCHEDULED, *answer)
    return change.status
