"""A worker's end is its trainer container's end: sidecars neither keep a job running nor fail it.

A classic sidecar (an extra container, e.g. Istio's proxy) never exits, so its pod stays Running after
the trainer is done; one that fails makes its pod Failed though the trainer succeeded. A native sidecar
(an init container with restartPolicy Always) is stopped by the kubelet after the trainer, but the
operator may see the trainer's end first. These tests step jobs through such pods with the planner
(tests.unit.lifecycle_world) and ask the pure functions of controller.planner.podstate directly.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller.planner import podstate
from controller.planner.failures import classify
from controller.runtime.clock import rfc3339
from crd import contract
from tests.unit.lifecycle_world import T0, World, names, world

JsonDict = dict[str, Any]
W0 = "mnist-worker-0"
W1 = "mnist-worker-1"


def running(name: str) -> JsonDict:
    return {"name": name, "ready": True, "restartCount": 0, "state": {"running": {"startedAt": rfc3339(T0)}}}


def waiting(name: str, reason: str) -> JsonDict:
    return {"name": name, "ready": False, "restartCount": 0, "state": {"waiting": {"reason": reason}}}


def terminated(name: str, code: int, *, finished: str = "2026-03-01T12:00:30Z", reason: str = "") -> JsonDict:
    state = {
        "exitCode": code,
        "reason": reason or ("Completed" if code == 0 else "Error"),
        "finishedAt": finished,
    }
    return {"name": name, "ready": False, "restartCount": 0, "state": {"terminated": state}}


def add_sidecar(w: World, index: int, entry: JsonDict, *, native: bool = False) -> None:
    """The pod's status shows a sidecar: a native one among the init containers, a classic one beside
    the trainer (listed first, as the kubelet sorts containers by name)."""
    status = w.pod(index)["status"]
    if native:
        status.setdefault("initContainerStatuses", []).append(entry)
    else:
        status["containerStatuses"] = [entry, *status["containerStatuses"]]


def trainer_exits(
    w: World, index: int, code: int, *, pod_phase: str, finished: str = "2026-03-01T12:00:30Z"
) -> None:
    """The trainer terminates with `code`; the pod's phase is what the kubelet makes of all containers."""
    status = w.pod(index)["status"]
    status["phase"] = pod_phase
    status["containerStatuses"] = [
        terminated("trainer", code, finished=finished) if entry["name"] == "trainer" else entry
        for entry in status["containerStatuses"]
    ]


def sidecar_world(policy: str = "Running", *, native: bool = False) -> World:
    w = world({"spec.cleanPodPolicy": policy})
    w.run_to_running()
    for index in (0, 1):
        add_sidecar(w, index, running("istio-proxy"), native=native)
    w.step(1)
    assert w.state == "Running"
    return w


# ---------------------------------------------------------------------------------------------------
# Completion


@pytest.mark.parametrize(("policy", "deleted"), [("Running", [W0, W1]), ("All", [W0, W1]), ("None", [])])
def test_a_classic_sidecar_that_never_exits_does_not_keep_the_job_running(
    policy: str, deleted: list[str]
) -> None:
    w = sidecar_world(policy)
    for index in (0, 1):
        trainer_exits(w, index, 0, pod_phase="Running")
    result = w.step(10)
    assert w.state == "Completed"
    assert "failureReason" not in w.status
    succeeded = w.condition("Succeeded")
    assert succeeded is not None
    assert (succeeded["status"], succeeded["reason"]) == ("True", "AllWorkersSucceeded")
    # The pods still run (their sidecar holds the node): cleanPodPolicy Running ends them too.
    assert names(result.deletes) == deleted
    assert names(w.step(1).deletes) == []
    assert w.status["workers"]["succeeded"] == 2 - len(deleted)


def test_a_native_sidecar_still_running_when_the_trainer_ends_does_not_keep_the_job_running() -> None:
    w = sidecar_world(native=True)
    for index in (0, 1):
        trainer_exits(w, index, 0, pod_phase="Running")
    result = w.step(10)
    assert w.state == "Completed"
    assert names(result.deletes) == [W0, W1]


@pytest.mark.parametrize("policy", ["Running", "None"])
def test_finished_pods_the_kubelet_still_reports_running_are_kept(policy: str) -> None:
    """A real kubelet reports the trainer's end before the pod's Succeeded phase: pods whose containers
    have all ended hold nothing, so cleanPodPolicy Running keeps them (and their logs) like None."""
    w = world({"spec.cleanPodPolicy": policy})
    w.run_to_running()
    for index in (0, 1):
        trainer_exits(w, index, 0, pod_phase="Running")
    result = w.step(10)
    assert w.state == "Completed"
    assert names(result.deletes) == []
    assert names(w.step(1).deletes) == []
    assert w.status["workers"]["succeeded"] == 2


def test_pods_that_ran_and_ended_between_two_kubelet_updates_are_kept_though_they_still_say_pending() -> None:
    """A trainer of a second on a busy node: the kubelet never reported Running, and keeps the pod's
    last phase (Pending) until it has torn the pod down, with every container's end already shown.
    Such pods hold nothing: the job completes and cleanPodPolicy Running keeps them and their logs."""
    w = world({"spec.cleanPodPolicy": "Running"})
    w.settle()
    w.bind()
    w.settle()
    for index in (0, 1):
        w.pod(index)["status"].update(
            {
                "phase": "Pending",
                "initContainerStatuses": [terminated("prepare-data", 0)],
                "containerStatuses": [terminated("trainer", 0)],
            }
        )
    result = w.step(10)
    assert w.state == "Completed"
    assert names(result.deletes) == []
    assert names(w.step(1).deletes) == []
    assert w.status["workers"]["succeeded"] == 2


def test_worker_counts_follow_the_trainer() -> None:
    w = sidecar_world()
    trainer_exits(w, 1, 0, pod_phase="Running")
    w.step(1)
    assert w.state == "Running"
    assert w.status["workers"] == {"pending": 0, "active": 1, "succeeded": 1, "failed": 0}
    # The finished rank's pod still holds its node and GPU while its sidecar runs.
    assert w.status["resources"] == {"gpus": 2, "workers": 2}


def test_rank_zero_mode_completes_when_rank_zeros_trainer_succeeds_beside_a_sidecar() -> None:
    w = world({"spec.successPolicy.mode": "RankZero"})
    w.run_to_running()
    add_sidecar(w, 0, running("istio-proxy"))
    trainer_exits(w, 0, 0, pod_phase="Running")
    result = w.step(10)
    assert w.state == "Completed"
    assert "failureReason" not in w.status
    assert names(result.deletes) == [W0, W1]


# ---------------------------------------------------------------------------------------------------
# A failing sidecar alone does not fail the job


def test_a_sidecar_that_fails_while_the_trainer_runs_changes_nothing() -> None:
    w = sidecar_world()
    w.pod(1)["status"]["containerStatuses"][0] = terminated("istio-proxy", 1)
    result = w.step(10)
    assert w.state == "Running"
    assert result.deletes == []
    assert w.status.get("restartCount") == 0


@pytest.mark.parametrize("native", [False, True])
def test_a_failed_sidecar_does_not_fail_a_worker_whose_trainer_succeeded(native: bool) -> None:
    w = sidecar_world("None", native=native)
    for index in (0, 1):
        sidecars = "initContainerStatuses" if native else "containerStatuses"
        w.pod(index)["status"][sidecars][0] = terminated("istio-proxy", 137, reason="OOMKilled")
        # The kubelet fails a pod with a failed container whatever the trainer did.
        trainer_exits(w, index, 0, pod_phase="Failed")
    w.step(10)
    assert w.state == "Completed"
    assert w.status["workers"] == {"pending": 0, "active": 0, "succeeded": 2, "failed": 0}


# ---------------------------------------------------------------------------------------------------
# Failures are the trainer's


def test_a_trainer_that_fails_beside_a_running_sidecar_restarts_the_gang() -> None:
    w = sidecar_world()
    trainer_exits(w, 1, 3, pod_phase="Running")
    result = w.step(10)
    assert w.state == "Restarting"
    assert w.status["lastRestartReason"] == "PodFailed"
    assert "pod mnist-worker-1, container trainer, exit code 3" in w.status["message"]
    assert names(result.deletes) == [W0, W1]


def test_the_failure_named_is_the_trainers_even_when_a_sidecar_failed_first() -> None:
    w = world({"spec.failurePolicy.restartPolicy": "Never"})
    w.run_to_running()
    add_sidecar(w, 0, terminated("istio-proxy", 2, finished="2026-03-01T12:00:01Z"))
    trainer_exits(w, 0, 137, pod_phase="Failed", finished="2026-03-01T12:00:09Z")
    w.step(10)
    assert w.state == "Failed"
    assert w.status["message"].startswith("pod mnist-worker-0, container trainer, exit code 137")


def test_the_worker_that_failed_first_is_judged_by_its_trainers_end() -> None:
    # Rank 1's sidecar ended before anything else, but rank 0's trainer failed first: rank 0 broke the gang.
    w = world()
    w.run_to_running()
    add_sidecar(w, 1, terminated("istio-proxy", 2, finished="2026-03-01T12:00:01Z"))
    trainer_exits(w, 1, 1, pod_phase="Failed", finished="2026-03-01T12:00:20Z")
    trainer_exits(w, 0, 5, pod_phase="Failed", finished="2026-03-01T12:00:10Z")
    w.step(30)
    assert "pod mnist-worker-0, container trainer, exit code 5" in w.status["message"]


# ---------------------------------------------------------------------------------------------------
# podstate


def pod(phase: str, containers: list[JsonDict], init: list[JsonDict] | None = None) -> JsonDict:
    status: JsonDict = {"phase": phase, "containerStatuses": containers}
    if init is not None:
        status["initContainerStatuses"] = init
    return {"metadata": {"name": "p", "labels": {contract.REPLICA_INDEX_LABEL: "0"}}, "status": status}


@pytest.mark.parametrize(
    ("phase", "containers", "expected"),
    [
        ("Running", [running("trainer"), running("proxy")], "Running"),
        ("Running", [terminated("trainer", 0), running("proxy")], "Succeeded"),
        ("Running", [terminated("trainer", 1), running("proxy")], "Failed"),
        ("Failed", [terminated("trainer", 0), terminated("proxy", 1)], "Succeeded"),
        ("Failed", [running("trainer"), terminated("proxy", 1)], "Failed"),
        ("Pending", [], "Pending"),
        ("Failed", [], "Failed"),
        ("Succeeded", [], "Succeeded"),
    ],
)
def test_worker_phase(phase: str, containers: list[JsonDict], expected: str) -> None:
    assert podstate.worker_phase(pod(phase, containers)) == expected


@pytest.mark.parametrize(
    ("phase", "containers", "init", "expected"),
    [
        ("Pending", [], None, True),
        ("Running", [running("trainer")], None, True),
        ("Running", [terminated("trainer", 0), running("proxy")], None, True),  # a classic sidecar runs
        ("Running", [terminated("trainer", 0)], [running("proxy")], True),  # a native one
        ("Running", [terminated("trainer", 0)], None, False),  # the kubelet is tearing it down
        ("Running", [terminated("trainer", 0), terminated("proxy", 0)], [terminated("fetch", 0)], False),
        # It ran and ended between two status updates: the kubelet keeps Pending until it is torn down.
        ("Pending", [terminated("trainer", 0)], [terminated("prepare-data", 0)], False),
        ("Pending", [terminated("trainer", 1)], None, False),
        ("Pending", [waiting("trainer", "PodInitializing")], [running("prepare-data")], True),
        ("Pending", [terminated("trainer", 0)], [running("proxy")], True),  # a native sidecar runs
        ("Running", [], None, True),
        ("Unknown", [terminated("trainer", 0)], None, True),
        ("Succeeded", [terminated("trainer", 0)], None, False),
        ("Failed", [terminated("trainer", 1), running("proxy")], None, False),
    ],
)
def test_holds_node(
    phase: str, containers: list[JsonDict], init: list[JsonDict] | None, expected: bool
) -> None:
    assert podstate.holds_node(pod(phase, containers, init)) is expected


def test_termination_names_the_init_container_that_kept_the_trainer_from_running() -> None:
    waiting = {"name": "trainer", "state": {"waiting": {"reason": "PodInitializing"}}}
    failed = pod("Failed", [waiting], init=[terminated("fetch-data", 1)])
    assert podstate.termination(failed) == podstate.Termination("fetch-data", 1, "Error", "")
    failure = classify(failed, None, False)
    assert failure is not None
    assert (failure.container, failure.exit_code) == ("fetch-data", 1)


def test_termination_prefers_the_trainer_over_a_sidecar_that_failed() -> None:
    succeeded = pod("Failed", [terminated("aaa-proxy", 1), terminated("trainer", 0)])
    assert podstate.termination(succeeded) == podstate.Termination("trainer", 0, "Completed", "")
    assert classify(succeeded, None, False) is None


def test_finished_at_reads_the_named_container() -> None:
    ended = pod("Failed", [terminated("trainer", 1, finished="2026-03-01T12:00:09Z")])
    assert podstate.finished_at(ended, "trainer") == "2026-03-01T12:00:09Z"
    assert podstate.finished_at(ended, "absent") is None
