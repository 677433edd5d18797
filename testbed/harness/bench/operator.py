"""The operator under test as a process, and the few series of its /metrics the bench reads.

Why: the bench measures the operator from the outside, as production would see it: its own process
(CPU seconds and RSS from /proc), its API requests by verb and code (`rest_client_requests_total`),
its work queue and its Events backlog from /metrics.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from testbed.common import REPO, Say, ToolError, free_port, http_get, start_logged, tail
from testbed.harness.bench.procfs import ProcSample, proc_sample

LEASE_NAMESPACE: Final = "default"

say: Final = Say("bench")


def operator_tree() -> Path:
    """The checkout whose operator runs: this one, or $BENCH_OPERATOR_TREE (another worktree, to
    measure a change before and after with the same bench)."""
    return Path(os.environ.get("BENCH_OPERATOR_TREE") or REPO).resolve()


class Operator:
    """The operator under test, as a process with its own session; its log goes to a file.

    This operator by default; testbed/harness/bench/kubeflow.py's peer overrides how it is started and
    probed."""

    name = "trainingjob-operator"

    samples_python_stacks = True  # py-spy can profile it (`--profile`)

    def __init__(
        self, kubeconfig: Path, log_path: Path, extra: tuple[str, ...], tree: Path | None = None
    ) -> None:
        # The checkout whose operator runs (testbed/harness/bench/peer.py's baseline: another one).
        self.tree = tree or operator_tree()
        self.port = free_port()  # /metrics
        self.health_port = free_port()  # /readyz
        self.command = self.build_command(kubeconfig, extra)
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def build_command(self, kubeconfig: Path, extra: tuple[str, ...]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "controller",
            f"--kubeconfig={kubeconfig}",
            *self.serving_flags(),
            f"--lease-namespace={LEASE_NAMESPACE}",
            *extra,
        ]

    def serving_flags(self) -> list[str]:
        """/metrics in plain HTTP (the bench reads it; a secure endpoint would add its reviews to the
        requests measured) and the probes, each on a port of 127.0.0.1. A baseline checkout from
        before the probes had a port of their own serves both on --metrics-addr."""
        if "--metrics-bind-address" not in (self.tree / "controller" / "cli.py").read_text(encoding="utf-8"):
            self.health_port = self.port
            return [f"--metrics-addr=127.0.0.1:{self.port}"]
        return [
            f"--metrics-bind-address=127.0.0.1:{self.port}",
            "--metrics-secure=false",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
        ]

    def prepare(self) -> None:
        """What must exist before the process starts (nothing for this operator)."""

    def environment(self) -> dict[str, str]:
        # The operator's default log level, whatever the caller's $LOG_LEVEL says ($BENCH_LOG_LEVEL wins).
        level = os.environ.get("BENCH_LOG_LEVEL", "INFO")
        return dict(os.environ, PYTHONPATH=str(self.tree), LOG_LEVEL=level)

    def arguments(self) -> list[str]:
        """The flags it runs with, for the report."""
        return self.command[4:]

    def start(self) -> None:
        self.prepare()
        header = " ".join(self.command[1:])
        self.process = start_logged(
            self.command, self.log_path, header=header, cwd=self.tree, env=self.environment()
        )

    def ready(self) -> bool:
        """Serving, and leading (it reconciles only as the leader)."""
        return (
            self.get_port(self.health_port, "/readyz")[0] == 200
            and self.metrics("leader_election_master_status").leader
        )

    @property
    def pid(self) -> int:
        if self.process is None:
            raise ToolError("the operator was not started")
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.process.returncode if self.process is not None else None
            raise ToolError(f"the operator exited ({code}); last lines of {self.log_path}:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        return tail(self.log_path, lines)

    def get(self, path: str) -> tuple[int, str]:
        return self.get_port(self.port, path)

    @staticmethod
    def get_port(port: int, path: str) -> tuple[int, str]:
        return http_get(f"http://127.0.0.1:{port}{path}", timeout=10)

    def metrics(self, *names: str) -> Metrics:
        query = "?" + "&".join(f"name[]={name}" for name in names) if names else ""
        status, body = self.get("/metrics" + query)
        if status != 200:
            raise ToolError(f"/metrics answered {status}: {body[:200]}")
        return Metrics.parse(body)

    def sample(self) -> ProcSample:
        return proc_sample(self.pid)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            say(f"the operator (pid {self.process.pid}) ignored SIGTERM for 40s; killing it")
            self.process.kill()
            self.process.wait(timeout=10)


@dataclass
class Metrics:
    """The few series of the operator's /metrics the bench reads."""

    requests: dict[str, float] = field(default_factory=dict)  # by method, every code
    requests_by_code: dict[str, float] = field(default_factory=dict)
    cpu_seconds: float | None = None
    leader: bool = False
    queue_depth: float = 0.0
    reconciles: float = 0.0
    events_dropped: float = 0.0
    events_pending: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Metrics:
        metrics = cls()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if sample.name == "rest_client_requests_total":
                    method = labels.get("method", "")
                    metrics.requests[method] = metrics.requests.get(method, 0.0) + sample.value
                    code = labels.get("code", "")
                    metrics.requests_by_code[code] = metrics.requests_by_code.get(code, 0.0) + sample.value
                elif sample.name == "process_cpu_seconds_total":
                    metrics.cpu_seconds = sample.value
                elif sample.name == "leader_election_master_status" and sample.value == 1.0:
                    metrics.leader = True
                elif sample.name == "workqueue_depth":
                    metrics.queue_depth += sample.value
                elif sample.name == "controller_runtime_reconcile_total":
                    metrics.reconciles += sample.value
                elif sample.name == "trainingjob_events_dropped_total":
                    metrics.events_dropped += sample.value
                elif sample.name == "trainingjob_events_pending":
                    metrics.events_pending += sample.value
        return metrics

    def minus(self, earlier: Metrics) -> dict[str, int]:
        methods = sorted(set(self.requests) | set(earlier.requests))
        return {m: round(self.requests.get(m, 0.0) - earlier.requests.get(m, 0.0)) for m in methods}

    def codes_minus(self, earlier: Metrics) -> dict[str, int]:
        codes = sorted(set(self.requests_by_code) | set(earlier.requests_by_code))
        return {
            c: round(self.requests_by_code.get(c, 0.0) - earlier.requests_by_code.get(c, 0.0)) for c in codes
        }
