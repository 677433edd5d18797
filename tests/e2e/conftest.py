"""End-to-end fixtures: the real operator process, watching the test's own namespace.

Each test gets operators scoped to its namespace (`--namespace`) with the leader election Lease in
that namespace too, so tests never see each other's jobs or leaders. Every operator started through
these fixtures is stopped (SIGTERM, then SIGKILL) when the test ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster import DEV, Kubectl
from tests.e2e.operator import OperatorProcess

StartOperator = Callable[..., OperatorProcess]


@pytest.fixture
def operator_kubeconfig(cluster: Kubectl) -> Path:
    """The kubeconfig the operator under test uses."""
    return DEV / "kubeconfig"


@pytest.fixture
def start_operator(namespace: str, operator_kubeconfig: Path, tmp_path: Path) -> Iterator[StartOperator]:
    """start_operator(*extra_args, name="operator", ready=True) -> a running OperatorProcess."""
    started: list[OperatorProcess] = []

    def start(*args: str, name: str = "operator", ready: bool = True) -> OperatorProcess:
        defaults = (f"--namespace={namespace}", f"--lease-namespace={namespace}")
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
