"""End-to-end fixtures: the real operator process, running with exactly the rights deploy/ grants it.

Each test gets operators scoped to its namespace (`--namespace`). They authenticate with a token of
the operator's ServiceAccount (tests/e2e/operator_identity.py applies deploy/'s RBAC to the cluster),
so every end-to-end test that passes proves the deployed RBAC is enough, and their Lease is the one
deploy/ allows: `trainingjob-operator` in `trainingjob-system`. Tests run one after another, and a
stopped operator releases the Lease, so the next test's operator leads at once. Every operator
started through these fixtures is stopped (SIGTERM, then SIGKILL) when the test ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster import Kubectl
from tests.e2e import operator_identity
from tests.e2e.operator import OperatorProcess

StartOperator = Callable[..., OperatorProcess]
# Where deploy/ lets the operator hold its leader election Lease (a Role in its own namespace).
OPERATOR_NAMESPACE = "trainingjob-system"


@pytest.fixture(scope="session")
def service_account_kubeconfig(cluster: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A token kubeconfig of the operator's ServiceAccount, minted once per session."""
    return operator_identity.operator_kubeconfig(cluster, tmp_path_factory.mktemp("identity"), duration="12h")


@pytest.fixture
def operator_kubeconfig(service_account_kubeconfig: Path) -> Path:
    """The kubeconfig the operator under test uses."""
    return service_account_kubeconfig


@pytest.fixture
def lease_namespace() -> str:
    """The namespace of the operator's leader election Lease."""
    return OPERATOR_NAMESPACE


@pytest.fixture
def start_operator(
    namespace: str, operator_kubeconfig: Path, lease_namespace: str, tmp_path: Path
) -> Iterator[StartOperator]:
    """start_operator(*extra_args, name="operator", ready=True) -> a running OperatorProcess."""
    started: list[OperatorProcess] = []

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
