"""Fixtures of the fuzz tests: the operator's identity, and the fuzz summary printed after the run.

The fuzz run needs an operator that serves every namespace (each batch gets its own), running as the
operator's ServiceAccount with the rights deploy/ grants it, like the end-to-end tests' operators.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import Kubectl
from tests.e2e import operator_identity

SUMMARIES = pytest.StashKey[list[str]]()
OPERATOR_NAMESPACE = "trainingjob-system"


@pytest.fixture(scope="session")
def fuzz_operator_kubeconfig(cluster: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return operator_identity.operator_kubeconfig(
        cluster, tmp_path_factory.mktemp("fuzz-identity"), duration="12h"
    )


def record_summary(config: pytest.Config, line: str) -> None:
    config.stash.setdefault(SUMMARIES, []).append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The fuzz summary lines, shown whether or not output capture is on."""
    for line in config.stash.get(SUMMARIES, []):
        terminalreporter.write_line(line)
