"""Gang scheduling with Volcano, decided without I/O: the PodGroup the operator builds (its queue and
minResources), the Queue that holds a job's pods back while it is missing or closed
(controller/planner/volcano.py), Volcano's reason on the Scheduled condition, which gang scheduler
discovery picks under --gang-scheduler (and a value it refuses), and what the operator caches of a
Queue (controller/volcano_watches.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from builders.podgroup import build_pod_group, times
from controller import cli
from controller.resources import GANG_SCHEDULER_CHOICES, Apis, follow_answers
from controller.volcano_watches import gang_scheduled, queue_essentials
from crd.spec import parse
from tests.unit.builders_support import defaulted
from tests.unit.lifecycle_world import World, world

JsonDict = dict[str, Any]
GROUP = ("PodGroup", "train")


def queue(name: str, state: str = "Open") -> JsonDict:
    return {"metadata": {"name": name}, "status": {"state": state}}


def volcano_world(queues: dict[str, JsonDict] | None, **changes: Any) -> World:
    spec = {"spec.scheduling.gangScheduling": True, "metadata.name": "train", **changes}
    return world(spec, workers=2, gang_scheduler="volcano", volcano_queues=queues)


def created(w: World) -> tuple[str, str, str]:
    entry = w.condition("Created")
    assert entry is not None, w.status
    return entry["status"], entry["reason"], entry["message"]


def warnings(w: World, reason: str) -> list[str]:
    return [event.message for event in w.events if event.type == "Warning" and event.reason == reason]


# --------------------------------------------------------------------------------------- builders


def test_a_volcano_pod_group_names_its_queue_and_what_the_whole_gang_requests() -> None:
    tj = defaulted(
        {
            "spec.numWorkers": 4,
            "spec.gpusPerWorker": 2,
            "spec.resources": {"requests": {"cpu": "500m", "memory": "8Gi"}, "limits": {"memory": "16Gi"}},
            "spec.scheduling.gangScheduling": True,
            "spec.scheduling.queue": "team-a",
        }
    )
    group = build_pod_group(parse(tj), "volcano")
    assert group["spec"] == {
        "minMember": 4,
        "queue": "team-a",
        "minResources": {"cpu": "2000m", "memory": "32Gi", "nvidia.com/gpu": "8"},
    }
    unset = defaulted({"spec.numWorkers": 2, "spec.gpusPerWorker": 0})
    assert build_pod_group(parse(unset), "volcano")["spec"] == {"minMember": 2, "queue": "default"}
    # scheduler-plugins' PodGroup has neither field.
    assert "queue" not in build_pod_group(parse(tj), "coscheduling")["spec"]


@pytest.mark.parametrize(
    ("quantity", "count", "total"),
    [("32Gi", 4, "128Gi"), ("500m", 3, "1500m"), ("1.5", 4, "6"), ("0.25Gi", 2, "0.5Gi"), ("1e3", 2, "2e3")],
)
def test_quantities_are_multiplied_in_their_own_unit(quantity: str, count: int, total: str) -> None:
    assert times(quantity, count) == total


# ------------------------------------------------------------------------------------ the queue


def test_a_job_whose_queue_does_not_exist_creates_no_pod_until_it_does() -> None:
    w = volcano_world({"default": queue("default")}, **{"spec.scheduling.queue": "team-x"})
    w.settle()
    assert not w.pods
    assert GROUP in w.owned  # the PodGroup is made; Volcano ignores it until its queue exists
    status, reason, message = created(w)
    assert (status, reason) == ("False", "VolcanoQueueNotFound")
    assert "Volcano Queue team-x (spec.scheduling.queue) does not exist" in message
    assert w.status["message"] == message
    assert warnings(w, "VolcanoQueueNotFound") == [message]
    before = copy.deepcopy(w.job["status"])
    w.advance(30)
    again = w.plan()
    assert again.status == before  # no write loop
    assert again.events == []
    assert again.creates == []

    assert w.volcano_queues is not None
    w.volcano_queues["team-x"] = queue("team-x")
    w.settle()
    assert len(w.pods) == 2
    assert created(w)[0] == "True"


def test_a_closed_queue_holds_the_pods_until_it_opens() -> None:
    w = volcano_world({"default": queue("default"), "team-a": queue("team-a", "Closed")})
    w.update_spec(**{"scheduling.queue": "team-a"})
    w.settle()
    assert not w.pods
    status, reason, message = created(w)
    assert (status, reason) == ("False", "VolcanoQueueClosed")
    assert message.startswith("Volcano Queue team-a (spec.scheduling.queue) is Closed")
    assert len(warnings(w, "VolcanoQueueClosed")) == 1
    assert w.volcano_queues is not None
    w.volcano_queues["team-a"] = queue("team-a", "Open")
    w.settle()
    assert len(w.pods) == 2


def test_nothing_is_held_while_the_queues_are_not_known_or_the_scheduler_is_not_volcano() -> None:
    unknown = volcano_world(None, **{"spec.scheduling.queue": "team-x"})
    unknown.settle()
    assert len(unknown.pods) == 2
    other = world(
        {"spec.scheduling.gangScheduling": True, "spec.scheduling.queue": "team-x"},
        gang_scheduler="coscheduling",
        volcano_queues={},
    )
    other.settle()
    assert len(other.pods) == 2


def test_a_queue_under_coscheduling_is_announced_as_ignored_once() -> None:
    w = world(
        {"spec.scheduling.gangScheduling": True, "spec.scheduling.queue": "research"},
        workers=2,
        gang_scheduler="coscheduling",
    )
    first = w.plan()
    (message,) = [event.message for event in first.events if event.reason == "SchedulingQueueIgnored"]
    assert [event.type for event in first.events if event.reason == "SchedulingQueueIgnored"] == ["Warning"]
    assert message.startswith(
        "spec.scheduling.queue (research) names a Volcano Queue, but the operator's gang scheduler is "
        "scheduler-plugins' coscheduling"
    )
    assert "--gang-scheduler=volcano" in message
    # Once the first status is written, nothing more: the job runs, and planning again records nothing.
    w.apply(first)
    w.settle()
    w.start()
    w.advance(30)
    w.settle()
    assert warnings(w, "SchedulingQueueIgnored") == [message]
    again = w.plan()
    assert "SchedulingQueueIgnored" not in [event.reason for event in again.events]


@pytest.mark.parametrize(
    ("gang_scheduler", "changes"),
    [
        ("volcano", {"spec.scheduling.queue": "research"}),  # Volcano reads it
        (None, {"spec.scheduling.queue": "research"}),  # GangSchedulingUnavailable says it all
        ("coscheduling", {}),  # no queue named
    ],
)
def test_no_queue_is_announced_as_ignored_where_it_is_read_or_absent(
    gang_scheduler: str | None, changes: dict[str, Any]
) -> None:
    w = world(
        {"spec.scheduling.gangScheduling": True, **changes},
        workers=2,
        gang_scheduler=gang_scheduler,
        volcano_queues={"research": queue("research"), "default": queue("default")},
    )
    w.settle()
    assert warnings(w, "SchedulingQueueIgnored") == []


def test_the_scheduled_condition_carries_volcanos_reason_for_a_waiting_gang() -> None:
    w = volcano_world({"default": queue("default")})
    w.settle()
    assert len(w.pods) == 2
    w.owned[GROUP]["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "Unschedulable",
                "status": "True",
                "reason": "NotEnoughResources",
                "message": "2/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, "
                "2 minAvailable",
            }
        ],
    }
    w.step(1)
    entry = w.condition("Scheduled")
    assert entry is not None
    assert (entry["status"], entry["reason"]) == ("False", "NotEnoughResources")
    assert entry["message"] == (
        "PodGroup train is Pending in Volcano Queue default (not enqueued: the queue's capability or the "
        "cluster has no room for its minResources): 2/2 tasks in gang unschedulable: pod group is not "
        "ready, 2 Pending, 2 minAvailable"
    )
    w.bind()
    w.step(1)
    entry = w.condition("Scheduled")
    assert entry is not None
    assert (entry["status"], entry["reason"]) == ("True", "AllPodsScheduled")


# ------------------------------------------------------------------------------------ discovery


@pytest.mark.parametrize(
    ("choice", "served", "found"),
    [
        ("auto", {"coscheduling": True, "volcano": True}, "coscheduling"),
        ("volcano", {"volcano": True}, "volcano"),
        ("volcano", {"volcano": False}, None),
        ("coscheduling", {"coscheduling": False}, None),
    ],
)
def test_the_gang_scheduler_flag_picks_among_the_served_apis(
    choice: str, served: dict[Any, bool | None], found: str | None
) -> None:
    assert follow_answers(Apis(), served, False, GANG_SCHEDULER_CHOICES[choice]) == Apis(found)  # type: ignore[arg-type]


def test_the_operator_keeps_only_a_queues_name_and_state_and_wakes_gang_scheduled_jobs() -> None:
    stored = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "research", "resourceVersion": "7", "uid": "u", "generation": 1},
        "spec": {"capability": {"nvidia.com/gpu": "8"}, "weight": 1},
        "status": {"state": "Closed", "allocated": {"cpu": "0"}, "running": 1},
    }
    assert queue_essentials(stored) == {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "Queue",
        "metadata": {"name": "research", "resourceVersion": "7"},
        "status": {"state": "Closed"},
    }
    assert queue_essentials({"metadata": {"name": "new"}})["status"] == {"state": ""}
    assert gang_scheduled({"spec": {"scheduling": {"gangScheduling": True}}})
    assert not gang_scheduled({"spec": {}})


def test_an_unknown_gang_scheduler_flag_is_refused_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args(["--gang-scheduler=yunikorn"])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.splitlines() == [error]
    assert "--gang-scheduler: invalid gang scheduler 'yunikorn': one of auto, coscheduling, volcano" in error
