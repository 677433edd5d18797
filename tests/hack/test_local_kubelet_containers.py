"""The local kubelet's rules for a pod's containers (hack/local_kubelet/containers.py), without processes.

What a kubelet does with init containers, native sidecars and classic sidecars, and what the Pod's
status says at each step, is what the operator reads; these tests walk a pod through its life the
way the loop does (start what `to_start` says, record exits) and check each status a kubelet would
report. The same rules with real processes on the real cluster: tests/e2e/test_local_kubelet.py.
"""

from __future__ import annotations

from typing import Any

from hack.local_kubelet.containers import (
    SIDECAR_BACKOFF_SECONDS,
    ContainerRun,
    PodRun,
    pod_status,
)
from hack.local_kubelet.pods import Role, containers_in_order

JsonDict = dict[str, Any]


def pod_run(*containers: tuple[str, Role]) -> PodRun:
    return PodRun("uid-1", [ContainerRun(name, role, image=f"{name}:1") for name, role in containers])


def start(run: PodRun, *names: str, now: str = "t1") -> None:
    assert [c.name for c in run.to_start()] == list(names)
    for name in names:
        container = run.get(name)
        assert container is not None
        run.started(container, f"local://{name}", now)


def exit_(run: PodRun, name: str, code: int, *, clock: float = 0.0, message: str | None = None) -> None:
    container = run.get(name)
    assert container is not None
    run.exited(container, code, "t2", clock, message)


def status(run: PodRun, current: JsonDict | None = None, disruption: str | None = None) -> JsonDict:
    return pod_status(run, current or {}, "now", disruption)["status"]  # type: ignore[no-any-return]


def conditions(status_: JsonDict) -> dict[str, tuple[str, str | None]]:
    return {c["type"]: (c["status"], c.get("message")) for c in status_["conditions"]}


def states(entries: list[JsonDict]) -> dict[str, str]:
    return {e["name"]: next(iter(e["state"])) for e in entries}


def full_pod() -> PodRun:
    return pod_run(
        ("fetch-data", Role.INIT),
        ("log-shipper", Role.SIDECAR),
        ("trainer", Role.MAIN),
        ("proxy", Role.MAIN),
    )


def test_containers_come_in_the_order_a_kubelet_starts_them() -> None:
    pod = {
        "spec": {
            "initContainers": [
                {"name": "fetch"},
                {"name": "shipper", "restartPolicy": "Always"},
            ],
            "containers": [{"name": "trainer"}, {"name": "proxy"}],
        }
    }
    assert [(role, c["name"]) for role, c in containers_in_order(pod)] == [
        (Role.INIT, "fetch"),
        (Role.SIDECAR, "shipper"),
        (Role.MAIN, "trainer"),
        (Role.MAIN, "proxy"),
    ]
    assert containers_in_order({"spec": {}}) == []


def test_init_containers_run_in_order_then_the_regular_ones_start_together() -> None:
    run = full_pod()
    start(run, "fetch-data")
    pending = status(run)
    assert pending["phase"] == "Pending"
    assert conditions(pending)["Initialized"] == (
        "False",
        "containers with incomplete status: [fetch-data log-shipper]",
    )
    assert states(pending["initContainerStatuses"]) == {"fetch-data": "running", "log-shipper": "waiting"}
    assert states(pending["containerStatuses"]) == {"trainer": "waiting", "proxy": "waiting"}
    assert pending["containerStatuses"][0]["state"]["waiting"] == {"reason": "PodInitializing"}
    assert pending["initContainerStatuses"][0]["ready"] is False  # an init container is never ready
    assert run.to_start() == []  # the next one waits for this one

    exit_(run, "fetch-data", 0)
    start(run, "log-shipper")  # a native sidecar starts, and the init sequence goes on at once
    start(run, "trainer", "proxy")
    running = status(run)
    assert running["phase"] == "Running"
    assert conditions(running)["Initialized"] == ("True", None)
    assert conditions(running)["Ready"] == ("True", None)
    assert states(running["initContainerStatuses"]) == {"fetch-data": "terminated", "log-shipper": "running"}
    assert running["initContainerStatuses"][1]["ready"] is True  # a started native sidecar is
    assert running["containerStatuses"][0]["containerID"] == "local://trainer"
    assert run.to_start() == []


def test_a_classic_sidecar_that_never_exits_keeps_the_pod_running() -> None:
    run = full_pod()
    start(run, "fetch-data")
    exit_(run, "fetch-data", 0)
    start(run, "log-shipper")
    start(run, "trainer", "proxy")
    exit_(run, "trainer", 0)
    after = status(run)
    assert after["phase"] == "Running"
    assert not run.over
    assert run.sidecars_to_stop() == []  # the regular containers are not all done: proxy runs
    [trainer] = [c for c in after["containerStatuses"] if c["name"] == "trainer"]
    assert trainer["state"]["terminated"]["exitCode"] == 0
    assert trainer["state"]["terminated"]["reason"] == "Completed"
    assert conditions(after)["Ready"] == ("False", "containers with unready status: [trainer]")


def test_native_sidecars_stop_once_the_regular_containers_end_and_do_not_decide_the_phase() -> None:
    run = pod_run(("log-shipper", Role.SIDECAR), ("trainer", Role.MAIN))
    start(run, "log-shipper")
    start(run, "trainer")
    exit_(run, "trainer", 0)
    assert [c.name for c in run.sidecars_to_stop()] == ["log-shipper"]
    assert status(run)["phase"] == "Running"  # not over while the sidecar stops
    run.finishing = True
    exit_(run, "log-shipper", 143)  # killed by SIGTERM: not a failure of the pod
    assert run.over
    assert run.sidecars_to_restart(10**6) == []
    done = status(run)
    assert done["phase"] == "Succeeded"
    assert conditions(done)["Ready"][0] == "False"
    assert next(c for c in done["conditions"] if c["type"] == "Ready")["reason"] == "PodCompleted"


def test_a_failed_trainer_fails_the_pod_with_its_termination_message() -> None:
    run = pod_run(("trainer", Role.MAIN))
    start(run, "trainer")
    exit_(run, "trainer", 1, message="Traceback: boom")
    assert run.over
    failed = status(run)
    assert failed["phase"] == "Failed"
    assert failed["message"] == "Traceback: boom"
    assert failed["containerStatuses"][0]["state"]["terminated"]["reason"] == "Error"
    assert "initContainerStatuses" not in failed


def test_a_failed_init_container_fails_the_pod_and_nothing_else_starts() -> None:
    run = pod_run(("log-shipper", Role.SIDECAR), ("migrate", Role.INIT), ("trainer", Role.MAIN))
    start(run, "log-shipper")
    start(run, "migrate")
    exit_(run, "migrate", 2)
    assert run.to_start() == []
    assert [c.name for c in run.sidecars_to_stop()] == ["log-shipper"]
    run.finishing = True
    exit_(run, "log-shipper", 0)
    assert run.over
    failed = status(run)
    assert failed["phase"] == "Failed"
    assert conditions(failed)["Initialized"] == ("False", "containers with incomplete status: [migrate]")
    assert states(failed["containerStatuses"]) == {"trainer": "waiting"}


def test_a_native_sidecar_that_exits_is_started_again_after_the_backoff() -> None:
    run = pod_run(("tailer", Role.SIDECAR), ("trainer", Role.MAIN))
    start(run, "tailer")
    start(run, "trainer")
    exit_(run, "tailer", 1, clock=100.0)
    assert run.sidecars_to_restart(100.0 + SIDECAR_BACKOFF_SECONDS - 1) == []
    [tailer] = run.sidecars_to_restart(100.0 + SIDECAR_BACKOFF_SECONDS)
    assert tailer.next_instance == 1
    run.started(tailer, "local://tailer-1", "t3")
    entry = status(run)["initContainerStatuses"][0]
    assert entry["restartCount"] == 1
    assert entry["state"] == {"running": {"startedAt": "t3"}}
    assert entry["lastState"]["terminated"]["exitCode"] == 1
    assert entry["lastState"]["terminated"]["containerID"] == "local://tailer"
    exit_(run, "tailer", 1, clock=200.0)
    [tailer] = run.sidecars_to_restart(200.0 + 2 * SIDECAR_BACKOFF_SECONDS)  # the back-off doubles
    assert run.sidecars_to_restart(200.0 + 2 * SIDECAR_BACKOFF_SECONDS - 1) == []


def test_a_stopped_pod_is_over_once_nothing_runs_and_a_shutdown_is_a_disruption() -> None:
    run = pod_run(("proxy", Role.MAIN), ("trainer", Role.MAIN))
    start(run, "proxy", "trainer")
    run.stopping = "shutdown"
    assert run.to_start() == []
    exit_(run, "trainer", 143)
    assert [c.name for c in run.running] == ["proxy"]
    exit_(run, "proxy", 0)
    assert run.over
    ended = status(run, disruption="TerminationByKubelet")
    assert ended["phase"] == "Failed"
    assert ended["message"] == "TerminationByKubelet"
    [disruption] = [c for c in ended["conditions"] if c["type"] == "DisruptionTarget"]
    assert (disruption["status"], disruption["reason"]) == ("True", "TerminationByKubelet")


def test_conditions_keep_their_transition_time_and_true_ones_lose_their_reason() -> None:
    run = pod_run(("trainer", Role.MAIN))
    start(run, "trainer")
    current = {
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "kwok-time"},
            {"type": "Initialized", "status": "False", "lastTransitionTime": "old", "message": "stale"},
        ]
    }
    by_type = {c["type"]: c for c in status(run, current)["conditions"]}
    assert by_type["Ready"]["lastTransitionTime"] == "kwok-time"  # unchanged status: unchanged time
    assert by_type["Initialized"]["lastTransitionTime"] == "now"
    # None deletes the earlier reason and message in the strategic-merge patch
    assert by_type["Initialized"]["message"] is None
    assert by_type["Initialized"]["reason"] is None
