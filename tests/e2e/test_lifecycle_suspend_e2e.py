"""Suspend and resume, and what happens to a finished job, end to end: restarts kept and training
resumed from the latest checkpoint across a suspension, the deadline clock stopped while suspended,
ttlSecondsAfterFinished, and cleanPodPolicy.

Split out of tests/e2e/test_lifecycle_e2e.py (gang restarts, failure policies, deadlines).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from testbed import Kubectl, end_pod, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    condition,
    event_messages,
    events_of,
    job_manifest,
    pods_of,
    status_of,
    wait_for_events,
)
from tests.e2e.lifecycle_support import (
    backoff,
    env_value,
    progress_patch,
    report_progress,
    running_attempt,
    running_pods,
    trainer_kubectl,
    wait_pod_names,
    wait_state,
    wait_status,
    when,
)
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]
pytestmark = pytest.mark.usefixtures("operator")


@pytest.fixture
def operator(start_operator: StartOperator) -> OperatorProcess:
    """The operator, applying progress reports at most once a second (the default is 5)."""
    return start_operator("--progress-interval=1")


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
