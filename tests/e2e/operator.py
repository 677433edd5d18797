"""Runs the real operator (`python -m controller`) as a process for end-to-end tests.

Tests start it, read its JSON log lines and its /metrics, send it SIGTERM or SIGKILL, and run two at
once for leader election. Every process started here is stopped when its test ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hack.common import free_port
from tests.cluster import REPO, wait_for


@dataclass
class OperatorProcess:
    """One operator process; its stdout and stderr go to `log_path` (JSON lines)."""

    kubeconfig: Path
    log_path: Path
    args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def start(self) -> OperatorProcess:
        command = [
            sys.executable,
            "-m",
            "controller",
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-addr=127.0.0.1:{self.port}",
            *self.args,
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

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
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
