"""The job lifecycle on the real local cluster: gang restarts, failure classification, deadlines,
suspend/resume, TTL and cleanPodPolicy, as `kubectl get trainingjob -o json`, Events and pods show it.

Each test runs the real operator for its own namespace (tests/e2e/conftest.py) and plays the kubelet
with tests/cluster.py's `end_pod`. Backoff delays, deadlines and TTLs are a few seconds so that each
test stays short; the timing bounds asserted are the ones the behaviour defines (a restart never
before its backoff delay, a deletion never before the TTL), everything else waits for a condition
with a deadline.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from crd import contract
from tests.cluster import Kubectl, KubectlError, add_disruption_condition, end_pod, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    PodWatch,
    condition,
    event_messages,
    events_of,
    job_manifest,
    pods_of,
    status_of,
    wait_for_events,
)
from tests.e2e.lifecycle_support import (
    NO_WORKERS,
    assert_replaced_as_a_gang,
    env_value,
    progress_patch,
    report_progress,
    running_pods,
    trainer_kubectl,
    uids,
    wait_pod_names,
    wait_state,
    wait_status,
    wait_workers,
    when,
    workers,
)
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]
pytestmark = pytest.mark.usefixtures("operator")


@pytest.fixture
def operator(start_operator: StartOperator) -> OperatorProcess:
    """The operator, applying progress reports at most once a second (the default is 5)."""
    return start_operator("--progress-interval=1")


def backoff(initial: int, maximum: int | None = None) -> JsonDict:
    return {"initialDelaySeconds": initial, "maxDelaySeconds": maximum or initial * 4}


def evict(kubectl: Kubectl, namespace: str, pod: str) -> None:
    """POSTs an Eviction for `pod` (what `kubectl drain` does)."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
    kubectl.run("create", "--raw", path, "-f", "-", stdin=json.dumps(body))


def restarting(status: JsonDict) -> bool:
    return status.get("state") == "Restarting"


def running_attempt(attempt: int) -> Callable[[JsonDict], bool]:
    return lambda status: status.get("state") == "Running" and status.get("attempt") == attempt


# ------------------------------------------------------------------------------------ gang restarts


def test_one_failed_worker_restarts_the_whole_gang_after_the_backoff(
    kubectl: Kubectl, namespace: str
) -> None:
    initial = 2
    manifest = job_manifest(
        "gang", numWorkers=3, failurePolicy={"restartPolicy": "OnFailure", "restartBackoff": backoff(initial)}
    )
    kubectl.apply(manifest, "-n", namespace)
    wait_state(kubectl, namespace, "gang", "Running")
    old = running_pods(kubectl, namespace, "gang", 0, 3)
    watch = PodWatch(kubectl, namespace, "gang")
    try:
        wait_for("the watch to list the pods", lambda: len(watch.events()) >= 3)

        ended = end_pod(kubectl, namespace, "gang-worker-1", exit_code=1)
        failed_at = when(ended["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"])

        during = wait_status(kubectl, namespace, "gang", "Restarting", restarting)
        wait_status(kubectl, namespace, "gang", "attempt 1 Running", running_attempt(1))
        new = running_pods(kubectl, namespace, "gang", 1, 3)
    finally:
        events = watch.stop()

    # While restarting: the condition, the counters and the earliest restart time.
    assert during["restartCount"] == 1
    assert during["restarts"] == {"failure": 1}
    assert during["lastRestartReason"] == "PodFailed"
    cond = condition(during, "Restarting")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "PodFailed")
    for fragment in ("pod gang-worker-1", "container trainer", "exit code 1", "restarting the whole gang"):
        assert fragment in cond["message"], cond["message"]
    restart_at = when(during["restartAt"])
    assert (restart_at - failed_at).total_seconds() >= initial

    # Every pod of attempt 0 was gone before the first pod of attempt 1 was added, and none of the
    # new pods was created before restartAt.
    created = assert_replaced_as_a_gang(events, uids(old))
    assert len(created) == 3
    assert min(created) >= restart_at, (created, restart_at)
    assert not uids(old) & uids(new)
    assert [pod["metadata"]["labels"][contract.ATTEMPT_LABEL] for pod in new] == ["1"] * 3

    # Back to Running: the restart is recorded, the condition cleared.
    status = status_of(kubectl, namespace, "gang")
    assert status["restartCount"] == 1
    assert status["lastRestartReason"] == "PodFailed"
    assert "restartAt" not in status
    cond = condition(status, "Restarting")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "GangRestarted")
    running = condition(status, "Running")
    assert running is not None
    assert running["status"] == "True"
    wait_for_events(
        kubectl,
        namespace,
        "gang",
        {"PodFailed": ["Restarting: pod gang-worker-1, container trainer, exit code 1"]},
    )
    restart_events = [e for e in events_of(kubectl, namespace, "gang") if e["reason"] == "PodFailed"]
    assert all(e["type"] == "Warning" for e in restart_events)


def test_a_gang_failing_all_at_once_is_one_restart(kubectl: Kubectl, namespace: str) -> None:
    """When one rank dies its peers' collectives fail too: several failures of one attempt are one
    restart, counted once against backoffLimit."""
    manifest = job_manifest(
        "cascade", numWorkers=3, failurePolicy={"backoffLimit": 1, "restartBackoff": backoff(3)}
    )
    kubectl.apply(manifest, "-n", namespace)
    wait_state(kubectl, namespace, "cascade", "Running")
    running_pods(kubectl, namespace, "cascade", 0, 3)

    # All at once, as the kubelets would report them; the operator may already be deleting some.
    def fail(index: int) -> None:
        try:
            end_pod(kubectl, namespace, f"cascade-worker-{index}", exit_code=1, message="NCCL timeout")
        except KubectlError as error:
            if "NotFound" not in error.stderr:
                raise

    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(fail, range(3)))
    status = wait_status(kubectl, namespace, "cascade", "attempt 1 Running", running_attempt(1))
    assert (status["restartCount"], status["restarts"]) == (1, {"failure": 1})
    restarts = [e for e in events_of(kubectl, namespace, "cascade") if e["reason"] == "PodFailed"]
    assert len(restarts) == 1
    assert restarts[0].get("count", 1) == 1


@pytest.mark.slow
def test_a_restart_survives_an_operator_restart_during_its_backoff(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, start_operator: StartOperator
) -> None:
    """status.restartAt is the only record of the backoff: a new operator process neither restarts
    the gang early nor counts the restart twice."""
    initial = 6
    manifest = job_manifest("durable", failurePolicy={"restartBackoff": backoff(initial)})
    kubectl.apply(manifest, "-n", namespace)
    wait_state(kubectl, namespace, "durable", "Running")
    old = running_pods(kubectl, namespace, "durable", 0, 2)
    watch = PodWatch(kubectl, namespace, "durable")
    try:
        wait_for("the watch to list the pods", lambda: len(watch.events()) >= 2)
        end_pod(kubectl, namespace, "durable-worker-0", exit_code=1)
        during = wait_status(kubectl, namespace, "durable", "Restarting", restarting)
        operator.stop()
        assert operator.process is not None
        assert operator.process.returncode == 0
        start_operator("--progress-interval=1")
        status = wait_status(kubectl, namespace, "durable", "attempt 1 Running", running_attempt(1))
    finally:
        events = watch.stop()

    assert (status["restartCount"], status["restarts"]) == (1, {"failure": 1})
    created = assert_replaced_as_a_gang(events, uids(old))
    assert len(created) == 2
    assert min(created) >= when(during["restartAt"])


def test_backoff_limit_exhausted_fails_the_job_naming_the_last_failure(
    kubectl: Kubectl, namespace: str
) -> None:
    manifest = job_manifest("flaky", failurePolicy={"backoffLimit": 1, "restartBackoff": backoff(1)})
    kubectl.apply(manifest, "-n", namespace)
    wait_state(kubectl, namespace, "flaky", "Running")

    end_pod(kubectl, namespace, "flaky-worker-1", exit_code=1)
    wait_status(kubectl, namespace, "flaky", "attempt 1 Running", running_attempt(1))
    running_pods(kubectl, namespace, "flaky", 1, 2)
    end_pod(kubectl, namespace, "flaky-worker-0", exit_code=42, message="CUDA error: out of memory")

    status = wait_state(kubectl, namespace, "flaky", "Failed")["status"]
    assert status["failureReason"] == "BackoffLimitExceeded"
    message = status["message"]
    assert message.startswith("failed after 1 restart(s) (failurePolicy.backoffLimit 1); last failure: ")
    for fragment in ("pod flaky-worker-0", "container trainer", "exit code 42", "reason Error", "CUDA error"):
        assert fragment in message, message
    failed = condition(status, "Failed")
    assert failed is not None
    assert (failed["status"], failed["reason"], failed["message"]) == (
        "True",
        "BackoffLimitExceeded",
        message,
    )
    assert status["restartCount"] == 1
    assert status["restarts"] == {"failure": 1}
    wait_for_events(kubectl, namespace, "flaky", {"BackoffLimitExceeded": [f"Failed: {message}"]})
    # cleanPodPolicy Running: the rank still running is stopped, the failed one kept for its logs.
    wait_pod_names(kubectl, namespace, "flaky", ["flaky-worker-0"])
    wait_workers(kubectl, namespace, "flaky", workers(failed=1))


@pytest.mark.slow
def test_disruptions_restart_without_consuming_the_backoff_limit(kubectl: Kubectl, namespace: str) -> None:
    """backoffLimit 0: a preemption and an eviction still restart the gang; the first real failure fails."""
    manifest = job_manifest("preempted", failurePolicy={"backoffLimit": 0, "restartBackoff": backoff(1)})
    kubectl.apply(manifest, "-n", namespace)
    wait_state(kubectl, namespace, "preempted", "Running")

    # Preemption as the kubelet reports it: the container killed, DisruptionTarget on the pod.
    end_pod(kubectl, namespace, "preempted-worker-1", exit_code=143, disruption="PreemptionByScheduler")
    during = wait_status(kubectl, namespace, "preempted", "Restarting", restarting)
    assert during["restarts"] == {"disruption": 1}
    assert during["lastRestartReason"] == "PreemptionByScheduler"
    cond = condition(during, "Restarting")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "PreemptionByScheduler")
    assert "pod preempted-worker-1" in cond["message"]
    status = wait_status(kubectl, namespace, "preempted", "attempt 1 Running", running_attempt(1))
    assert (status["restartCount"], status["restarts"]) == (1, {"disruption": 1})

    # Eviction through the real Eviction API: the API server marks the pod DisruptionTarget
    # (EvictionByEvictionAPI) and deletes it.
    running_pods(kubectl, namespace, "preempted", 1, 2)
    evict(kubectl, namespace, "preempted-worker-0")
    status = wait_status(kubectl, namespace, "preempted", "attempt 2 Running", running_attempt(2))
    assert (status["restartCount"], status["restarts"]) == (2, {"disruption": 2})
    assert status["lastRestartReason"] == "EvictionByEvictionAPI"

    # A test-made disruption on a running pod: the operator restarts on the condition alone, as the
    # pod is about to go.
    running_pods(kubectl, namespace, "preempted", 2, 2)
    add_disruption_condition(kubectl, namespace, "preempted-worker-1", "DeletionByTaintManager")
    status = wait_status(kubectl, namespace, "preempted", "attempt 3 Running", running_attempt(3))
    assert (status["restartCount"], status["restarts"]) == (3, {"disruption": 3})
    assert status["lastRestartReason"] == "DeletionByTaintManager"

    # The failure budget is untouched, and it is 0: the first worker failure fails the job.
    running_pods(kubectl, namespace, "preempted", 3, 2)
    end_pod(kubectl, namespace, "preempted-worker-1", exit_code=1)
    status = wait_state(kubectl, namespace, "preempted", "Failed")["status"]
    assert status["failureReason"] == "BackoffLimitExceeded"
    assert status["message"].startswith("failed after 0 restart(s) (failurePolicy.backoffLimit 0)")
    assert status["restarts"] == {"disruption": 3}


def test_exit_code_policy_retries_an_oom_kill_and_fails_on_an_application_error(
    kubectl: Kubectl, namespace: str
) -> None:
    policy = {"restartPolicy": "ExitCode", "backoffLimit": 3, "restartBackoff": backoff(1)}
    kubectl.apply(job_manifest("oom", failurePolicy=policy), "-n", namespace)
    wait_state(kubectl, namespace, "oom", "Running")

    end_pod(kubectl, namespace, "oom-worker-1", exit_code=137, reason="OOMKilled")
    during = wait_status(kubectl, namespace, "oom", "Restarting", restarting)
    assert during["lastRestartReason"] == "OOMKilled"
    assert during["restarts"] == {"failure": 1}
    cond = condition(during, "Restarting")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "OOMKilled")
    for fragment in ("pod oom-worker-1", "exit code 137", "reason OOMKilled"):
        assert fragment in cond["message"], cond["message"]
    wait_for_events(kubectl, namespace, "oom", {"OOMKilled": ["Restarting: pod oom-worker-1"]})
    wait_status(kubectl, namespace, "oom", "attempt 1 Running", running_attempt(1))

    running_pods(kubectl, namespace, "oom", 1, 2)
    end_pod(kubectl, namespace, "oom-worker-0", exit_code=1)
    status = wait_state(kubectl, namespace, "oom", "Failed")["status"]
    assert status["failureReason"] == "PodFailed"
    for fragment in ("pod oom-worker-0", "exit code 1", "a permanent exit code"):
        assert fragment in status["message"], status["message"]
    assert status["restartCount"] == 1


# -------------------------------------------------------------------------------------- deadline


def test_active_deadline_fails_the_job_and_removes_its_pods(kubectl: Kubectl, namespace: str) -> None:
    limit = 5
    kubectl.apply(job_manifest("deadline", failurePolicy={"activeDeadlineSeconds": limit}), "-n", namespace)
    wait_state(kubectl, namespace, "deadline", "Running")

    status = wait_state(kubectl, namespace, "deadline", "Failed")["status"]
    assert status["failureReason"] == "DeadlineExceeded"
    assert f"longer than failurePolicy.activeDeadlineSeconds ({limit}s)" in status["message"]
    failed = condition(status, "Failed")
    assert failed is not None
    assert (failed["status"], failed["reason"]) == ("True", "DeadlineExceeded")
    assert (when(status["completionTime"]) - when(status["startTime"])).total_seconds() >= limit
    assert "runningSince" not in status
    assert status["activeSeconds"] >= limit
    wait_for("the pods removed", lambda: pods_of(kubectl, namespace, "deadline") == [])
    wait_workers(kubectl, namespace, "deadline", NO_WORKERS)
    events = wait_for_events(
        kubectl, namespace, "deadline", {"DeadlineExceeded": ["Failed: the job was active"]}
    )
    assert {e["type"] for e in events if e["reason"] == "DeadlineExceeded"} == {"Warning"}


# ---------------------------------------------------------------------------------- suspend/resume


def test_suspend_and_resume_keep_restarts_and_resume_from_the_latest_checkpoint(
    cluster: Kubectl, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    name = "pausable"
    manifest = job_manifest(
        name,
        failurePolicy={"restartBackoff": backoff(1), "activeDeadlineSeconds": 3600},
        checkpoint={"enabled": True, "storage": {"type": "s3", "s3": {"bucket": "ckpt"}}},
        hyperparameters={"epochs": 10},
    )
    kubectl.apply(manifest, "-n", namespace)
    wait_state(kubectl, namespace, name, "Running")
    trainer = trainer_kubectl(cluster, namespace, name, tmp_path)

    # Rank 0 reports a checkpoint; a failure restarts the gang from it.
    first = f"s3://ckpt/{name}/epoch-2"
    report_progress(trainer, namespace, f"{name}-worker-0", {"epoch": 2, "checkpoint": first})
    wait_status(kubectl, namespace, name, "checkpoint 1", lambda s: checkpoint(s) == first)
    end_pod(kubectl, namespace, f"{name}-worker-1", exit_code=1)
    wait_status(kubectl, namespace, name, "attempt 1 Running", running_attempt(1))
    pods = running_pods(kubectl, namespace, name, 1, 2)
    assert [env_value(pod, "RESUME_FROM") for pod in pods] == [first, first]

    # A newer checkpoint from the new rank 0 (a new pod: its own bound token), then suspend.
    latest = f"s3://ckpt/{name}/epoch-3"
    stale, _ = trainer.patch_pod(namespace, f"{name}-worker-0", progress_patch({"epoch": 9}))
    assert stale in (401, 403), "the previous attempt's token must not speak for the new pod"
    trainer = trainer_kubectl(cluster, namespace, name, tmp_path)
    report_progress(trainer, namespace, f"{name}-worker-0", {"epoch": 3, "checkpoint": latest})
    before = wait_status(kubectl, namespace, name, "checkpoint 2", lambda s: checkpoint(s) == latest)
    assert before["checkpoint"]["count"] == 2
    assert before["runningSince"] == before["startTime"]
    kubectl.run(
        "patch", "trainingjob", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )

    suspended = wait_status(
        kubectl,
        namespace,
        name,
        "Suspended",
        lambda s: (s.get("state"), s.get("message")) == ("Suspended", "suspended"),
    )
    wait_for("the pods deleted", lambda: pods_of(kubectl, namespace, name) == [])
    assert suspended["restartCount"] == 1
    assert suspended["restarts"] == {"failure": 1}
    assert "runningSince" not in suspended  # the deadline clock stopped
    cond = condition(suspended, "Suspended")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("True", "Suspended")
    suspended_at = when(cond["lastTransitionTime"])
    active = suspended["activeSeconds"]
    assert 0 <= active <= (suspended_at - when(suspended["startTime"])).total_seconds() + 1
    running = condition(suspended, "Running")
    assert running is not None
    assert (running["status"], running["reason"]) == ("False", "Suspended")

    kubectl.run(
        "patch", "trainingjob", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    resumed = wait_status(kubectl, namespace, name, "attempt 2 Running", running_attempt(2))
    pods = running_pods(kubectl, namespace, name, 2, 2)
    assert [env_value(pod, "RESUME_FROM") for pod in pods] == [latest, latest]
    assert resumed["restartCount"] == 1
    assert resumed["restarts"] == {"failure": 1}
    assert resumed["checkpoint"]["latest"] == latest
    # The time suspended does not count: activeSeconds kept, the clock restarted at the resume.
    assert resumed["activeSeconds"] == active
    cond = condition(resumed, "Suspended")
    assert cond is not None
    assert (cond["status"], cond["reason"]) == ("False", "Resumed")
    assert when(resumed["runningSince"]) >= when(cond["lastTransitionTime"]) >= suspended_at
    wait_for_events(
        kubectl, namespace, name, {"Suspended": ["Suspended: "], "Resumed": ["Pending: resuming"]}
    )


@pytest.mark.slow
def test_the_deadline_clock_stops_while_suspended(kubectl: Kubectl, namespace: str) -> None:
    """activeDeadlineSeconds 6: suspended after a moment of running, the job stays Suspended well past
    6 s of wall time; resumed, it fails only once it has been active for 6 s in all."""
    limit = 6
    kubectl.apply(job_manifest("paused", failurePolicy={"activeDeadlineSeconds": limit}), "-n", namespace)
    started = wait_state(kubectl, namespace, "paused", "Running")["status"]
    kubectl.run(
        "patch", "trainingjob", "paused", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}'
    )
    suspended = wait_status(
        kubectl, namespace, "paused", "Suspended", lambda s: s.get("state") == "Suspended"
    )
    active = suspended["activeSeconds"]
    assert active < limit

    # Stay suspended until the job exists for longer than the deadline (plus a margin): never Failed.
    past = when(started["startTime"]) + timedelta(seconds=limit + 2)
    wait_for(
        "wall time past the deadline",
        lambda: assert_suspended(kubectl, namespace, "paused") and datetime.now(UTC) >= past,
        timeout=limit + 30,
    )
    assert status_of(kubectl, namespace, "paused")["activeSeconds"] == active

    kubectl.run(
        "patch", "trainingjob", "paused", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    resumed = wait_status(kubectl, namespace, "paused", "resumed", lambda s: bool(s.get("runningSince")))
    status = wait_state(kubectl, namespace, "paused", "Failed")["status"]
    assert status["failureReason"] == "DeadlineExceeded"
    # Failed no earlier than the active time left at the resume.
    assert (when(status["completionTime"]) - when(resumed["runningSince"])).total_seconds() >= limit - active
    assert status["activeSeconds"] >= limit
    assert (when(status["completionTime"]) - when(status["startTime"])).total_seconds() > limit + 2


def assert_suspended(kubectl: Kubectl, namespace: str, name: str) -> bool:
    status = status_of(kubectl, namespace, name)
    assert status["state"] == "Suspended", status
    assert "runningSince" not in status, status
    return True


def checkpoint(status: JsonDict) -> str | None:
    latest = (status.get("checkpoint") or {}).get("latest")
    return str(latest) if latest else None


# -------------------------------------------------------------------------------- TTL and clean-up


def test_ttl_after_finished_deletes_the_job_and_its_pods(kubectl: Kubectl, namespace: str) -> None:
    ttl = 3
    kubectl.apply(job_manifest("shortlived", ttlSecondsAfterFinished=ttl), "-n", namespace)
    wait_state(kubectl, namespace, "shortlived", "Running")
    running_pods(kubectl, namespace, "shortlived", 0, 2)

    for index in range(2):
        end_pod(kubectl, namespace, f"shortlived-worker-{index}", exit_code=0)
    status = wait_state(kubectl, namespace, "shortlived", "Completed")["status"]
    completed_at = when(status["completionTime"])
    # cleanPodPolicy Running keeps the finished pods until the job goes.
    assert len(pods_of(kubectl, namespace, "shortlived")) == 2

    wait_for(
        "the job deleted",
        lambda: kubectl.get_or_none("trainingjob", "shortlived", "-n", namespace) is None,
    )
    wait_for(
        "its pods garbage-collected", lambda: pods_of(kubectl, namespace, "shortlived") == [], timeout=120
    )
    expired = [e for e in events_of(kubectl, namespace, "shortlived") if e["reason"] == "TTLExpired"]
    assert len(expired) == 1, expired
    assert expired[0]["message"] == f"deleting the job {ttl}s after it finished"
    assert (when(expired[0]["firstTimestamp"]) - completed_at).total_seconds() >= ttl


@pytest.mark.parametrize(
    ("policy", "kept"),
    [
        ("All", {"done": [], "broken": []}),
        ("Running", {"done": ["worker-0", "worker-2"], "broken": ["worker-0", "worker-2"]}),
        ("None", {"done": ["worker-0", "worker-2"], "broken": ["worker-0", "worker-1", "worker-2"]}),
    ],
)
def test_clean_pod_policy_decides_which_pods_of_a_finished_job_stay(
    kubectl: Kubectl, namespace: str, policy: str, kept: dict[str, list[str]]
) -> None:
    """Two finished jobs per policy, each with a running, a succeeded and a finished-last pod.

    done (RankZero): worker-2 succeeds, then rank 0 does -> Completed while worker-1 still runs; the
    other ranks are always stopped then (successPolicy RankZero).
    broken (Never): worker-2 succeeds, then rank 0 fails -> Failed while worker-1 still runs; it is
    stopped unless the policy is None (keep everything, e.g. to inspect a hung rank). The finished
    pods stay unless the policy is All.
    """
    jobs = {
        "done": ({"successPolicy": {"mode": "RankZero"}}, 0, "Completed", "RankZeroSucceeded"),
        "broken": ({"failurePolicy": {"restartPolicy": "Never"}}, 1, "Failed", "PodFailed"),
    }
    for name, (spec, _, _, _) in jobs.items():
        kubectl.apply(job_manifest(name, numWorkers=3, cleanPodPolicy=policy, **spec), "-n", namespace)
    for name in jobs:
        wait_state(kubectl, namespace, name, "Running")
        running_pods(kubectl, namespace, name, 0, 3)
        end_pod(kubectl, namespace, f"{name}-worker-2", exit_code=0)
        wait_status(kubectl, namespace, name, "worker-2 succeeded", lambda s: s["workers"]["succeeded"] == 1)

    for name, (_, code, state, reason) in jobs.items():
        end_pod(kubectl, namespace, f"{name}-worker-0", exit_code=code)
        status = wait_state(kubectl, namespace, name, state)["status"]
        assert reason in (status.get("failureReason"), (condition(status, "Succeeded") or {}).get("reason"))
        expected = [f"{name}-{pod}" for pod in kept[name]]
        still_running = f"{name}-worker-1" in expected
        wait_pod_names(kubectl, namespace, name, expected)
        held = int(still_running)

        def holds_only_running_pods(status: JsonDict, held: int = held) -> bool:
            return bool(status.get("resources", {}).get("workers") == held)

        wait_status(
            kubectl, namespace, name, "resources held by the running pods only", holds_only_running_pods
        )
        pods = pods_of(kubectl, namespace, name)
        assert [p["metadata"]["name"] for p in pods] == expected
        phases = {p["metadata"]["name"]: p["status"]["phase"] for p in pods}
        assert all(
            phase in ("Succeeded", "Failed") for pod, phase in phases.items() if pod != f"{name}-worker-1"
        )
        if still_running:
            assert phases[f"{name}-worker-1"] == "Running"
        deleted = event_messages(events_of(kubectl, namespace, name), "SuccessfulDelete")
        assert any(f"{name}-worker-1" in message for message in deleted) != still_running, deleted
