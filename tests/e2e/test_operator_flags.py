"""The real operator process with Kubernetes-style flags: from the environment, Go durations, and
start-up problems told in one line with exit code 2 (a metrics or probe port in use, a metrics
certificate that does not load, a bad kubeconfig). The trainers' admission policy missing is no
start-up problem: tests/e2e/test_guards_e2e.py.

Why end to end: the unit tests parse flags, but a port in use is only found when the process binds
it, and an unusable kubeconfig only when the client library reads it; both used to end the process
with a traceback.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import wait_for
from tests.e2e.conftest import OPERATOR_NAMESPACE
from tests.e2e.operator import OperatorProcess

EXIT_TIMEOUT = 90


def exited_with_one_line(operator: OperatorProcess) -> str:
    """Waits for the process to end with exit code 2 and returns its only line of output."""
    assert operator.wait_exit(timeout=EXIT_TIMEOUT) == 2, operator.tail()
    output = operator.log_path.read_text()
    assert "Traceback" not in output, output
    lines = output.splitlines()
    assert len(lines) == 1, output
    return lines[0]


def refused_start(
    kubeconfig: Path,
    namespace: str,
    tmp_path: Path,
    *args: str,
    secure: bool = False,
    ports: dict[str, Any] | None = None,
) -> str:
    """Starts the operator (log level INFO) for `namespace`, expecting it to refuse: its one line.
    `ports` are OperatorProcess's (`port` for /metrics, `health_port`), free ones by default."""
    operator = OperatorProcess(
        kubeconfig,
        tmp_path / "operator.log",
        (f"--namespace={namespace}", f"--lease-namespace={OPERATOR_NAMESPACE}", *args),
        env={"LOG_LEVEL": "INFO"},
        secure=secure,
        **(ports or {}),
    ).start()
    try:
        return exited_with_one_line(operator)
    finally:
        operator.stop()


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another process (this test) listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize(
    "server", [("--metrics-bind-address", "port"), ("--health-probe-bind-address", "health_port")]
)
def test_a_port_in_use_is_one_line_and_exit_code_2(
    service_account_kubeconfig: Path, namespace: str, busy_port: int, tmp_path: Path, server: tuple[str, str]
) -> None:
    flag, field = server
    ports: dict[str, Any] = {field: busy_port}
    line = refused_start(service_account_kubeconfig, namespace, tmp_path, ports=ports)
    in_use = f"{flag}=127.0.0.1:{busy_port}: Address already in use"
    assert line == f"trainingjob-operator: cannot listen on {in_use}"


def test_a_metrics_certificate_that_does_not_load_is_one_line_and_exit_code_2(
    service_account_kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "tls.crt").write_text("not a certificate\n")
    (certs / "tls.key").write_text("not a key\n")
    flag = f"--metrics-cert-path={certs}"
    line = refused_start(service_account_kubeconfig, namespace, tmp_path, flag, secure=True)
    assert line.startswith(
        f"trainingjob-operator: cannot serve /metrics over HTTPS: {certs}/tls.crt and {certs}/tls.key are "
        "not a usable certificate and key: "
    ), line


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda path: None, "cannot read kubeconfig {path}: No such file or directory"),
        (lambda path: path.mkdir(), "cannot read kubeconfig {path}: Is a directory"),
        (lambda path: path.write_text("clusters: [oops\n"), "cannot use kubeconfig {path}: while parsing"),
        (
            lambda path: path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: gone\n"),
            "cannot use kubeconfig {path}: ",
        ),
    ],
    ids=["missing", "directory", "not-yaml", "no-such-context"],
)
def test_an_unusable_kubeconfig_is_one_line_and_exit_code_2(
    make: object, expected: str, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    make(kubeconfig)  # type: ignore[operator]
    operator = OperatorProcess(kubeconfig, tmp_path / "operator.log", ("--namespace=nowhere",)).start()
    try:
        line = exited_with_one_line(operator)
    finally:
        operator.stop()
    assert line.startswith("trainingjob-operator: " + expected.format(path=kubeconfig)), line


def test_flags_from_the_environment_with_go_durations(
    service_account_kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    """Leader election off and three workers, from the environment; durations in Go syntax."""
    operator = OperatorProcess(
        service_account_kubeconfig,
        tmp_path / "operator.log",
        (f"--namespace={namespace}", "--node-lost-after=1m30s", "--progress-interval=500ms"),
        env={
            "TRAININGJOB_OPERATOR_LEADER_ELECT": "false",
            "TRAININGJOB_OPERATOR_WORKERS": "3",
            "TRAININGJOB_OPERATOR_FORCE_DELETE_AFTER": "2m",
        },
    ).start()
    try:
        operator.wait_ready()
        # Ready means the caches synced; the workers start a moment later (the metric comes first).
        wait_for("the operator leads without a lease", operator.is_leader, timeout=30)
        messages = [str(entry.get("message")) for entry in operator.logs()]
    finally:
        operator.stop()
    assert "became the leader; starting 3 workers" in messages
    assert not [message for message in messages if message.startswith("acquired lease")]
