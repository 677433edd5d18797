"""Pods that are placed but whose containers cannot start: a missing image pull secret (ErrImagePull,
ImagePullBackOff), a missing ConfigMap key (CreateContainerConfigError). The job names the pod, the
container and the kubelet's reason in its message and Running condition, says it once in an Event,
and neither restarts nor fails: the kubelet keeps trying, and fixing the cause lets the job start."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from controller.planner import podstate
from tests.unit.lifecycle_world import World, world

JsonDict = dict[str, Any]
PULL_MESSAGE = 'Back-off pulling image "myteam/bert-train:1.4"'
KEY_MESSAGE = "couldn't find key learning-rate in ConfigMap ml/settings"


def waiting(name: str, reason: str, message: str = "") -> JsonDict:
    state: JsonDict = {"reason": reason}
    if message:
        state["message"] = message
    return {"name": name, "ready": False, "restartCount": 0, "state": {"waiting": state}}


def stuck(w: World, index: int, containers: list[JsonDict], init: list[JsonDict] | None = None) -> None:
    """The pod is bound and its containers wait, as the kubelet reports it."""
    w.bind(index)
    status = w.pod(index)["status"]
    status["phase"] = "Pending"
    status["containerStatuses"] = containers
    if init is not None:
        status["initContainerStatuses"] = init


def running_condition(w: World) -> tuple[str, str, str]:
    entry = w.condition("Running")
    assert entry is not None
    return entry["status"], entry["reason"], entry["message"]


def warnings(w: World) -> list[tuple[str, str]]:
    return [(event.reason, event.message) for event in w.events if event.type == "Warning"]


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("ErrImagePull", 'failed to pull image "myteam/bert-train:1.4": unauthorized'),
        ("ImagePullBackOff", PULL_MESSAGE),
        ("CreateContainerConfigError", KEY_MESSAGE),
        ("InvalidImageName", 'Failed to apply default image tag "Bad Image"'),
    ],
)
def test_a_trainer_that_cannot_start_is_named_with_the_kubelets_reason(reason: str, message: str) -> None:
    w = world()
    w.settle()
    w.start(0)
    stuck(w, 1, [waiting("trainer", reason, message)])
    result = w.step(5)
    expected = f"1/2 pods running; pod mnist-worker-1: container trainer is waiting: {reason}: {message}"
    assert w.state == "Initializing"
    assert w.status["message"] == expected
    assert running_condition(w) == ("False", reason, expected)
    assert (reason, expected) in [(e.reason, e.message) for e in result.events if e.type == "Warning"]
    assert result.deletes == []
    # The kubelet keeps trying; the job waits for it and writes nothing more.
    before = copy.deepcopy(w.job["status"])
    again = w.step(60)
    assert again.status == before
    assert (again.events, again.deletes, again.creates) == ([], [], [])
    assert w.status.get("restartCount") == 0


def test_the_back_off_and_the_pull_error_each_say_so_once() -> None:
    w = world()
    w.settle()
    w.start(0)
    for reason in ("ErrImagePull", "ImagePullBackOff", "ImagePullBackOff"):
        stuck(w, 1, [waiting("trainer", reason, PULL_MESSAGE)])
        w.step(10)
    assert [reason for reason, _ in warnings(w)] == ["ErrImagePull", "ImagePullBackOff"]


def test_the_problem_goes_once_the_container_starts() -> None:
    w = world()
    w.settle()
    w.start(0)
    stuck(w, 1, [waiting("trainer", "CreateContainerConfigError", KEY_MESSAGE)])
    w.step(5)
    w.start(1)
    w.step(5)
    assert w.state == "Running"
    assert running_condition(w)[:2] == ("True", "AllWorkersRunning")


def test_containers_being_created_are_no_problem() -> None:
    w = world()
    w.settle()
    stuck(w, 0, [waiting("trainer", "ContainerCreating")])
    stuck(w, 1, [waiting("trainer", "PodInitializing")], init=[waiting("fetch", "PodInitializing")])
    result = w.step(5)
    assert w.status["message"] == "0/2 pods running"
    assert running_condition(w)[:2] == ("False", "PodsStarting")
    assert [e for e in result.events if e.type == "Warning"] == []


def test_an_init_container_that_cannot_start_is_named_when_the_trainer_waits_for_it() -> None:
    w = world()
    w.settle()
    sidecar = waiting("log-shipper", "ImagePullBackOff", 'Back-off pulling image "fluent/fluent-bit:3.1"')
    for index in (0, 1):
        stuck(w, index, [waiting("trainer", "PodInitializing")], init=[sidecar])
    w.step(5)
    assert w.status["message"] == (
        "0/2 pods running; pod mnist-worker-0: container log-shipper is waiting: ImagePullBackOff: "
        'Back-off pulling image "fluent/fluent-bit:3.1" (and 1 more pod(s) waiting)'
    )


def test_waiting_problem_prefers_the_trainer() -> None:
    pod = {
        "status": {
            "initContainerStatuses": [waiting("init", "ImagePullBackOff")],
            "containerStatuses": [
                waiting("aaa", "ErrImagePull"),
                waiting("trainer", "CreateContainerConfigError"),
            ],
        }
    }
    assert podstate.waiting_problem(pod) == podstate.Waiting("trainer", "CreateContainerConfigError", "")
    pod["status"]["containerStatuses"] = [waiting("trainer", "PodInitializing")]
    assert podstate.waiting_problem(pod) == podstate.Waiting("init", "ImagePullBackOff", "")
    assert podstate.waiting_problem({"status": {}}) is None
