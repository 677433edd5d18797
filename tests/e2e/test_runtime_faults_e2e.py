"""The operator's runtime under faults end to end: an API server outage reported and recovered from,
an expired resourceVersion relisted without missing anything, repeated kills mid-creation leaving no
duplicate or orphan, pods the API server refuses failing only their job, a quota blocking a job
with backoff until lifted, and the process basics (SIGTERM without leader election, JSON logs, the
log level from the environment).

Split out of tests/e2e/test_runtime.py (leader election).
"""

from __future__ import annotations

import collections
import itertools
import re
import signal
import time
from collections.abc import Iterator

import pytest

from crd import contract
from testbed import Kubectl, wait_for
from tests.e2e import runtime_support
from tests.e2e.conftest import StartOperator
from tests.e2e.runtime_support import (
    ELECTION_FLAGS,
    GRACE_PERIOD,
    RENEW_DEADLINE,
    RETRY_DELAY,
    JsonDict,
    api_server_stopped,
    create_jobs,
    create_when_served,
    dev_cluster,
    find_log,
    job_events,
    job_status,
    jobs_by_state,
    log_time,
    managed_pods,
    message_has,
    paused,
    reconcile_lines,
    training_job,
    wait_log,
    wait_running,
)

# The shared fixtures, bound here so that pytest finds them for this module's tests.
operator_kubeconfig = runtime_support.operator_kubeconfig
lease_namespace = runtime_support.lease_namespace


# ------------------------------------------------------------------------------- the API server


@pytest.fixture
def second_namespace(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """Another, empty namespace for an operator that must not touch the test's jobs."""
    name = f"{namespace}-b"
    kubectl.run("create", "namespace", name)
    try:
        yield name
    finally:
        kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.mark.slow
def test_api_server_outage_is_reported_and_recovered_from(
    kubectl: Kubectl, namespace: str, second_namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator("--leader-elect=false")
    # A leader through the same outage (watching a namespace of its own): it cannot renew its lease
    # and, by design, ends the process (crash-only) rather than go on as a half-leader.
    elected = start_operator(*ELECTION_FLAGS, f"--namespace={second_namespace}", name="elected")
    wait_for("the elected operator leads", elected.is_leader, timeout=30)
    create_jobs(kubectl, namespace, training_job("old-kept"), training_job("old-deleted"))
    wait_running(kubectl, namespace, "old-kept", "old-deleted")
    informer = f"trainingjobs in {namespace}"

    with api_server_stopped():
        down = len(operator.logs())
        assert elected.wait_exit(timeout=RENEW_DEADLINE + 30) == 1, elected.tail()
        assert find_log(elected, message_has("failed to renew lease")) is not None
        assert find_log(elected, message_has("lost the leader lease")) is not None

        # Not ready, naming the failing watch; still alive (a liveness probe must not restart it). Each
        # informer notices the outage on its own watch, so the TrainingJobs' may be named a moment
        # after the pods' and services'.
        def not_ready() -> str | None:
            code, text = operator.get("/readyz")
            return text if code == 503 and f"informer {informer}: watch failing" in text else None

        wait_for("/readyz 503 naming the TrainingJobs' watch", not_ready, timeout=30)
        assert operator.get("/healthz") == (200, "ok")

        # It keeps retrying that watch, each pause longer than the one before (capped backoff).
        def retries() -> list[float]:
            return [
                float(match.group(1))
                for entry in operator.logs()[down:]
                if informer in str(entry.get("message", ""))
                and (match := RETRY_DELAY.search(str(entry.get("message", ""))))
            ]

        def three_retries() -> list[float] | None:
            found = retries()
            return found if len(found) >= 3 else None

        delays = wait_for("three retries of the job watch", three_retries, timeout=60)
        assert delays == sorted(delays), delays
        assert delays[-1] > delays[0]
        assert operator.alive()
        assert operator.get("/readyz")[0] == 503

    # Right after the API server is back: new jobs, and one that existed before is deleted.
    create_when_served(kubectl, namespace, training_job("new-1"), training_job("new-2", workers=3))
    kubectl.run("delete", "trainingjob", "old-deleted", "-n", namespace, "--wait=false")

    wait_for("/readyz 200 again", lambda: operator.get("/readyz") == (200, "ok"), timeout=120)
    wait_running(kubectl, namespace, "new-1", "new-2", "old-kept", timeout=120)
    wait_for(
        "the operator's cache: 3 Running jobs, the deleted one gone",
        lambda: jobs_by_state(operator, namespace) == {"Running": 3},
        timeout=60,
    )
    assert operator.alive()
    pods = managed_pods(kubectl, namespace)
    owners = collections.Counter(pod["metadata"]["labels"][contract.JOB_NAME_LABEL] for pod in pods)
    assert owners["new-1"] == 2
    assert owners["new-2"] == 3
    assert owners["old-kept"] == 2


@pytest.mark.slow
def test_expired_resource_version_relists_and_misses_nothing(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator("--leader-elect=false")
    create_jobs(kubectl, namespace, training_job("kept"), training_job("deleted"))
    wait_running(kubectl, namespace, "kept", "deleted")

    # While the operator is frozen: a write it does not watch moves the store's revision past the
    # last one it saw; the API server restarts with an empty watch cache that starts after that
    # revision; jobs are created and one is deleted. On waking, its watches resume from revisions the
    # new cache no longer holds: 410 Gone.
    with paused(operator):
        kubectl.run("create", "configmap", "unwatched", "-n", namespace)
        dev_cluster("restart", "kube-apiserver")
        create_when_served(kubectl, namespace, training_job("created-1"), training_job("created-2"))
        kubectl.run("delete", "trainingjob", "deleted", "-n", namespace, "--wait=false")
        resumed = len(operator.logs())

    expired = wait_log(
        operator,
        "the job watch expiring",
        lambda e: f"watch of trainingjobs in {namespace} expired" in str(e.get("message", "")),
        after=resumed,
        timeout=60,
    )
    assert "too old resource version" in expired["message"]
    after_expiry = operator.logs().index(expired)
    wait_log(
        operator,
        "a relist of the jobs",
        lambda e: str(e.get("message", "")).startswith(f"listed 3 trainingjobs in {namespace}"),
        after=after_expiry,
    )

    wait_running(kubectl, namespace, "created-1", "created-2", "kept")
    # The deleted job vanished between two lists: the operator forgot it (a synthesised delete).
    wait_for(
        "the operator's cache: 3 Running jobs",
        lambda: jobs_by_state(operator, namespace) == {"Running": 3},
        timeout=60,
    )
    wait_log(
        operator,
        "the deleted job reconciled as gone",
        lambda e: e.get("name") == "deleted" and "job is gone" in str(e.get("message", "")),
        after=resumed,
    )
    # The relist changed nothing for the job that was there all along (a node lost by someone else's
    # test on the shared cluster would be the only reason to replace its pods).
    replaced = [
        line
        for line in operator.logs()[resumed:]
        if line.get("name") == "kept" and line.get("action") == "delete"
    ]
    assert all("NodeLost" in line["message"] for line in replaced), replaced
    assert operator.alive()


# ------------------------------------------------------------------------------------- crashes


@pytest.mark.slow
def test_repeated_kill_mid_creation_leaves_no_duplicate_or_orphan(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    jobs, workers = ("one", "two", "three"), 8
    # One create at a time and few requests per second, so a kill lands between pod creations.
    slow = ("--leader-elect=false", "--create-concurrency=1", "--qps=8", "--burst=1")
    create_jobs(kubectl, namespace, *(training_job(name, workers=workers) for name in jobs))
    total = len(jobs) * workers

    seen_at_kill: list[int] = []
    for threshold in (1, 7, 14, 21):
        operator = start_operator(*slow, name=f"churn-{threshold}", ready=False)

        def enough_pods(threshold: int = threshold) -> int | None:
            found = len(managed_pods(kubectl, namespace))
            return found if found >= threshold else None

        count = wait_for(f"{threshold} pods", enough_pods, timeout=90, interval=0.05)
        operator.signal(signal.SIGKILL)
        operator.wait_exit(timeout=10)
        seen_at_kill.append(len(managed_pods(kubectl, namespace)))
        assert count <= total
    # At least two kills landed mid-creation, not after the last pod.
    assert len([n for n in seen_at_kill if n < total]) >= 2, seen_at_kill

    start_operator("--leader-elect=false", name="final")
    wait_running(kubectl, namespace, *jobs, timeout=120)

    def settled() -> list[JsonDict] | None:
        pods = managed_pods(kubectl, namespace)
        return None if any(pod["metadata"].get("deletionTimestamp") for pod in pods) else pods

    pods = wait_for("no pod terminating", settled, timeout=60)
    assert len(pods) == total, sorted(pod["metadata"]["name"] for pod in pods)
    uids = {name: kubectl.get_json("trainingjob", name, "-n", namespace)["metadata"]["uid"] for name in jobs}
    ranks: dict[str, list[int]] = collections.defaultdict(list)
    for pod in pods:
        controllers = [ref for ref in pod["metadata"].get("ownerReferences", []) if ref.get("controller")]
        assert len(controllers) == 1, pod["metadata"]["name"]
        owner = controllers[0]
        assert owner["kind"] == contract.KIND
        assert uids.get(owner["name"]) == owner["uid"], pod["metadata"]["name"]
        ranks[owner["name"]].append(int(pod["metadata"]["labels"][contract.REPLICA_INDEX_LABEL]))
    assert {name: sorted(found) for name, found in ranks.items()} == {
        name: list(range(workers)) for name in jobs
    }
    for name in jobs:
        status = job_status(kubectl, namespace, name)
        assert status["state"] == "Running"
        assert status["workers"]["active"] == workers


# -------------------------------------------------------------------------------------- faults


def test_pods_the_api_refuses_fail_only_their_job(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator("--leader-elect=false")
    # Kubernetes' schema allows it (so the API accepts the job), but a Pod needs at least one node selector
    # term.
    invalid_affinity: JsonDict = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    }
    create_jobs(
        kubectl,
        namespace,
        training_job("refused", scheduling={"affinity": invalid_affinity}),
        training_job("fine"),
    )
    wait_for(
        "refused Failed",
        lambda: job_status(kubectl, namespace, "refused").get("state") == "Failed",
        timeout=60,
    )
    wait_running(kubectl, namespace, "fine")

    status = job_status(kubectl, namespace, "refused")
    assert status["failureReason"] == "InvalidSpec"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec")
    assert "nodeSelectorTerms" in failed["message"]
    wait_for(
        "an InvalidSpec warning event",
        lambda: any(
            e["type"] == "Warning" and e["reason"] == "InvalidSpec"
            for e in job_events(kubectl, namespace, "refused")
        ),
    )
    assert not [
        p
        for p in managed_pods(kubectl, namespace)
        if p["metadata"]["labels"][contract.JOB_NAME_LABEL] == "refused"
    ]
    refusals = [
        line
        for line in operator.logs()
        if line.get("action") == "create-failed" and line.get("name") == "refused"
    ]
    assert refusals
    assert all(line["namespace"] == namespace and line.get("reconcile_id") for line in refusals)
    assert operator.get("/healthz") == (200, "ok")


@pytest.mark.slow
def test_quota_blocks_a_job_with_backoff_until_lifted(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    # No BestEffort pod may run in the namespace; pods with a CPU request are not affected.
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-besteffort-pods", "namespace": namespace},
            "spec": {"hard": {"pods": "0"}, "scopes": ["BestEffort"]},
        }
    )
    wait_for(
        "the quota controller to publish the quota's status",
        lambda: (
            kubectl.get_json("resourcequota", "no-besteffort-pods", "-n", namespace).get("status") or {}
        ).get("hard"),
    )
    operator = start_operator("--leader-elect=false")
    create_jobs(
        kubectl,
        namespace,
        training_job("blocked"),
        training_job("fine", resources={"requests": {"cpu": "100m"}}),
    )

    def attempts() -> list[float]:
        """When each reconcile of the blocked job that failed to create its pods started."""
        first_line: dict[str, float] = {}
        for line in operator.logs():
            if line.get("action") == "create-failed" and line.get("name") == "blocked":
                first_line.setdefault(str(line["reconcile_id"]), log_time(line))
        return sorted(first_line.values())

    # Blocked and retried with growing pauses, while the other job runs (the workers keep going).
    wait_running(kubectl, namespace, "fine")
    # The per-key backoff starts at 5 ms and doubles. The first pauses hide behind the reconcile's own
    # duration (and a loaded machine's API latency); from the tenth attempt on the pause dominates:
    # 1.28 s, 2.56 s, 5.12 s.
    wait_for("ten failed attempts", lambda: len(attempts()) >= 10, timeout=60)
    retries = operator.metric("workqueue_retries_total")
    assert retries is not None
    assert retries >= 9
    wait_for("twelve failed attempts", lambda: len(attempts()) >= 12, timeout=60)
    assert (operator.metric("workqueue_retries_total") or 0) > retries
    gaps = [later - earlier for earlier, later in itertools.pairwise(attempts())]
    assert gaps[-1] >= 2.0, gaps
    assert gaps[-1] > 1.5 * gaps[-2] > 1.5 * 1.5 * gaps[-3], gaps
    refusal = next(
        line
        for line in operator.logs()
        if line.get("action") == "create-failed" and line.get("name") == "blocked"
    )
    assert refusal["namespace"] == namespace
    assert "exceeded quota" in refusal["message"]
    status = job_status(kubectl, namespace, "blocked")
    assert status.get("state") not in ("Failed", "Running")
    created = next(c for c in status["conditions"] if c["type"] == "Created")
    assert (created["status"], created["reason"]) == ("False", "FailedCreate")
    assert any(
        e["type"] == "Warning" and e["reason"] == "FailedCreate"
        for e in job_events(kubectl, namespace, "blocked")
    )
    assert operator.get("/healthz") == (200, "ok")

    kubectl.run("delete", "resourcequota", "no-besteffort-pods", "-n", namespace)
    wait_running(kubectl, namespace, "blocked", timeout=120)
    assert operator.alive()


# ------------------------------------------------------------------------------ process basics


def test_sigterm_without_leader_election_and_json_logs(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator("--leader-elect=false", "--log-level=INFO")
    assert operator.get("/healthz") == (200, "ok")
    assert operator.get("/readyz") == (200, "ok")
    # Ready means the caches have synced; without leader election the workers start right after.
    wait_for("the operator to start its workers", operator.is_leader, timeout=30)

    create_jobs(kubectl, namespace, training_job("logged"))
    wait_running(kubectl, namespace, "logged")

    raw = operator.log_path.read_text().splitlines()
    entries = operator.logs()
    assert raw
    assert len(entries) == len(raw), "every line is one JSON object"
    # --log-level=INFO wins over LOG_LEVEL=DEBUG in the environment.
    assert {entry["level"] for entry in entries} <= {"INFO", "WARNING", "ERROR"}
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= set(entry)
    created = {obj for entry in entries if entry.get("action") == "create" for obj in entry["objects"]}
    assert {obj for obj in created if obj.startswith("Pod/")} == {
        "Pod/logged-worker-0",
        "Pod/logged-worker-1",
    }
    for entry in reconcile_lines(operator):
        assert entry["namespace"] == namespace
        assert entry["name"] == "logged"
        assert re.fullmatch(r"[0-9a-f-]{36}", entry["reconcile_id"])
    assert len({entry["reconcile_id"] for entry in reconcile_lines(operator)}) >= 2

    sent = time.monotonic()
    operator.signal(signal.SIGTERM)
    assert operator.wait_exit(timeout=GRACE_PERIOD) == 0, operator.tail()
    took = time.monotonic() - sent
    print(f"exited {took:.2f}s after SIGTERM")
    # Promptly: well inside the 30 s grace period; there is no lease to release.
    assert took < 10.0, f"exited {took:.1f}s after SIGTERM"
    last = operator.logs()[-1]
    assert (last["message"], last["exit_code"]) == ("stopped", 0)
    # Stopping the workers of an operator that never held a lease releases nothing.
    assert find_log(operator, message_has("released lease")) is None


def test_log_level_from_the_environment(
    namespace: str, start_operator: StartOperator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tests/e2e/operator.py passes $TJ_TEST_LOG_LEVEL to the operator as LOG_LEVEL.
    monkeypatch.setenv("TJ_TEST_LOG_LEVEL", "WARNING")
    quiet = start_operator("--leader-elect=false", name="quiet")
    monkeypatch.setenv("TJ_TEST_LOG_LEVEL", "DEBUG")
    chatty = start_operator("--leader-elect=false", "--lease-name=other", name="chatty")
    for operator in (quiet, chatty):
        operator.signal(signal.SIGTERM)
        assert operator.wait_exit(timeout=GRACE_PERIOD) == 0
    # A clean start and stop logs nothing at WARNING or above; anything that does show is no lower.
    assert {entry["level"] for entry in quiet.logs()} <= {"WARNING", "ERROR"}
    assert quiet.log_path.read_text().count("\n") <= 5
    assert "DEBUG" in {entry["level"] for entry in chatty.logs()}
    assert len(chatty.logs()) > 20
