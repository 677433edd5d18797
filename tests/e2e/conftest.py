"""End-to-end fixtures: the real operator process, running with exactly the rights deploy/ grants it.

Each test gets operators scoped to its namespace (`--namespace`). They authenticate with a token of
the operator's ServiceAccount (tests/e2e/operator_identity.py applies deploy/'s RBAC to the cluster),
so every end-to-end test that passes proves the deployed RBAC is enough, and their Lease is the one
deploy/ allows: `trainingjob-operator` in `trainingjob-system`. Tests run one after another, and a
stopped operator releases the Lease, so the next test's operator leads at once. Every operator
started through these fixtures is stopped (SIGTERM, then SIGKILL) when the test ends; when the test
fails, the end of each one's log is attached to the failure report.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from tests.cluster import Kubectl
from tests.e2e import operator_identity
from tests.e2e.operator import OperatorProcess

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


def log_digest(operator: OperatorProcess, lines: int = 200) -> str:
    """The end of `operator`'s log, one short line per entry (time, level, job, message, error);
    urllib3's connection bookkeeping is left out, its request lines kept."""
    digest = []
    for line in operator.tail(lines).splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            digest.append(line)
            continue
        if not isinstance(entry, dict):
            digest.append(line)
            continue
        message = str(entry.get("message", ""))
        if entry.get("logger") == "urllib3.util.retry" or message.startswith("Starting new"):
            continue
        job = f" {entry['namespace']}/{entry['name']}" if entry.get("name") else ""
        digest.append(f"{entry.get('time', '')} {entry.get('level', '')}{job} {message}")
        if entry.get("exc_info"):
            digest.append(str(entry["exc_info"]))
    return "\n".join(digest)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries the end of every operator log it started (CI shows no files)."""
    report = yield
    if report.when == "call" and report.failed:
        started: list[OperatorProcess] = item.stash.get(STARTED_OPERATORS, [])
        for index, operator in enumerate(started):
            if operator.log_path.exists():
                title = f"operator {index} log ({operator.log_path.name}, end)"
                report.sections.append((title, log_digest(operator)))
    return report


@pytest.fixture
def start_operator(
    request: pytest.FixtureRequest,
    namespace: str,
    operator_kubeconfig: Path,
    lease_namespace: str,
    tmp_path: Path,
) -> Iterator[StartOperator]:
    """start_operator(*extra_args, name="operator", ready=True) -> a running OperatorProcess."""
    started: list[OperatorProcess] = []
    request.node.stash[STARTED_OPERATORS] = started

    def start(*args: str, name: str = "operator", ready: bool = True) -> OperatorProcess:
        defaults = (f"--namespace={namespace}", f"--lease-namespace={lease_namespace}")
        operator = OperatorProcess(
            operator_kubeconfig, tmp_path / f"{name}-{len(started)}.log", (*defaults, *args)
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
