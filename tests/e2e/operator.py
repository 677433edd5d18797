"""Runs the real operator (`python -m controller`) as a process for end-to-end tests.

Tests start it, read its JSON log lines, its probes and its /metrics, send it SIGTERM or SIGKILL, and
run two at once for leader election. Every process started here is stopped when its test ends.

Its /metrics and its probes listen on free ports of 127.0.0.1 of their own; `get` sends /healthz,
/livez and /readyz to the probes' port and anything else to the metrics port. An operator started here
serves /metrics in plain HTTP (--metrics-secure=false) unless `secure` is set: most tests read its
metrics to see what it did, and in the secure mode each first read of a token would add a TokenReview
and a SubjectAccessReview to the API requests those tests count (`rest_client_requests_total`); the
secure mode, HTTPS with the API server's authentication and authorization as deployed, has tests of its
own (tests/e2e/test_metrics_auth_e2e.py, the real Prometheus scrape of tests/e2e/test_prometheus.py).
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed import free_port, wait_for
from tests.cluster import REPO


@dataclass
class OperatorProcess:
    """One operator process; its stdout and stderr go to `log_path` (JSON lines)."""

    kubeconfig: Path
    log_path: Path
    args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)  # /metrics
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    health_port: int = field(default_factory=free_port)  # /healthz, /livez, /readyz
    # HTTPS with authentication and authorization (the deployed mode), read with `metrics_token`.
    secure: bool = False
    metrics_token: str | None = None
    # What verifies the operator's certificate in the secure mode (default: nothing, as the deployed
    # ServiceMonitor does with the self-signed certificate).
    tls_context: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        # Two ports chosen one after the other (each free when chosen) may be the same one.
        while self.health_port == self.port:
            self.health_port = free_port()

    def start(self) -> OperatorProcess:
        # The harness's addresses come last, so that they win over any in `args` (a Deployment's).
        command = [
            sys.executable,
            "-m",
            "controller",
            f"--kubeconfig={self.kubeconfig}",
            *self.args,
            f"--metrics-bind-address=127.0.0.1:{self.port}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            f"--metrics-secure={'true' if self.secure else 'false'}",
        ]
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "LOG_LEVEL": os.environ.get("TJ_TEST_LOG_LEVEL", "DEBUG"),
            **self.env,
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def url(self, path: str) -> str:
        """Where `path` is served: the probes' port for the probes, the metrics port for the rest."""
        if path.partition("?")[0].rstrip("/") in PROBES:
            return f"http://127.0.0.1:{self.health_port}{path}"
        return f"{'https' if self.secure else 'http'}://127.0.0.1:{self.port}{path}"

    def get(self, path: str, token: str | None = None) -> tuple[int, str]:
        """Status and body of a GET (0 and the error when there is no answer); `token` (default
        `metrics_token`) is sent as the bearer token."""
        token = token or self.metrics_token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(self.url(path), headers=headers)  # noqa: S310 - http(s) to 127.0.0.1
        context = None
        if request.type == "https":
            context = self.tls_context or ssl._create_unverified_context()  # noqa: S323 - like the ServiceMonitor
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as response:  # noqa: S310
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except (urllib.error.URLError, OSError) as error:
            return 0, str(error)

    def wait_ready(self, timeout: float = 60) -> None:
        def ready() -> bool:
            assert self.alive(), (
                f"operator exited ({self.process and self.process.returncode}):\n{self.tail()}"
            )
            return self.get("/readyz")[0] == 200

        wait_for("operator /readyz", ready, timeout=timeout)

    def metrics(self) -> str:
        status, body = self.get("/metrics")
        assert status == 200, body
        return body

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of one sample of the Prometheus text exposition, or None when absent."""
        for line in self.metrics().splitlines():
            if line.startswith("#") or not line.startswith(name):
                continue
            series, _, value = line.rpartition(" ")
            metric_name, _, label_text = series.partition("{")
            if metric_name != name:
                continue
            present = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part)
            if all(present.get(key, "").strip('"') == wanted for key, wanted in labels.items()):
                return float(value)
        return None

    def is_leader(self) -> bool:
        return self.metric("leader_election_master_status") == 1.0

    def logs(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                entries.append(entry)
        return entries

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def wait_exit(self, timeout: float = 60) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        if not self.alive():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


PROBES = ("/healthz", "/livez", "/readyz")


@contextmanager
def running_operator(
    kubeconfig: Path, log_dir: Path, *args: str, name: str = "operator", ready: bool = True
) -> Iterator[OperatorProcess]:
    """Starts an operator and guarantees it is stopped (SIGTERM, then SIGKILL) when the block ends."""
    operator = OperatorProcess(kubeconfig, log_dir / f"{name}.log", tuple(args)).start()
    try:
        if ready:
            operator.wait_ready()
        yield operator
    finally:
        operator.stop()
