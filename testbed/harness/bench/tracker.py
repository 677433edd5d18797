"""When each pod was created, bound and Running, and each job Running, from the bench's own watches.

Why: list + watch (the project's informer) sees every transition as it happens without polling the
API server the bench is loading; slim transforms keep only the fields the bench reads, so its own
caches stay small with thousands of pods.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from controller.resources import LEASES, PODS, TRAININGJOBS
from controller.runtime.client import KubeClient
from controller.runtime.clock import RealClock
from controller.runtime.informer import Informer
from controller.runtime.resource import Resource
from controller.runtime.store import Store
from testbed.common import JsonDict, ToolError
from testbed.harness.bench.cluster import NAMESPACE
from testbed.harness.bench.operator import LEASE_NAMESPACE


def _slim_pod(pod: JsonDict) -> JsonDict:
    metadata = pod["metadata"]
    return {
        "metadata": {k: metadata.get(k) for k in ("name", "namespace", "uid", "resourceVersion")},
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def training_job_running(job: JsonDict) -> bool:
    return (job.get("status") or {}).get("state") == "Running"


def _slim_lease(lease: JsonDict) -> JsonDict:
    metadata = lease["metadata"]
    spec = lease.get("spec") or {}
    return {
        "metadata": {k: metadata.get(k) for k in ("name", "namespace", "uid", "resourceVersion")},
        "spec": {"renewTime": spec.get("renewTime"), "holderIdentity": spec.get("holderIdentity")},
    }


class Tracker:
    """When each pod was first seen, bound and Running, and each job Running, from the bench's own
    watches (list + watch, so the bench adds no polling load to the API server)."""

    def __init__(
        self,
        client: KubeClient,
        lease_name: str,
        *,
        namespace: str = NAMESPACE,
        resource: Resource = TRAININGJOBS,
        job_running: Callable[[JsonDict], bool] = training_job_running,
    ) -> None:
        self._lock = threading.Lock()
        self.pod_created: dict[str, float] = {}
        self.pod_bound: dict[str, float] = {}
        self.pod_running: dict[str, float] = {}
        self.job_running: dict[str, float] = {}
        self.job_created: dict[str, float] = {}
        self.lease_renewals = 0
        self._lease_name = lease_name
        self._job_running = job_running
        self._stop = threading.Event()
        clock = RealClock()
        self.informers = [
            Informer(client, PODS, Store(), namespace=namespace, clock=clock, transform=_slim_pod),
            Informer(client, resource, Store(), namespace=namespace, clock=clock, transform=self._slim_job),
            Informer(client, LEASES, Store(), namespace=LEASE_NAMESPACE, clock=clock, transform=_slim_lease),
        ]
        pods, jobs, leases = self.informers
        pods.add_handler(on_add=self._pod, on_update=lambda _old, new: self._pod(new))
        jobs.add_handler(on_add=self._job, on_update=lambda _old, new: self._job(new))
        leases.add_handler(on_update=self._lease)
        self._threads = [
            threading.Thread(target=inf.run, args=(self._stop,), name=f"bench-{inf.name}", daemon=True)
            for inf in self.informers
        ]

    def start(self, timeout: float = 60.0) -> None:
        for thread in self._threads:
            thread.start()
        for informer in self.informers:
            if not informer.wait_for_sync(timeout):
                raise ToolError(f"the bench's watch of {informer.name} did not sync in {timeout:.0f}s")

    def stop(self) -> None:
        self._stop.set()
        for informer in self.informers:
            informer.stop()

    def _pod(self, pod: JsonDict) -> None:
        now = time.monotonic()
        name = pod["metadata"]["name"]
        with self._lock:
            self.pod_created.setdefault(name, now)
            if pod["spec"].get("nodeName"):
                self.pod_bound.setdefault(name, now)
            if pod["status"].get("phase") == "Running":
                self.pod_running.setdefault(name, now)

    def _slim_job(self, job: JsonDict) -> JsonDict:
        metadata = job["metadata"]
        return {
            "metadata": {k: metadata.get(k) for k in ("name", "namespace", "uid", "resourceVersion")},
            "running": self._job_running(job),
        }

    def _job(self, job: JsonDict) -> None:
        if job["running"]:
            with self._lock:
                self.job_running.setdefault(job["metadata"]["name"], time.monotonic())

    def _lease(self, old: JsonDict, new: JsonDict) -> None:
        if new["metadata"]["name"] == self._lease_name and old["spec"] != new["spec"]:
            with self._lock:
                self.lease_renewals += 1

    def created(self, job: str, at: float) -> None:
        """The bench's create of `job` was answered at `at` (time.monotonic())."""
        with self._lock:
            self.job_created[job] = at

    def counts(self) -> tuple[int, int, int, int]:
        with self._lock:
            return len(self.pod_created), len(self.pod_bound), len(self.pod_running), len(self.job_running)

    def renewals(self) -> int:
        with self._lock:
            return self.lease_renewals

    def reached(self, times: dict[str, float], count: int) -> float | None:
        """When the `count`-th item arrived, or None if fewer did."""
        with self._lock:
            values = sorted(times.values())
        return values[count - 1] if len(values) >= count else None

    def running_lags(self) -> list[float]:
        """For each Running job, the seconds from its last pod Running to the job's status saying so:
        how long news of running pods waited in the operator's queue."""
        with self._lock:
            last_pod = _last_per_job(self.pod_running)
            return sorted(
                max(0.0, at - last_pod[job]) for job, at in self.job_running.items() if job in last_pod
            )

    def creation_lags(self, pods_per_job: int) -> list[float]:
        """For each job whose `pods_per_job` pods have all been seen, the seconds from the bench's create
        of the job being answered to its last pod first seen: how long a new job waited for its pods."""
        with self._lock:
            counts: dict[str, int] = {}
            for pod in self.pod_created:
                job = _job_of(pod)
                counts[job] = counts.get(job, 0) + 1
            last_pod = _last_per_job(self.pod_created)
            return sorted(
                max(0.0, last_pod[job] - at)
                for job, at in self.job_created.items()
                if counts.get(job, 0) >= pods_per_job
            )


def _job_of(pod: str) -> str:
    """Pods are `<job>-<role>-<index>` (both operators name them so)."""
    return pod.rsplit("-", 2)[0]


def _last_per_job(times: dict[str, float]) -> dict[str, float]:
    """Per job, the latest of its pods' times."""
    last: dict[str, float] = {}
    for pod, at in times.items():
        job = _job_of(pod)
        last[job] = max(at, last.get(job, at))
    return last


def percentile(values: list[float], share: float) -> float:
    """The value below which `share` of sorted `values` lie (nearest rank)."""
    return values[min(len(values) - 1, int(len(values) * share))]


def spread(values: list[float]) -> JsonDict:
    """Median, 90th and 99th percentiles and maximum of sorted `values`, rounded (empty: Nones)."""
    if not values:
        return {"median": None, "p90": None, "p99": None, "max": None}
    return {
        "median": round(percentile(values, 0.5), 2),
        "p90": round(percentile(values, 0.9), 2),
        "p99": round(percentile(values, 0.99), 2),
        "max": round(values[-1], 2),
    }
