"""What the bench puts into its cluster: the jobs, and what it reads back (requests, Events).

Why apart: the jobs are what is measured, so their shape (numWorkers, GPUs) and the way they are
created (from several threads, all answered before the clock stops) are one place to read. The bench
cluster itself is the harness's (testbed/harness/base.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from controller.resources import EVENTS, TRAININGJOBS
from controller.runtime.client import KubeClient
from controller.runtime.errors import AlreadyExists
from controller.runtime.resource import Resource
from crd import contract
from testbed.common import JsonDict
from testbed.harness.bench.options import Options

NAMESPACE: Final = "bench"


def job_manifest(name: str, replicas: int, gpus: int) -> JsonDict:
    return {
        "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench": "true"}},
        "spec": {
            "model": "bench",
            "dataset": "synthetic",
            "numWorkers": replicas,
            "gpusPerWorker": gpus,
        },
    }


@dataclass(frozen=True)
class JobKind:
    """What the bench creates: the resource, the namespace, and one job's manifest by name."""

    resource: Resource
    namespace: str
    manifest: Callable[[str], JsonDict]


def training_jobs(options: Options, namespace: str = NAMESPACE) -> JobKind:
    def manifest(name: str) -> JsonDict:
        job = job_manifest(name, options.replicas, options.gpus_per_worker)
        job["metadata"]["namespace"] = namespace
        return job

    return JobKind(TRAININGJOBS, namespace, manifest)


def apiserver_requests(client: KubeClient) -> dict[str, float]:
    """The API server's own request counters (apiserver_request_total), by verb and resource: what the
    whole cluster (operator, scheduler, kwok, controller manager, the bench) asked of it."""
    pool = client.api_client.rest_client.pool_manager
    host = str(client.api_client.configuration.host).rstrip("/")
    try:
        # The admin kubeconfig authenticates with a client certificate, which the pool already carries.
        response = pool.request("GET", host + "/metrics", headers={"Accept": "text/plain"}, timeout=30.0)
    except Exception:  # diagnostics only: a failed scrape leaves the breakdown out
        return {}
    if response.status != 200:
        return {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(response.data.decode()):
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            resource = labels.get("resource", "") + (
                f"/{labels['subresource']}" if labels.get("subresource") else ""
            )
            key = f"{labels.get('verb', '')} {resource}"
            counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def counter_delta(after: dict[str, float], before: dict[str, float], top: int = 15) -> dict[str, int]:
    delta = {key: round(value - before.get(key, 0.0)) for key, value in after.items()}
    ranked = sorted(((v, k) for k, v in delta.items() if v > 0), reverse=True)
    return {key: value for value, key in ranked[:top]}


def create_jobs(
    client: KubeClient,
    names: list[str],
    options: Options,
    kind: JobKind | None = None,
    on_created: Callable[[str, float], None] | None = None,
) -> float:
    """Creates the jobs from `options.create_threads` threads; returns when the last create answered.
    `on_created` hears of each job and when its create was answered."""
    kind = kind or training_jobs(options)

    def create(name: str) -> None:
        with contextlib.suppress(AlreadyExists):
            client.create(kind.resource, kind.namespace, kind.manifest(name))
        if on_created is not None:
            on_created(name, time.monotonic())

    with ThreadPoolExecutor(max_workers=options.create_threads, thread_name_prefix="bench-create") as pool:
        list(pool.map(create, names))
    return time.monotonic()


def count_events(client: KubeClient, namespace: str = NAMESPACE) -> dict[str, int]:
    """The Events the operator wrote in the bench namespace: objects, and occurrences (counts)."""
    items: list[JsonDict] = []
    token: str | None = None
    while True:
        page = client.list(
            EVENTS,
            namespace,
            field_selector=f"source={contract.OPERATOR_NAME}",
            limit=500,
            continue_=token,
        )
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            break
    by_reason: dict[str, int] = {}
    for event in items:
        reason = str(event.get("reason"))
        by_reason[reason] = by_reason.get(reason, 0) + int(event.get("count") or 1)
    return {
        "objects": len(items),
        "occurrences": sum(by_reason.values()),
        **dict(sorted(by_reason.items())),
    }
