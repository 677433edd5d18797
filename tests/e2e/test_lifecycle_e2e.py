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
from typing import Any

import pytest

from crd import contract
from testbed import Kubectl, KubectlError, add_disruption_condition, end_pod, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    PodWatch,
    condition,
    events_of,
    job_manifest,
    pods_of,
    status_of,
    wait_for_events,
)
from tests.e2e.lifecycle_support import (
    NO_WORKERS,
    assert_replaced_as_a_gang,
    backoff,
    running_attempt,
    running_pods,
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


def evict(kubectl: Kubectl, namespace: str, pod: str) -> None:
    """POSTs an Eviction for `pod` (what `kubectl drain` does)."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
    kubectl.run("create", "--raw", path, "-f", "-", stdin=json.dumps(body))


def restarting(status: JsonDict) -> bool:
    return status.get("state") == "Restarting"


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


# --------------------------------------------------------------------------------- in-place restarts


def report_run(
    kubectl: Kubectl, namespace: str, pod: str, attempt: int, state: str, *, code: int = 0
) -> None:
    """Plays rank `pod`'s supervisor (kwok runs no process): its run annotation, as it patches it."""
    body: JsonDict = {"attempt": attempt, "state": state, "at": "2026-03-01T12:00:00.000Z"}
    if state == "Exited":
        body["exitCode"] = code
    annotation = f"{contract.RUN_ANNOTATION}={json.dumps(body)}"
    kubectl.run("annotate", "pod", pod, "-n", namespace, "--overwrite", annotation)


def in_place_phase(phase: str, attempt: int) -> Callable[[JsonDict], bool]:
    return lambda status: (
        status.get("inPlaceRestart", {}).get("phase") == phase
        and (status["inPlaceRestart"].get("attempt") == attempt)
    )


def test_an_in_place_restart_keeps_every_pod_and_counts_the_failure_once(
    kubectl: Kubectl, namespace: str
) -> None:
    """restartStrategy InPlace through the real API server: the orders in status.inPlaceRestart (the
    schema keeps them), the supervisors' run annotations, no pod deleted or created, one restart."""
    policy = {"restartPolicy": "OnFailure", "restartBackoff": backoff(1), "restartStrategy": "InPlace"}
    kubectl.apply(job_manifest("inplace", failurePolicy=policy), "-n", namespace)
    wait_state(kubectl, namespace, "inplace", "Running")
    old = running_pods(kubectl, namespace, "inplace", 0, 2)
    for pod in old:
        command = pod["spec"]["containers"][0]["command"]
        assert command[:2] == ["python3", "-c"], command
        assert command[3:] == ["--", *contract.DEFAULT_COMMAND], command
    pods = ["inplace-worker-0", "inplace-worker-1"]
    for name in pods:
        report_run(kubectl, namespace, name, 0, "Running")

    report_run(kubectl, namespace, pods[1], 0, "Exited", code=1)
    stopping = wait_status(kubectl, namespace, "inplace", "Stopping 1", in_place_phase("Stopping", 1))
    assert stopping["state"] == "Restarting"
    assert stopping["restarts"] == {"failure": 1}
    assert "exit code 1" in stopping["message"]
    report_run(kubectl, namespace, pods[0], 0, "Exited", code=143)
    starting = wait_status(kubectl, namespace, "inplace", "Starting 1", in_place_phase("Starting", 1))
    assert starting["attempt"] == 1
    assert starting["lastRestartKind"] == "InPlace"
    for name in pods:
        report_run(kubectl, namespace, name, 1, "Running")
    status = wait_status(kubectl, namespace, "inplace", "attempt 1 Running", running_attempt(1))
    assert status["restartCount"] == 1
    assert status["restarts"] == {"failure": 1}
    assert uids(pods_of(kubectl, namespace, "inplace")) == uids(old)
    wait_for_events(
        kubectl, namespace, "inplace", {"RestartedInPlace": ["restarting the training processes"]}
    )
