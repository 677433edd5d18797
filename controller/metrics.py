"""The operator's own Prometheus series, `trainingjob_*`, beside the runtime's.

Why this module exists: an operator is only operable if people can see what it does. The runtime
publishes controller-runtime's and client-go's series (controller/runtime/metrics.py); this module
adds what only a TrainingJob operator knows: jobs by state, progress, restarts by cause, time to
running and to completion, time spent in Kueue's queues and evictions, invalid specs, dropped Events.

Cardinality is bounded on purpose: no series is labelled by pod, and series labelled by job exist only
while the job exists, because they are computed at scrape time from the informer cache
(`JobCollector`) instead of being stored in long-lived gauges that would outlive deleted jobs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from controller.runtime.clock import Clock, RealClock, parse_time
from controller.runtime.metrics import RECONCILE_BUCKETS, RuntimeMetrics
from crd import contract
from crd.contract import FINISHED_STATES, Condition, State
from crd.schema_status import STATES

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

# From "pods created" to "every worker running": image pulls and gang scheduling take minutes to hours.
TIME_TO_RUNNING_BUCKETS: Final = (
    1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0, 14400.0,
)  # fmt: skip
# Training runs last from minutes to weeks.
TIME_TO_COMPLETE_BUCKETS: Final = (
    60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0, 86400.0, 172800.0, 345600.0,
    604800.0, 1209600.0,
)  # fmt: skip

# From being queued (or evicted) to Kueue's admission: seconds on an idle cluster, days on a busy one.
QUEUE_WAIT_BUCKETS: Final = (
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0, 86400.0,
    259200.0, 604800.0,
)  # fmt: skip
# Values of trainingjob_evictions_total{reason}: why Kueue took an admission back (Kueue's eviction
# reasons, and the Workload deleted or no longer admitted), plus "other".
EVICTION_REASONS: Final = (
    "Preempted",
    "Deactivated",
    "PodsReadyTimeout",
    "AdmissionCheck",
    "ClusterQueueStopped",
    "LocalQueueStopped",
    "NodeFailures",
    "WorkloadDeleted",
    "WorkloadFinished",
    "AdmissionLost",
)
# Values of trainingjob_restarts_total{reason}: the causes counted in status.restarts, plus "other".
RESTART_REASONS: Final = ("failure", "disruption", "scheduling", "stall")
OTHER: Final = "other"
# A job without status.state has not been seen by the operator yet.
INITIAL_STATE: Final = "Pending"


def eviction_reason(reason: str) -> str:
    """Maps the reason of an eviction to the fixed label set of trainingjob_evictions_total."""
    return next((known for known in EVICTION_REASONS if known == reason), OTHER)


def restart_reason(reason: str) -> str:
    """Maps a restart cause to the fixed label set of trainingjob_restarts_total (unknown -> "other").

    Returns the plain string, so a `str` enum member (e.g. `failures.Cause`) becomes its value.
    """
    return next((known for known in RESTART_REASONS if known == reason), OTHER)


class Metrics(RuntimeMetrics):
    """Every metric of the operator, registered in one registry; callers use the attributes directly:

    `metrics.restarts.labels(namespace=ns, reason=restart_reason(cause)).inc()`.
    """

    # trainingjob_*: event-driven, owned by the reconciler
    created: Counter
    completed: Counter
    failed: Counter
    restarts: Counter
    time_to_running: Histogram
    time_to_complete: Histogram
    queue_wait: Histogram
    evictions: Counter
    reconciliations: Counter
    reconciliation_duration: Histogram
    reconciliation_errors: Counter
    invalid_spec: Counter
    events_dropped: Counter
    events_pending: Gauge

    def __init__(self, registry: CollectorRegistry | None = None, *, process_metrics: bool = True) -> None:
        super().__init__(registry, process_metrics=process_metrics)
        r = self.registry

        self.created = Counter(
            "trainingjob_created_total", "TrainingJobs first seen by the operator", ["namespace"], registry=r
        )
        self.completed = Counter(
            "trainingjob_completed_total",
            "TrainingJobs that finished, by result (the terminal state or reason)",
            ["namespace", "result"],
            registry=r,
        )
        self.failed = Counter(
            "trainingjob_failed_total",
            "TrainingJobs that failed, by reason",
            ["namespace", "reason"],
            registry=r,
        )
        self.restarts = Counter(
            "trainingjob_restarts_total",
            "Gang restarts of TrainingJobs, by cause (failure, disruption, scheduling, stall, other)",
            ["namespace", "reason"],
            registry=r,
        )
        self.time_to_running = Histogram(
            "trainingjob_time_to_running_seconds",
            "Seconds from a job's creation until every worker first runs",
            ["namespace"],
            buckets=TIME_TO_RUNNING_BUCKETS,
            registry=r,
        )
        self.time_to_complete = Histogram(
            "trainingjob_time_to_complete_seconds",
            "Seconds from a job's creation until it finished, by result",
            ["namespace", "result"],
            buckets=TIME_TO_COMPLETE_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "trainingjob_queue_wait_seconds",
            "Seconds a job labelled for Kueue waited in its queue until Kueue admitted it, from being "
            "queued or evicted; by the ClusterQueue that admitted it",
            ["namespace", "cluster_queue"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        self.evictions = Counter(
            "trainingjob_evictions_total",
            "Times Kueue took a running job's admission back, by reason ("
            + ", ".join(EVICTION_REASONS)
            + ", other)",
            ["namespace", "reason"],
            registry=r,
        )
        self.reconciliations = Counter(
            "trainingjob_reconciliation_total",
            "Reconciliations of TrainingJobs, by result (success, error, requeue, requeue_after)",
            ["namespace", "result"],
            registry=r,
        )
        self.reconciliation_duration = Histogram(
            "trainingjob_reconciliation_duration_seconds",
            "Seconds per reconciliation of a TrainingJob",
            ["namespace"],
            buckets=RECONCILE_BUCKETS,
            registry=r,
        )
        self.reconciliation_errors = Counter(
            "trainingjob_reconciliation_errors_total",
            "Failed reconciliations of TrainingJobs, by error type",
            ["namespace", "error_type"],
            registry=r,
        )
        self.invalid_spec = Counter(
            "trainingjob_invalid_spec_total",
            "TrainingJobs that failed because the operator cannot run their spec (InvalidSpec)",
            ["namespace"],
            registry=r,
        )
        self.events_dropped = Counter(
            "trainingjob_events_dropped_total",
            "Kubernetes Events not written because the event queue was full",
            registry=r,
        )
        self.events_pending = Gauge(
            "trainingjob_events_pending",
            "Kubernetes Events recorded and not yet written (queued or being written)",
            registry=r,
        )

    def record_transition(
        self, namespace: str, age: float | None, old: Mapping[str, Any], new: Mapping[str, Any]
    ) -> None:
        """Counts what a status write changed: a job first seen, first running, finished, restarted.
        `age` is the job's age in seconds (None when its creation time is unknown)."""
        old_state, new_state = old.get("state"), new.get("state")
        if not old_state:
            self.created.labels(namespace=namespace).inc()
        first_run = new_state == State.RUNNING and old_state != State.RUNNING and not new.get("restartCount")
        if first_run and age is not None:
            self.time_to_running.labels(namespace=namespace).observe(age)
        if new_state in FINISHED_STATES and old_state not in FINISHED_STATES:
            result = "succeeded" if new_state == State.COMPLETED else "failed"
            self.completed.labels(namespace=namespace, result=result).inc()
            if new_state == State.FAILED:
                reason = str(new.get("failureReason") or "Unknown")
                self.failed.labels(namespace=namespace, reason=reason).inc()
                if reason == "InvalidSpec":
                    self.invalid_spec.labels(namespace=namespace).inc()
            if age is not None:
                self.time_to_complete.labels(namespace=namespace, result=result).observe(age)
        before, after = old.get("restarts") or {}, new.get("restarts") or {}
        counted = 0
        for cause in RESTART_REASONS:
            grown = int(after.get(cause, 0)) - int(before.get(cause, 0))
            if grown > 0:
                counted += grown
                self.restarts.labels(namespace=namespace, reason=cause).inc(grown)
        # Restarts without a cause (a numWorkers change) show up only in restartCount.
        uncaused = int(new.get("restartCount") or 0) - int(old.get("restartCount") or 0) - counted
        if uncaused > 0:
            self.restarts.labels(namespace=namespace, reason=OTHER).inc(uncaused)
        self._record_queueing(namespace, old, new)

    def _record_queueing(self, namespace: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """Kueue: the wait that an admission ended, and evictions."""
        queue = _mapping(new.get("queue"))
        waited = _admission_wait(old, new)
        if waited is not None:
            cluster_queue = str(queue.get("clusterQueue") or "")
            self.queue_wait.labels(namespace=namespace, cluster_queue=cluster_queue).observe(waited)
        evicted = int(queue.get("evictions") or 0) - int(_mapping(old.get("queue")).get("evictions") or 0)
        after = _admitted(new)
        if evicted > 0 and after is not None:
            reason = eviction_reason(str(after.get("reason") or ""))
            self.evictions.labels(namespace=namespace, reason=reason).inc(evicted)

    def track_jobs(
        self, list_jobs: Callable[[], Sequence[JsonObject]], clock: Clock | None = None
    ) -> JobCollector:
        """Registers a `JobCollector` reading TrainingJobs from `list_jobs` (the informer cache)."""
        collector = JobCollector(list_jobs, clock)
        self.registry.register(collector)
        return collector


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _percent(value: object) -> float | None:
    if isinstance(value, str):
        try:
            return _number(float(value.strip().rstrip("%").strip()))
        except ValueError:
            return None
    return _number(value)


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _admission_wait(old: Mapping[str, Any], new: Mapping[str, Any]) -> float | None:
    """Seconds from Admitted turning False (queued, evicted) to the admission `new` records, if any."""
    before, after = _admitted(old), _admitted(new)
    if before is None or after is None or (before.get("status"), after.get("status")) != ("False", "True"):
        return None
    since, until = _time(before.get("lastTransitionTime")), _time(after.get("lastTransitionTime"))
    if since is None or until is None:
        return None
    return max(0.0, (until - since).total_seconds())


def _admitted(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Admitted condition (Kueue) of a status."""
    for entry in status.get("conditions") or []:
        if isinstance(entry, Mapping) and entry.get("type") == Condition.ADMITTED:
            return entry
    return None


class JobCollector:
    """The per-job `trainingjob_*` gauges, computed at scrape time from the TrainingJobs in the cache.

    Series exist exactly while their job exists; a value the trainer has not reported (loss, accuracy,
    GPU utilisation) has no series rather than a made-up zero.
    """

    _JOB: Final = ("namespace", "training_job")
    _SCALARS: Final = (
        ("trainingjob_progress_percent", "Training progress in percent (status.progress)"),
        ("trainingjob_current_epoch", "Epoch the trainer last reported (status.currentEpoch)"),
        ("trainingjob_total_epochs", "Epochs planned (status.totalEpochs)"),
        ("trainingjob_loss", "Latest loss reported by rank 0 (status.metrics.loss)"),
        ("trainingjob_accuracy", "Latest accuracy reported by rank 0 (status.metrics.accuracy)"),
        (
            "trainingjob_gpu_utilization_percent",
            "Latest GPU utilisation in percent reported by rank 0 (status.metrics.gpu_utilization): "
            "what the job's code measures and reports, not an exporter's measurement",
        ),
        (
            "trainingjob_allocated_gpus",
            "GPUs requested by the current attempt's pods (status.resources.gpus)",
        ),
        ("trainingjob_allocated_workers", "Worker pods of the current attempt (status.resources.workers)"),
        ("trainingjob_gang_restarts", "Gang restarts of any cause (status.restartCount)"),
    )

    def __init__(self, list_jobs: Callable[[], Sequence[JsonObject]], clock: Clock | None = None) -> None:
        self._list_jobs = list_jobs
        self._clock: Clock = clock or RealClock()

    def _families(self) -> dict[str, GaugeMetricFamily]:
        families = {
            "trainingjob_jobs": GaugeMetricFamily(
                "trainingjob_jobs", "TrainingJobs by namespace and state", labels=["namespace", "state"]
            ),
            "trainingjob_duration_seconds": GaugeMetricFamily(
                "trainingjob_duration_seconds",
                "Seconds from the job's start to its completion, or to now while it has not finished",
                labels=[*self._JOB, "state"],
            ),
            "trainingjob_queued_seconds": GaugeMetricFamily(
                "trainingjob_queued_seconds",
                "Seconds a Queued job has waited for Kueue to admit it (since it was queued or evicted)",
                labels=list(self._JOB),
            ),
        }
        for name, documentation in self._SCALARS:
            families[name] = GaugeMetricFamily(name, documentation, labels=list(self._JOB))
        return families

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        try:
            jobs = list(self._list_jobs())
        except Exception:
            logger.exception("listing TrainingJobs for metrics failed")
            return list(families.values())
        now = self._clock.now()
        by_state: dict[str, dict[str, int]] = {}
        for job in jobs:
            try:
                self._add_job(families, by_state, job, now)
            except Exception:
                logger.exception("skipping a TrainingJob the metrics cannot read")
        jobs_family = families["trainingjob_jobs"]
        for namespace, counts in sorted(by_state.items()):
            for state, count in counts.items():
                jobs_family.add_metric([namespace, state], count)
        return list(families.values())

    def _add_job(
        self,
        families: dict[str, GaugeMetricFamily],
        by_state: dict[str, dict[str, int]],
        job: JsonObject,
        now: datetime,
    ) -> None:
        metadata = _mapping(job.get("metadata"))
        namespace = str(metadata.get("namespace") or "")
        name = str(metadata.get("name") or "")
        if not name:
            return
        status = _mapping(job.get("status"))
        state_value = status.get("state")
        state = state_value if isinstance(state_value, str) and state_value else INITIAL_STATE
        counts = by_state.setdefault(namespace, dict.fromkeys(STATES, 0))
        counts[state] = counts.get(state, 0) + 1

        reported = _mapping(status.get("metrics"))
        resources = _mapping(status.get("resources"))
        values: dict[str, float | None] = {
            "trainingjob_progress_percent": _percent(status.get("progress")),
            "trainingjob_current_epoch": _number(status.get("currentEpoch")),
            "trainingjob_total_epochs": _number(status.get("totalEpochs")),
            "trainingjob_loss": _number(reported.get("loss")),
            "trainingjob_accuracy": _number(reported.get("accuracy")),
            "trainingjob_gpu_utilization_percent": _number(reported.get(contract.GPU_UTILIZATION_METRIC)),
            "trainingjob_allocated_gpus": _number(resources.get("gpus")),
            "trainingjob_allocated_workers": _number(resources.get("workers")),
            "trainingjob_gang_restarts": _number(status.get("restartCount")) or 0.0,
        }
        labels = [namespace, name]
        for family_name, value in values.items():
            if value is not None:
                families[family_name].add_metric(labels, value)

        admitted = _admitted(status)
        if state == State.QUEUED and admitted is not None:
            waiting_since = _time(admitted.get("lastTransitionTime"))
            if waiting_since is not None:
                queued = max(0.0, (now - waiting_since).total_seconds())
                families["trainingjob_queued_seconds"].add_metric(labels, queued)

        started = _time(status.get("startTime"))
        if started is not None:
            finished = _time(status.get("completionTime")) or now
            seconds = max(0.0, (finished - started).total_seconds())
            families["trainingjob_duration_seconds"].add_metric([*labels, state], seconds)
