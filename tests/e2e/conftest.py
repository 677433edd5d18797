"""End-to-end fixtures: the real operator process, running with exactly the rights deploy/ grants it.

Each test gets operators scoped to its namespace (`--namespace`). They authenticate with a token of
the operator's ServiceAccount (tests/e2e/operator_identity.py applies deploy/'s RBAC to the cluster),
so every end-to-end test that passes proves the deployed RBAC is enough, and their Lease is the one
deploy/ allows: `trainingjob-operator` in `trainingjob-system`. Tests run one after another, and a
stopped operator releases the Lease, so the next test's operator leads at once. Every operator
started through these fixtures is stopped (SIGTERM, then SIGKILL) when the test ends; when the test
fails, its namespace's Events and pods and each operator's decisions are attached to the failure
report.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import Kubectl
from tests.e2e import diagnostics, operator_identity
from tests.e2e.operator import OperatorProcess
from tests.e2e.realnode import NODE as REAL_NODE

StartOperator = Callable[..., OperatorProcess]
STARTED_OPERATORS = pytest.StashKey[list[OperatorProcess]]()
# Where deploy/ lets the operator hold its leader election Lease (a Role in its own namespace).
OPERATOR_NAMESPACE = "trainingjob-system"


@pytest.fixture(scope="session")
def service_account_identity(
    cluster: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> operator_identity.SessionIdentity:
    """The operator's ServiceAccount token kubeconfig, minted once per session and again only when the
    ServiceAccount was replaced (a test of `make deploy` on the session's cluster undeploys it)."""
    return operator_identity.SessionIdentity(cluster, tmp_path_factory.mktemp("identity"))


@pytest.fixture
def service_account_kubeconfig(service_account_identity: operator_identity.SessionIdentity) -> Path:
    """A token kubeconfig of the operator's ServiceAccount that is valid now."""
    return service_account_identity.kubeconfig()


@pytest.fixture
def operator_kubeconfig(service_account_kubeconfig: Path) -> Path:
    """The kubeconfig the operator under test uses."""
    return service_account_kubeconfig


@pytest.fixture
def lease_namespace() -> str:
    """The namespace of the operator's leader election Lease."""
    return OPERATOR_NAMESPACE


def namespace_sections(cluster: Kubectl, namespace: str, logged_pods: int = 6) -> list[tuple[str, str]]:
    """What the test's namespace holds now: the end of the container logs of its pods on the real
    node (the first `logged_pods` that started a container; kwok's pods have no logs, and asking
    for them would send the API server to a fake node's address), its pods, and its Events, last
    (what CI shows of a long report is its beginning and its end)."""
    sections = []
    pods = cluster.attempt("get", "pods", "-n", namespace, "-o", "json")
    listed = json.loads(pods.stdout).get("items", []) if pods.returncode == 0 else []
    started = [
        pod
        for pod in listed
        if (pod.get("spec") or {}).get("nodeName") == REAL_NODE
        and (pod.get("status") or {}).get("containerStatuses")
    ]
    for pod in started[:logged_pods]:
        name = pod["metadata"]["name"]
        logs = cluster.attempt("logs", name, "-n", namespace, "--all-containers", "--prefix", "--tail=15")
        sections.append((f"logs of {name} (end)", logs.stdout or logs.stderr))
    if pods.returncode == 0:
        sections.append((f"pods in {namespace}", diagnostics.pods_digest(listed)))
    events = cluster.attempt("get", "events", "-n", namespace, "-o", "json")
    if events.returncode == 0:
        listed = json.loads(events.stdout).get("items", [])
        sections.append((f"Events in {namespace}", diagnostics.events_digest(listed)))
    return sections


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries the decisions and end of every operator log it started, then its
    namespace's pods, their logs and Events (CI shows no files; tests/e2e/diagnostics.py)."""
    report = yield
    if report.when == "call" and report.failed:
        started: list[OperatorProcess] = item.stash.get(STARTED_OPERATORS, [])
        for index, operator in enumerate(started):
            if operator.log_path.exists():
                title = f"operator {index} log ({operator.log_path.name}: decisions, then its end)"
                lines = operator.log_path.read_text(errors="replace").splitlines()
                report.sections.append((title, diagnostics.log_digest(lines)))
        values = item.funcargs if isinstance(item, pytest.Function) else {}
        namespace, cluster = values.get("namespace"), values.get("cluster")
        if isinstance(namespace, str) and isinstance(cluster, Kubectl):
            report.sections.extend(namespace_sections(cluster, namespace))
    return report


@pytest.fixture
def start_operator(
    request: pytest.FixtureRequest,
    namespace: str,
    operator_kubeconfig: Path,
    lease_namespace: str,
    tmp_path: Path,
) -> Iterator[StartOperator]:
    """start_operator(*extra_args, name="operator", ready=True, **fields) -> a running OperatorProcess;
    `fields` are OperatorProcess's (`secure=True` for HTTPS metrics, `metrics_token`, `tls_context`)."""
    started: list[OperatorProcess] = []
    request.node.stash[STARTED_OPERATORS] = started

    def start(*args: str, name: str = "operator", ready: bool = True, **fields: Any) -> OperatorProcess:
        defaults = (f"--namespace={namespace}", f"--lease-namespace={lease_namespace}")
        operator = OperatorProcess(
            operator_kubeconfig, tmp_path / f"{name}-{len(started)}.log", (*defaults, *args), **fields
        )
        started.append(operator.start())
        if ready:
            operator.wait_ready()
        return operator

    try:
        yield start
    finally:
        for operator in started:
            operator.stop()


@pytest.fixture
def operator(start_operator: StartOperator) -> OperatorProcess:
    """One running operator for the test's namespace."""
    return start_operator()
