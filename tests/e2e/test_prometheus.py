"""A real Prometheus server scrapes the operator's /metrics and answers queries about it.

`promtool check metrics` (tests/unit/test_metrics.py) checks the exposition format; this proves the
whole path a platform team relies on: scrape, store, PromQL, with the job counts the operator exports
following a TrainingJob from Pending to Running.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hack.common import free_port
from tests.cluster import Kubectl, wait_for
from tests.e2e.operator import OperatorProcess

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus package is not installed")


class Prometheus:
    def __init__(self, port: int, process: subprocess.Popen[bytes], log: Path) -> None:
        self.port = port
        self.process = process
        self.log = log

    def api(self, path: str, **params: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        data = body["data"]
        assert isinstance(data, dict)
        return data

    def query(self, expression: str) -> list[dict[str, Any]]:
        result = self.api("query", query=expression)["result"]
        assert isinstance(result, list)
        return result

    def ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False


@pytest.fixture
def prometheus(operator: OperatorProcess, tmp_path: Path) -> Iterator[Prometheus]:
    assert PROMETHEUS is not None
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: trainingjob-operator\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{operator.port}']\n"
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(port, process, log)
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


def simple_job(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "ml.example.com/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "scraped", "namespace": namespace},
        "spec": {"model": "resnet50", "dataset": "imagenet", "numWorkers": 2, "gpusPerWorker": 1},
    }


def test_prometheus_scrapes_the_operator(
    cluster: Kubectl, namespace: str, operator: OperatorProcess, prometheus: Prometheus
) -> None:
    def target_up() -> bool:
        targets = prometheus.api("targets")["activeTargets"]
        return any(target["health"] == "up" for target in targets)

    wait_for("the operator's target is up", target_up, timeout=60)

    cluster.apply(simple_job(namespace))
    query = f'trainingjob_jobs{{namespace="{namespace}",state="Running"}}'
    result = wait_for(
        f"{query} == 1 in Prometheus",
        lambda: [sample for sample in prometheus.query(query) if float(sample["value"][1]) == 1.0],
        timeout=90,
    )
    assert result[0]["metric"]["job"] == "trainingjob-operator"

    workers = prometheus.query('controller_runtime_max_concurrent_reconciles{controller="trainingjob"}')
    assert [float(sample["value"][1]) for sample in workers] == [4.0]
    leader = prometheus.query("leader_election_master_status")
    assert [float(sample["value"][1]) for sample in leader] == [1.0]
    created = wait_for(
        "pod creations counted",
        lambda: prometheus.query('sum(rest_client_requests_total{method="POST"})'),
        timeout=30,
    )
    assert float(created[0]["value"][1]) >= 2
