"""A real Prometheus server scrapes the operator's /metrics and answers queries about it.

`promtool check metrics` (tests/unit/test_metrics.py) checks the exposition format; this proves the
whole path a platform team relies on: scrape, store, PromQL, with the job counts the operator exports
following a TrainingJob from Pending to Running.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hack.common import free_port
from tests.cluster import Kubectl, wait_for
from tests.e2e.operator import OperatorProcess
from tests.e2e.prometheus import PROMETHEUS, Prometheus, running_prometheus, scrape_config

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus package is not installed")


@pytest.fixture
def prometheus(operator: OperatorProcess, tmp_path: Path) -> Iterator[Prometheus]:
    config = scrape_config("trainingjob-operator", [f"127.0.0.1:{operator.port}"])
    with running_prometheus(config, tmp_path, host="127.0.0.1", port=free_port()) as server:
        yield server


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
        return any(target["health"] == "up" for target in prometheus.targets())

    wait_for("the operator's target is up", target_up, timeout=60)

    cluster.apply(simple_job(namespace))
    query = f'trainingjob_jobs{{namespace="{namespace}",state="Running"}}'
    result = wait_for(
        f"{query} == 1 in Prometheus",
        lambda: [sample for sample in prometheus.query(query) if float(sample["value"][1]) == 1.0],
        timeout=90,
    )
    assert result[0]["metric"]["job"] == "trainingjob-operator"

    workers = prometheus.values('controller_runtime_max_concurrent_reconciles{controller="trainingjob"}')
    assert workers == [4.0]
    assert prometheus.values("leader_election_master_status") == [1.0]
    created = wait_for(
        "pod creations counted",
        lambda: prometheus.query('sum(rest_client_requests_total{method="POST"})'),
        timeout=30,
    )
    assert float(created[0]["value"][1]) >= 2
