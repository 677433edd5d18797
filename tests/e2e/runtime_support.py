"""What the runtime tests end to end share (tests/e2e/test_runtime.py, tests/e2e/test_runtime_faults_e2e.py):
short leader-election timings, jobs created and waited for, the operator's log lines and write
counts, an API server stopped for a block, a paused operator, and the fixtures of the operator's own
kubeconfig and the lease's namespace, which each test module binds to its own names (start_operator
asks for them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import pytest

from controller.runtime.leaderelection import JITTER_FACTOR
from crd import contract
from testbed import Kubectl, wait_for
from tests.cluster import DEV, REPO
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
