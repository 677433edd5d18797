"""controller.planner.failures and controller.planner.podstate: whose fault a pod's end was, what it costs,
and how long the next gang start waits."""

from __future__ import annotations

from typing import Any

import pytest

from builders.pods import build_pod
from controller.planner import podstate
from controller.planner.failures import PodFailure, Verdict, classify, restart_delay, verdict
from crd.spec import FailurePolicy, RestartBackoff, parse
from tests.unit.lifecycle_world import make_job, make_node

JsonDict = dict[str, Any]


def pod(
    index: int = 1,
    *,
    phase: str = "Running",
    node: str | None = "node-1",
    containers: list[JsonDict] | None = None,
    conditions: list[JsonDict] | None = None,
    **status: Any,
) -> JsonDict:
    built = build_pod(parse(make_job()), index, attempt=0, resume_from=None)
    if node:
        built["spec"]["nodeName"] = node
    built["status"] = {"phase": phase, **status}
    if containers is not None:
        built["status"]["containerStatuses"] = containers
    if conditions is not None:
        built["status"]["conditions"] = conditions
    return built


def terminated(code: int, reason: str = "Error", message: str = "", name: str = "trainer") -> JsonDict:
    state: JsonDict = {"exitCode": code, "reason": reason, "finishedAt": "2026-03-01T12:00:00Z"}
    if message:
        state["message"] = message
    return {"name": name, "state": {"terminated": state}}


def disruption(reason: str, status: str = "True") -> JsonDict:
    return {"type": "DisruptionTarget", "status": status, "reason": reason, "message": "..."}


READY = make_node("node-1")


# ------------------------------------------------------------------------------------- classify


def test_a_running_pod_on_a_ready_node_is_no_failure() -> None:
    assert classify(pod(), READY, True) is None


def test_a_succeeded_pod_is_no_failure() -> None:
    assert classify(pod(phase="Succeeded", containers=[terminated(0, "Completed")]), READY, True) is None


def test_a_failed_pod_names_its_container_exit_code_and_message() -> None:
    failure = classify(
        pod(phase="Failed", containers=[terminated(3, message="ValueError: nan loss")]), READY, True
    )
    assert failure == PodFailure(
        pod="mnist-worker-1",
        index=1,
        container="trainer",
        exit_code=3,
        reason="Error",
        message="ValueError: nan loss",
        disruption=False,
    )
    assert (
        failure.describe()
        == "pod mnist-worker-1, container trainer, exit code 3, reason Error: ValueError: nan loss"
    )


def test_an_oom_kill_keeps_its_reason() -> None:
    failure = classify(pod(phase="Failed", containers=[terminated(137, "OOMKilled")]), READY, True)
    assert failure is not None
    assert (failure.exit_code, failure.reason) == (137, "OOMKilled")


def test_a_pod_that_failed_before_any_container_ran() -> None:
    failure = classify(pod(phase="Failed", reason="UnexpectedAdmissionError", message="no GPU"), READY, True)
    assert failure is not None
    assert (failure.container, failure.exit_code, failure.reason) == ("", None, "UnexpectedAdmissionError")
    assert failure.describe() == "pod mnist-worker-1, reason UnexpectedAdmissionError: no GPU"


@pytest.mark.parametrize(
    "reason",
    ["PreemptionByScheduler", "EvictionByEvictionAPI", "DeletionByTaintManager", "TerminationByKubelet"],
)
def test_a_disruption_target_condition_is_a_disruption(reason: str) -> None:
    failure = classify(pod(conditions=[disruption(reason)]), READY, True)
    assert failure is not None
    assert failure.disruption
    assert failure.reason == reason


def test_a_disrupted_pod_whose_trainer_exited_is_still_a_disruption() -> None:
    failed = pod(
        phase="Failed", containers=[terminated(143)], conditions=[disruption("PreemptionByScheduler")]
    )
    failure = classify(failed, READY, True)
    assert failure is not None
    assert failure.disruption
    assert (failure.container, failure.exit_code) == ("trainer", 143)


def test_a_false_disruption_target_is_ignored() -> None:
    assert classify(pod(conditions=[disruption("PreemptionByScheduler", "False")]), READY, True) is None


def test_a_pod_that_succeeded_despite_a_disruption_is_no_failure() -> None:
    done = pod(phase="Succeeded", containers=[terminated(0, "Completed")], conditions=[disruption("X")])
    assert classify(done, READY, True) is None


def test_kubelet_eviction_by_status_reason_is_a_disruption() -> None:
    evicted = pod(phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
    failure = classify(evicted, READY, True)
    assert failure is not None
    assert failure.disruption
    assert failure.reason == "Evicted"


@pytest.mark.parametrize(
    "node",
    [
        make_node("node-1", False),
        make_node("node-1", None),
        None,
        {"metadata": {"name": "node-1"}, "status": {}},
    ],
    ids=["not-ready", "unknown", "missing", "no-ready-condition"],
)
def test_a_pod_on_a_lost_node_is_a_disruption(node: JsonDict | None) -> None:
    for phase in ("Pending", "Running"):
        failure = classify(pod(phase=phase), node, True)
        assert failure is not None
        assert failure.disruption
        assert failure.reason == "NodeLost"
        assert "node-1" in failure.message


def test_node_loss_is_not_judged_when_the_node_cache_cannot_tell() -> None:
    assert classify(pod(), None, False) is None


def test_an_unbound_pending_pod_is_no_failure() -> None:
    assert classify(pod(phase="Pending", node=None), None, True) is None


# -------------------------------------------------------------------------------------- verdict


def failure(code: int | None, *, disrupted: bool = False) -> PodFailure:
    return PodFailure("p", 0, "trainer", code, "Error", "", disrupted)


@pytest.mark.parametrize(
    ("policy", "code", "expected"),
    [
        ({}, 1, Verdict.RETRY),
        ({"restartPolicy": "OnFailure"}, 2, Verdict.RETRY),
        ({"restartPolicy": "Never"}, 137, Verdict.PERMANENT),
        ({"restartPolicy": "ExitCode"}, 1, Verdict.PERMANENT),
        ({"restartPolicy": "ExitCode"}, 127, Verdict.PERMANENT),
        ({"restartPolicy": "ExitCode"}, 128, Verdict.RETRY),
        ({"restartPolicy": "ExitCode"}, 137, Verdict.RETRY),
        ({"restartPolicy": "ExitCode"}, 255, Verdict.RETRY),
        ({"restartPolicy": "ExitCode"}, None, Verdict.RETRY),
        ({"restartPolicy": "ExitCode", "retryableExitCodes": [1, 2]}, 2, Verdict.RETRY),
        ({"restartPolicy": "ExitCode", "retryableExitCodes": [1, 2]}, 3, Verdict.PERMANENT),
        ({"restartPolicy": "ExitCode", "permanentExitCodes": [137]}, 137, Verdict.PERMANENT),
        ({"restartPolicy": "ExitCode", "permanentExitCodes": [137]}, 143, Verdict.RETRY),
    ],
)
def test_verdicts(policy: dict[str, Any], code: int | None, expected: Verdict) -> None:
    assert verdict(failure(code), FailurePolicy.from_json(policy)) is expected


@pytest.mark.parametrize("policy", ["Never", "OnFailure", "ExitCode"])
def test_a_disruption_is_a_disruption_under_every_policy(policy: str) -> None:
    assert (
        verdict(failure(1, disrupted=True), FailurePolicy.from_json({"restartPolicy": policy}))
        is Verdict.DISRUPTION
    )


# --------------------------------------------------------------------------------- restart delay

DEFAULTS = RestartBackoff.from_json({"initialDelaySeconds": 10, "multiplier": 2, "maxDelaySeconds": 360})


@pytest.mark.parametrize(("previous", "base"), [(0, 10), (1, 20), (2, 40), (3, 80), (4, 160), (5, 320)])
def test_the_delay_doubles_from_the_initial_delay(previous: int, base: float) -> None:
    for seed in range(50):
        delay = restart_delay(DEFAULTS, previous, f"uid/{seed}")
        assert base <= delay < base * 1.1


def test_the_defaults_apply_when_backoff_is_empty() -> None:
    assert 10 <= restart_delay(RestartBackoff.from_json({}), 0, "s") < 11
    assert 20 <= restart_delay(RestartBackoff.from_json({}), 1, "s") < 22


def test_the_jitter_is_reproducible_and_spreads_jobs_apart() -> None:
    assert restart_delay(DEFAULTS, 2, "job-a/2") == restart_delay(DEFAULTS, 2, "job-a/2")
    delays = {restart_delay(DEFAULTS, 2, f"job-{n}/2") for n in range(100)}
    assert len(delays) > 90
    assert max(delays) - min(delays) > 3  # spread over most of the 10% (4 s) window


def test_no_delay_exceeds_max_delay_seconds() -> None:
    for previous in range(6, 12):
        for seed in range(20):
            assert restart_delay(DEFAULTS, previous, f"uid/{seed}") <= 360


def test_the_delay_stops_growing_at_the_cap() -> None:
    # Within the jitter window around maxDelaySeconds, however the jitter is applied there.
    for previous in (6, 10, 63, 64, 1000):
        assert 324 <= restart_delay(DEFAULTS, previous, "uid/1") < 396


def test_a_multiplier_of_one_keeps_the_delay_constant() -> None:
    backoff = RestartBackoff.from_json({"initialDelaySeconds": 30, "multiplier": 1, "maxDelaySeconds": 600})
    assert {int(restart_delay(backoff, n, "s")) // 30 for n in range(10)} == {1}


def test_a_zero_initial_delay_restarts_at_once() -> None:
    assert (
        restart_delay(RestartBackoff.from_json({"initialDelaySeconds": 0, "maxDelaySeconds": 0}), 5, "s") == 0
    )


def test_a_fractional_multiplier() -> None:
    backoff = RestartBackoff.from_json(
        {"initialDelaySeconds": 10, "multiplier": 1.5, "maxDelaySeconds": 1000}
    )
    assert 22.5 <= restart_delay(backoff, 2, "s") < 24.75


# ------------------------------------------------------------------------------------- podstate


def test_termination_prefers_the_first_failed_container() -> None:
    sidecar_ok = terminated(0, "Completed", name="sidecar")
    trainer = terminated(1, "Error", "boom")
    ended = podstate.termination(pod(phase="Failed", containers=[sidecar_ok, trainer]))
    assert ended == podstate.Termination("trainer", 1, "Error", "boom")


def test_termination_reads_the_last_state_of_a_restarted_container() -> None:
    entry = {"name": "trainer", "state": {"waiting": {}}, "lastState": terminated(2)["state"]}
    ended = podstate.termination(pod(phase="Failed", containers=[entry]))
    assert ended is not None
    assert ended.exit_code == 2


def test_termination_defaults_the_reason_from_the_exit_code() -> None:
    entries = [{"name": "trainer", "state": {"terminated": {"exitCode": 9}}}]
    ended = podstate.termination(pod(phase="Failed", containers=entries))
    assert ended == podstate.Termination("trainer", 9, "Error", "")


def test_a_running_pod_has_no_termination() -> None:
    assert podstate.termination(pod(containers=[{"name": "trainer", "state": {"running": {}}}])) is None


def test_scheduling_questions() -> None:
    unbound = pod(phase="Pending", node=None)
    assert not podstate.is_scheduled(unbound)
    assert podstate.unschedulable_message(unbound) is None
    unschedulable = pod(
        phase="Pending",
        node=None,
        conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/4 nodes"}
        ],
    )
    assert podstate.unschedulable_message(unschedulable) == "0/4 nodes"
    bound_condition = pod(phase="Pending", node=None, conditions=[{"type": "PodScheduled", "status": "True"}])
    assert podstate.is_scheduled(bound_condition)
    assert podstate.is_scheduled(pod(phase="Pending"))


def test_pod_identity_helpers() -> None:
    built = pod(2)
    assert podstate.replica_index(built) == 2
    built["metadata"]["labels"]["ml.example.com/replica-index"] = "x"
    assert podstate.replica_index(built) is None
    assert podstate.phase({"metadata": {}}) == "Pending"
    assert not podstate.is_terminating(built)
    built["metadata"]["deletionTimestamp"] = "2026-03-01T12:00:00Z"
    assert podstate.is_terminating(built)
    assert podstate.deletion_time(built) is not None
    assert podstate.node_name(built) == "node-1"


def test_node_readiness() -> None:
    assert not podstate.node_is_lost(make_node("n"))
    assert podstate.node_is_lost(make_node("n", False))
    assert podstate.node_is_lost(make_node("n", None))
    assert podstate.node_is_lost(None)
