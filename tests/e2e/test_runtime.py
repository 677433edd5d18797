"""The operator's runtime against the real local control plane: leader election, crashes, API outages.

Each test runs the real operator (`python -m controller`) as a process scoped to the test's namespace
and checks what a cluster administrator would: who holds the Lease and who reconciles, how long a
standby takes to step in after the leader is killed or shut down, that nothing is missed or duplicated
when watches break, expire (410 Gone) or the process dies mid-reconcile, that failing jobs are retried
with backoff without stopping the others, and that /healthz, /readyz and the JSON logs say what is
going on.

Timing bounds are the ones the design promises, written out from the flags the test passes plus a
stated allowance for process scheduling and API latency on a busy two-core machine. Everything else
waits for a condition with a deadline (`tests.cluster.wait_for`), never a fixed sleep.

The API server restarts and outages briefly affect anyone else using the shared dev cluster; there
are two per run of this file (one `restart`, one `stop`/`start`).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import pytest

from controller.runtime.leaderelection import JITTER_FACTOR
from crd import contract
from tests.cluster import DEV, REPO, Kubectl, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]
LogEntry = dict[str, Any]

LEASE_NAME: Final = contract.OPERATOR_NAME
# Short leader election timings keep the tests quick; they respect lease > renew > 1.2 * retry.
LEASE_DURATION: Final = 5
RENEW_DEADLINE: Final = 4.0
RETRY_PERIOD: Final = 0.5
ELECTION_FLAGS: Final = (
    f"--lease-duration={LEASE_DURATION}",
    f"--renew-deadline={RENEW_DEADLINE}",
    f"--retry-period={RETRY_PERIOD}",
)
# One retry period as client-go jitters it: retry_period * [1, 1 + JITTER_FACTOR).
JITTERED_RETRY: Final = RETRY_PERIOD * (1 + JITTER_FACTOR)
# Process scheduling, Python start-up of the callbacks and one or two API round trips on a loaded
# two-core machine, on top of what the algorithm itself allows.
ALLOWANCE: Final = 1.5
# deploy/base/deployment.yaml: terminationGracePeriodSeconds.
GRACE_PERIOD: Final = 30.0
DEV_CLUSTER: Final = REPO / "hack" / "dev-cluster.sh"
RETRY_DELAY: Final = re.compile(r"retrying in ([0-9.]+)s")


# ------------------------------------------------------------------------------------------ helpers


def training_job(name: str, workers: int = 2, **spec: Any) -> JsonDict:
    """A CPU-only TrainingJob (no GPUs: the shared cluster's 32 GPUs stay free for other tests)."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": {"model": "cnn", "dataset": "mnist", "numWorkers": workers, "gpusPerWorker": 0, **spec},
    }


def create_jobs(kubectl: Kubectl, namespace: str, *jobs: JsonDict) -> None:
    kubectl.run(
        "create",
        "-n",
        namespace,
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(jobs)}),
    )


def job_status(kubectl: Kubectl, namespace: str, name: str) -> JsonDict:
    job = kubectl.get_or_none("trainingjob", name, "-n", namespace)
    status = (job or {}).get("status") or {}
    assert isinstance(status, dict)
    return status


def wait_running(kubectl: Kubectl, namespace: str, *names: str, timeout: float = 90) -> None:
    """Waits until every named job is Running with all its workers active."""
    for name in names:
        workers = int(kubectl.get_json("trainingjob", name, "-n", namespace)["spec"]["numWorkers"])

        def running(name: str = name, workers: int = workers) -> bool:
            status = job_status(kubectl, namespace, name)
            return status.get("state") == "Running" and (status.get("workers") or {}).get("active") == workers

        wait_for(f"{namespace}/{name} Running with {workers} active workers", running, timeout=timeout)


def managed_pods(kubectl: Kubectl, namespace: str) -> list[JsonDict]:
    return kubectl.items("pods", "-n", namespace, "-l", contract.MANAGED_SELECTOR)


def job_events(kubectl: Kubectl, namespace: str, name: str) -> list[JsonDict]:
    return kubectl.items(
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.kind={contract.KIND},involvedObject.name={name}",
    )


@pytest.fixture
def operator_kubeconfig(cluster: Kubectl) -> Path:
    """These tests take leader election, watches and the process apart in the test's own namespace,
    with admin rights; every other end-to-end test runs the operator with deploy/'s RBAC."""
    return DEV / "kubeconfig"


@pytest.fixture
def lease_namespace(namespace: str) -> str:
    return namespace


def lease_spec(kubectl: Kubectl, namespace: str) -> JsonDict:
    spec = kubectl.get_json("lease", LEASE_NAME, "-n", namespace).get("spec") or {}
    assert isinstance(spec, dict)
    return spec


def log_time(entry: LogEntry) -> float:
    """Seconds since the epoch of a JSON log line (`time` is RFC 3339 UTC with milliseconds)."""
    return datetime.fromisoformat(str(entry["time"]).replace("Z", "+00:00")).timestamp()


def find_log(
    operator: OperatorProcess, predicate: Callable[[LogEntry], bool], after: int = 0
) -> LogEntry | None:
    """The first of the operator's log lines from index `after` on that satisfies `predicate`."""
    return next((entry for entry in operator.logs()[after:] if predicate(entry)), None)


def wait_log(
    operator: OperatorProcess,
    description: str,
    predicate: Callable[[LogEntry], bool],
    *,
    after: int = 0,
    timeout: float = 60,
) -> LogEntry:
    return wait_for(description, lambda: find_log(operator, predicate, after), timeout=timeout)


def message_has(text: str) -> Callable[[LogEntry], bool]:
    return lambda entry: text in str(entry.get("message", ""))


def reconcile_lines(operator: OperatorProcess) -> list[LogEntry]:
    """Lines logged inside a reconcile (they carry the reconcile's id)."""
    return [entry for entry in operator.logs() if entry.get("reconcile_id")]


def identity_of(leader: OperatorProcess) -> str:
    """The identity the process holds the lease under, from its "acquired lease ... as <id>" line."""
    entry = wait_log(leader, "the acquired-lease line", message_has("acquired lease"))
    return str(entry["message"]).rsplit(" as ", 1)[1]


def writes_made(operator: OperatorProcess) -> float:
    """HTTP requests that change something, as counted by the operator's rest_client_requests_total."""
    total = 0.0
    for line in operator.metrics().splitlines():
        if line.startswith("rest_client_requests_total{") and re.search(
            r'method="(POST|PUT|PATCH|DELETE)"', line
        ):
            total += float(line.rpartition(" ")[2])
    return total


def jobs_by_state(operator: OperatorProcess, namespace: str) -> dict[str, float]:
    """trainingjob_jobs{namespace} by state, read from the operator's cache through /metrics."""
    found: dict[str, float] = {}
    for line in operator.metrics().splitlines():
        if line.startswith("trainingjob_jobs{") and f'namespace="{namespace}"' in line:
            state = re.search(r'state="([^"]*)"', line)
            value = float(line.rpartition(" ")[2])
            if state and value:
                found[state.group(1)] = value
    return found


def elector_pair(start_operator: StartOperator) -> tuple[OperatorProcess, OperatorProcess]:
    """Two operators with short leader election timings: the first leads, the second is its standby."""
    first = start_operator(*ELECTION_FLAGS, name="first")
    wait_for("the first operator leads", first.is_leader, timeout=30)
    second = start_operator(*ELECTION_FLAGS, name="second")
    wait_log(second, "the standby sees the leader", message_has("new leader for lease"), timeout=30)
    return first, second


def dev_cluster(*args: str) -> None:
    result = subprocess.run(
        [str(DEV_CLUSTER), *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"dev-cluster.sh {' '.join(args)}:\n{result.stdout}\n{result.stderr}"


@contextmanager
def api_server_stopped() -> Iterator[None]:
    """The API server is down inside the block and serving again (its /readyz ok) after it."""
    dev_cluster("stop", "kube-apiserver")
    try:
        yield
    finally:
        dev_cluster("start", "kube-apiserver")


@contextmanager
def paused(operator: OperatorProcess) -> Iterator[None]:
    """SIGSTOP for the block; SIGCONT whatever happens."""
    os.kill(operator.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(operator.pid, signal.SIGCONT)


def create_when_served(kubectl: Kubectl, namespace: str, *jobs: JsonDict) -> None:
    """Creates jobs right after an API server (re)start, when the CRD may still be settling in."""
    for job in jobs:

        def created(job: JsonDict = job) -> bool:
            result = kubectl.attempt("create", "-n", namespace, "-f", "-", stdin=json.dumps(job))
            return result.returncode == 0 or "AlreadyExists" in result.stderr

        wait_for(f"the API server accepts {job['metadata']['name']}", created, timeout=60, interval=0.5)


# -------------------------------------------------------------------------------- leader election


def test_only_the_leader_reconciles(kubectl: Kubectl, namespace: str, start_operator: StartOperator) -> None:
    first, second = elector_pair(start_operator)
    assert first.metric("leader_election_master_status") == 1.0
    assert second.metric("leader_election_master_status") == 0.0

    create_jobs(kubectl, namespace, training_job("alpha"), training_job("beta", workers=3))
    wait_running(kubectl, namespace, "alpha", "beta")
    # The leader writes its last events off the reconcile path: wait for them before counting.
    wait_for(
        "the Running events",
        lambda: all(
            any(e["reason"] == "Running" for e in job_events(kubectl, namespace, name))
            for name in ("alpha", "beta")
        ),
    )

    assert [first.is_leader(), second.is_leader()] == [True, False]
    assert {line["name"] for line in reconcile_lines(first)} >= {"alpha", "beta"}
    assert reconcile_lines(second) == []
    assert find_log(second, message_has("became the leader")) is None
    # The standby only read: no create, update, patch or delete, not even of the lease.
    assert writes_made(second) == 0

    # Every object was created once, by the leader.
    created = collections.Counter(
        (line["name"], line["kind"], line["object"])
        for line in first.logs()
        if line.get("action") == "create"
    )
    assert all(count == 1 for count in created.values()), created
    pods = {(name, obj) for name, kind, obj in created if kind == "Pod"}
    assert pods == {("alpha", f"alpha-worker-{i}") for i in range(2)} | {
        ("beta", f"beta-worker-{i}") for i in range(3)
    }
    assert len(managed_pods(kubectl, namespace)) == 5

    # One Event per happening, each seen once: a second reconciler would have doubled them.
    for name in ("alpha", "beta"):
        events = job_events(kubectl, namespace, name)
        keys = collections.Counter((e["reason"], e["message"]) for e in events)
        assert all(count == 1 for count in keys.values()), keys
        assert all(e.get("count", 1) == 1 for e in events), [(e["reason"], e.get("count")) for e in events]


@pytest.mark.slow
def test_standby_takes_over_after_the_leader_is_killed(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    first, second = elector_pair(start_operator)
    create_jobs(kubectl, namespace, training_job("before"))
    wait_running(kubectl, namespace, "before")
    transitions = int(lease_spec(kubectl, namespace).get("leaseTransitions", 0))

    killed_at = time.time()
    first.signal(signal.SIGKILL)
    assert first.wait_exit(timeout=10) == -signal.SIGKILL

    became = wait_log(second, "the standby becomes the leader", message_has("became the leader"), timeout=60)
    elapsed = log_time(became) - killed_at
    print(f"standby took over {elapsed:.2f}s after the kill")
    # The lease expires lease_duration after the standby last saw the leader's renewal change it. The
    # standby sees that renewal only at its next poll (one jittered retry period at most) and notices
    # the expiry at the poll after the deadline (another one at most): client-go's algorithm, which
    # never trusts the other machine's clock. The renewal itself was at most one retry period old.
    upper = LEASE_DURATION + 2 * JITTERED_RETRY + ALLOWANCE
    lower = LEASE_DURATION - RETRY_PERIOD - ALLOWANCE
    assert lower <= elapsed <= upper, f"took over {elapsed:.2f}s after the kill; expected [{lower}, {upper}]"
    assert second.is_leader()

    spec = lease_spec(kubectl, namespace)
    assert spec["holderIdentity"] == identity_of(second)
    assert spec["leaseDurationSeconds"] == LEASE_DURATION
    assert int(spec["leaseTransitions"]) == transitions + 1

    # The new leader reconciles new work, and has taken over the old job without disturbing it.
    create_jobs(kubectl, namespace, training_job("after"))
    wait_running(kubectl, namespace, "after", "before")
    assert "after" in {line["name"] for line in reconcile_lines(second)}
    assert len(managed_pods(kubectl, namespace)) == 4


@pytest.mark.slow
def test_sigterm_releases_the_lease_to_the_standby(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    first, second = elector_pair(start_operator)
    create_jobs(kubectl, namespace, training_job("before"))
    wait_running(kubectl, namespace, "before")
    transitions = int(lease_spec(kubectl, namespace).get("leaseTransitions", 0))
    first_identity = identity_of(first)

    sent = time.monotonic()
    first.signal(signal.SIGTERM)
    code = first.wait_exit(timeout=GRACE_PERIOD + 10)
    took = time.monotonic() - sent
    assert code == 0, first.tail()
    assert took < GRACE_PERIOD, f"exited {took:.1f}s after SIGTERM"

    # The lease right after the exit: released (empty holder, 1 s) or already the standby's.
    released_spec = lease_spec(kubectl, namespace)
    assert released_spec.get("holderIdentity", "") != first_identity
    if not released_spec.get("holderIdentity"):
        assert released_spec["leaseDurationSeconds"] == 1

    # Shutdown order: workers drain, then the lease is released, then the process ends.
    logs = first.logs()

    def position(predicate: Callable[[LogEntry], bool]) -> int:
        return next(i for i, entry in enumerate(logs) if predicate(entry))

    assert (
        position(message_has("received SIGTERM"))
        < position(message_has("draining workers"))
        < position(message_has("released lease"))
        < position(lambda entry: entry.get("message") == "stopped")
    )
    assert logs[position(lambda entry: entry.get("message") == "stopped")]["exit_code"] == 0
    released = logs[position(message_has("released lease"))]

    became = wait_log(second, "the standby becomes the leader", message_has("became the leader"), timeout=30)
    handover = log_time(became) - log_time(released)
    print(f"exited {took:.2f}s after SIGTERM; standby took over {handover:.2f}s after the release")
    # A released lease is free at once: the standby takes it at its next poll.
    assert handover <= JITTERED_RETRY + ALLOWANCE, f"took over {handover:.2f}s after the release"

    second_identity = identity_of(second)
    assert released_spec.get("holderIdentity", "") in ("", second_identity)
    spec = lease_spec(kubectl, namespace)
    assert spec["holderIdentity"] == second_identity
    assert int(spec["leaseTransitions"]) == transitions + 1

    create_jobs(kubectl, namespace, training_job("after"))
    wait_running(kubectl, namespace, "after", "before")
    assert "after" in {line["name"] for line in reconcile_lines(second)}


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

        # Not ready, naming the failing watch; still alive (a liveness probe must not restart it).
        def not_ready() -> str | None:
            code, text = operator.get("/readyz")
            return text if code == 503 else None

        body = wait_for("/readyz 503", not_ready, timeout=30)
        assert f"informer {informer}: watch failing" in body, body
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
    created = [entry for entry in entries if entry.get("action") == "create" and entry["kind"] == "Pod"]
    assert {entry["object"] for entry in created} == {"logged-worker-0", "logged-worker-1"}
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
