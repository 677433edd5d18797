"""A real Prometheus server for end-to-end tests: started with a scrape configuration, queried over
its HTTP API, stopped by its pid.

Why apart: two tests scrape the operator with Debian's `prometheus`, one the operator process on the
machine (tests/e2e/test_prometheus.py), one the operator deployed on the real node through its
Service (tests/e2e/test_deploy_real_node.py), where Prometheus runs inside the node's network
namespace (`launcher` is the nsenter command line) and listens on the node's address.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from testbed import http_get, http_ok, wait_for

PROMETHEUS = shutil.which("prometheus")


class Prometheus:
    """A running server at host:port; its output goes to `log`."""

    def __init__(self, host: str, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
        self.host = host
        self.port = port
        self.process = process
        self.log = log

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}/{path}"

    def api(self, path: str, **params: str) -> dict[str, Any]:
        status, text = http_get(self.url(f"api/v1/{path}?{urllib.parse.urlencode(params)}"), timeout=5)
        assert status == 200, (status, text)
        body = json.loads(text)
        assert body["status"] == "success", body
        data = body["data"]
        assert isinstance(data, dict)
        return data

    def query(self, expression: str) -> list[dict[str, Any]]:
        result = self.api("query", query=expression)["result"]
        assert isinstance(result, list)
        return result

    def values(self, expression: str) -> list[float]:
        """The instant vector's sample values, in Prometheus's order."""
        return [float(sample["value"][1]) for sample in self.query(expression)]

    def targets(self) -> list[dict[str, Any]]:
        found = self.api("targets")["activeTargets"]
        assert isinstance(found, list)
        return found

    def ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-2000:]
        return http_ok(self.url("-/ready"), expect="")


def scrape_config(job: str, targets: Sequence[str], *, token_file: Path | None = None) -> str:
    """A configuration scraping `targets` every second as the job `job`: plain HTTP, or with a
    `token_file` HTTPS with that bearer token and the TLS settings of the deployed ServiceMonitor (the
    operator's self-signed certificate is not verified)."""
    listed = ", ".join(f"'{target}'" for target in targets)
    secure = ""
    if token_file is not None:
        secure = (
            "    scheme: https\n"
            f"    authorization:\n      credentials_file: {token_file}\n"
            "    tls_config:\n      insecure_skip_verify: true\n"
        )
    return (
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        f"scrape_configs:\n  - job_name: {job}\n{secure}"
        f"    static_configs:\n      - targets: [{listed}]\n"
    )


@contextmanager
def running_prometheus(
    config: str, workdir: Path, *, host: str, port: int, launcher: Sequence[str] = ()
) -> Iterator[Prometheus]:
    """Prometheus with `config`, its storage and log in `workdir`, listening on host:port; ready
    when yielded, stopped (SIGTERM, then SIGKILL) by its pid after. `launcher` precedes the command
    and must exec it (nsenter does), so that the pid is Prometheus's."""
    assert PROMETHEUS is not None, "Debian's prometheus package is not installed"
    config_file = workdir / "prometheus.yml"
    config_file.write_text(config)
    log = workdir / "prometheus.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                *launcher,
                PROMETHEUS,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={host}:{port}",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(host, port, process, log)
    try:
        wait_for("prometheus ready", server.ready, timeout=60)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
