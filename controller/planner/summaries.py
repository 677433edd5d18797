"""The one-line summaries of a gang that cannot start: how many pods wait for a node and why, and which
container cannot start and why.

Why apart: the state machine (decide.py) and the Scheduled condition (scheduled.py) both say these, and
they only read pods (podstate.py), never the state machine.
"""

from __future__ import annotations

from controller.planner import podstate
from controller.planner.gang import Gang


def unschedulable_summary(gang: Gang) -> str:
    """How many pods wait for a node, and the scheduler's reason for one of them: an informative one
    (which resource, which selector) before coscheduling's optimistic rejection of the whole gang."""
    unscheduled = gang.unscheduled
    known = [message for message in map(podstate.unschedulable_message, unscheduled) if message]
    known.sort(key=lambda message: podstate.OPTIMISTIC_REJECTION in message)
    if known:
        return f"{len(unscheduled)}/{gang.size} pods unschedulable: {known[0]}"
    return f"{len(unscheduled)}/{gang.size} pods waiting to be scheduled"


def waiting_summary(gang: Gang) -> tuple[str, str] | None:
    """(the kubelet's waiting reason, a sentence naming the pod and container) for the first rank whose
    containers cannot start (podstate.waiting_problem), with how many more there are; None if none."""
    problems = [
        (pod["metadata"]["name"], waiting)
        for pod in gang.ranks.values()
        if podstate.worker_phase(pod) == "Pending"
        for waiting in [podstate.waiting_problem(pod)]
        if waiting is not None
    ]
    if not problems:
        return None
    name, waiting = min(problems, key=lambda problem: problem[0])
    text = f"pod {name}: container {waiting.container} is waiting: {waiting.reason}"
    if waiting.message:
        text += f": {waiting.message}"
    if len(problems) > 1:
        text += f" (and {len(problems) - 1} more pod(s) waiting)"
    return waiting.reason, text
