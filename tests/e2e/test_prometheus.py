"""A real Prometheus server scrapes the operator's /metrics and answers queries about it.

`promtool check metrics` (tests/unit/test_metrics.py) checks the exposition format; this proves the
whole path a platform team relies on: scrape, store, PromQL, with the job counts the operator exports
following a TrainingJob from Pending to Running. The operator serves /metrics as deployed (HTTPS, the
requester's token reviewed by the API server) and Prometheus scrapes it as the shipped ServiceMonitor
makes it: HTTPS, with a ServiceAccount token bound to the trainingjob-operator-metrics-reader
ClusterRole, the self-signed certificate not verified.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import Kubectl, free_port, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.metrics_access import metrics_reader, token_file
from tests.e2e.operator import OperatorProcess
from tests.e2e.prometheus import PROMETHEUS, Prometheus, running_prometheus, scrape_config

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus package is not installed")


@pytest.fixture
def scraper_token(cluster: Kubectl, namespace: str) -> Iterator[str]:
    """A token of a ServiceAccount that may get /metrics (the shipped metrics-reader ClusterRole)."""
    with metrics_reader(cluster, namespace, "prometheus") as token:
        yield token


@pytest.fixture
def secure_operator(start_operator: StartOperator, scraper_token: str) -> OperatorProcess:
    return start_operator(secure=True, metrics_token=scraper_token)


@pytest.fixture
def prometheus(secure_operator: OperatorProcess, scraper_token: str, tmp_path: Path) -> Iterator[Prometheus]:
    credentials = token_file(scraper_token, tmp_path)
    config = scrape_config(
        "trainingjob-operator", [f"127.0.0.1:{secure_operator.port}"], token_file=credentials
    )
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
    cluster: Kubectl, namespace: str, secure_operator: OperatorProcess, prometheus: Prometheus
) -> None:
    def target_up() -> bool:
        return any(target["health"] == "up" for target in prometheus.targets())

    wait_for("the operator's target is up", target_up, timeout=60)
    (target,) = prometheus.targets()
    assert target["scrapeUrl"] == f"https://127.0.0.1:{secure_operator.port}/metrics"

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
