"""What Volcano says about a gang-scheduled job: its Queue (missing or closed holds the pods back) and
its PodGroup (why the gang waits).

Why: Volcano's scheduler skips a PodGroup whose Queue does not exist without a word, and only
Volcano's admission webhook for its own Job kind refuses work for a closed queue, so a TrainingJob
whose queue is wrong would wait for ever unexplained. The operator reads the Queues
(controller/volcano_watches.py) and, while the job's queue is missing or not open, creates none of its
pods (they would only wait, or, in a closed queue, be scheduled against the queue's closing) and says
why: the Created condition False with reason VolcanoQueueNotFound or VolcanoQueueClosed, naming the
queue, and one Warning Event each time the reason changes. Once the queue is there and open, the
pods are created.

While a gang waits, Volcano explains it on the PodGroup (phase Pending: not admitted into its queue,
whose capability or the cluster has no room for minResources; Inqueue: admitted, its pods not yet
placed), in an Unschedulable condition; the job's Scheduled condition carries that reason and message.

A queue only Volcano reads: under scheduler-plugins' coscheduling (the operator's --gang-scheduler,
auto on a cluster that serves both PodGroup APIs) the field means nothing, which the user would not
otherwise learn, so the job's first reconcile records one Warning Event saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from builders.names import pod_group_name
from builders.podgroup import volcano_queue
from controller.planner import conditions as cond
from controller.planner.change import Change, moment
from controller.planner.facts import Facts, state_of
from controller.planner.model import Event
from crd import contract
from crd.contract import FINISHED_STATES, Condition

JsonDict = dict[str, Any]

QUEUE_NOT_FOUND: Final = "VolcanoQueueNotFound"
QUEUE_CLOSED: Final = "VolcanoQueueClosed"
# Queue states in which Volcano takes no new work (status.state; empty until its controller has seen it).
NOT_OPEN: Final = ("Closed", "Closing")
QUEUE_IGNORED: Final = "SchedulingQueueIgnored"


def queue_hold(facts: Facts) -> tuple[str, str] | None:
    """(reason, message) while the job's pods wait for its Volcano Queue; None when nothing holds them
    (not gang-scheduled by Volcano, or the Queues not listed yet)."""
    queues = facts.observed.volcano_queues
    if facts.gang_scheduler != contract.GANG_VOLCANO or queues is None:
        return None
    name = volcano_queue(facts.job)
    queue = queues.get(name)
    if queue is None:
        return QUEUE_NOT_FOUND, (
            f"Volcano Queue {name} (spec.scheduling.queue) does not exist: the job's pods are created "
            "once it does"
        )
    state = str((queue.get("status") or {}).get("state") or "")
    if state in NOT_OPEN:
        return QUEUE_CLOSED, (
            f"Volcano Queue {name} (spec.scheduling.queue) is {state}: the job's pods are created once "
            "it is open again"
        )
    return None


def show_queue_hold(facts: Facts, status: Mapping[str, Any]) -> tuple[JsonDict, tuple[Event, ...]]:
    """`status` saying why the job's missing pods are not created while its queue holds them, and a
    Warning Event when that reason is new."""
    hold = queue_hold(facts)
    state = state_of(status)
    if hold is None or state is None or state in FINISHED_STATES or not facts.gang(status).to_create(status):
        return dict(status), ()
    reason, message = hold
    current = cond.get(status.get("conditions"), Condition.CREATED)
    change = Change(moment(facts), status)
    if current is None or current.get("reason") != reason:
        change.note("Warning", reason, message)
    change.set(Condition.CREATED, False, reason, message)
    return change.status, tuple(change.events)


def queue_ignored(facts: Facts, status: Mapping[str, Any]) -> Event | None:
    """The Warning Event of a job that names a Volcano Queue while its gang scheduler is
    scheduler-plugins' coscheduling, which has no queues; only on the job's first reconcile (`status`
    as read, without a state yet), so it is recorded once per job."""
    queue = facts.job.spec.scheduling.queue
    if state_of(status) is not None or queue is None or facts.gang_scheduler != contract.GANG_COSCHEDULING:
        return None
    return Event(
        "Warning",
        QUEUE_IGNORED,
        f"spec.scheduling.queue ({queue}) names a Volcano Queue, but the operator's gang scheduler is "
        "scheduler-plugins' coscheduling, which has no queues: the field is ignored. Remove it, or have "
        "the operator run with --gang-scheduler=volcano on a cluster with Volcano; Kueue's "
        f"{contract.QUEUE_NAME_LABEL} label queues a job under any gang scheduler",
    )


def pod_group_wait(facts: Facts) -> tuple[str, str] | None:
    """(reason, message) of the Unschedulable condition Volcano gave the job's PodGroup, with its phase
    and queue; None when it has none (or the job's gang scheduler is not Volcano)."""
    if facts.gang_scheduler != contract.GANG_VOLCANO:
        return None
    name = pod_group_name(facts.job)
    group = facts.observed.owned.get(("PodGroup", name))
    if group is None or group.get("apiVersion") != contract.VOLCANO_GROUP_VERSION:
        return None
    status = group.get("status") or {}
    unschedulable = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "Unschedulable" and c.get("status") == "True"
        ),
        None,
    )
    if unschedulable is None or status.get("phase") not in ("Pending", "Inqueue"):
        return None
    phase = status["phase"]
    queue = (group.get("spec") or {}).get("queue") or volcano_queue(facts.job)
    why = (
        "not enqueued: the queue's capability or the cluster has no room for its minResources"
        if phase == "Pending"
        else "enqueued, its pods not all placed"
    )
    reason = str(unschedulable.get("reason") or "Unschedulable")
    detail = unschedulable.get("message") or reason
    return reason, f"PodGroup {name} is {phase} in Volcano Queue {queue} ({why}): {detail}"
