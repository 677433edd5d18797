"""Typed, read-only views of a TrainingJob, its Events and its ranks, parsed once from the API's JSON.

Why: a notebook user wants `job.status.current_epoch` and tab completion, not `job["status"].get(...)`
guarded against missing keys at every step; the kubectl plugin and the progress bar want the same
numbers. Everything here is a pure function of the JSON the API server returned (kept in `.raw`),
tolerant of fields that are not there yet (a job the operator has not seen has no status).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from crd import contract
from crd.contract import ReplicaType
from crd.replicas import Replicas
from crd.schema_status import STATES

JsonDict = dict[str, Any]

TERMINAL_STATES: Final = ("Completed", "Failed")
CONDITION_TYPES: Final = tuple(str(condition) for condition in contract.Condition)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def parse_percent(value: Any) -> float | None:
    """status.progress ("45%", "12.5%") as a number from 0 to 100; None when absent or unreadable."""
    if value is None:
        return None
    try:
        number = float(str(value).strip().rstrip("%"))
    except ValueError:
        return None
    if not math.isfinite(number):
        return None
    return min(100.0, max(0.0, number))


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None

    @property
    def is_true(self) -> bool:
        return self.status == "True"

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Condition:
        return cls(
            type=_text(raw.get("type")),
            status=_text(raw.get("status")),
            reason=_text(raw.get("reason")),
            message=_text(raw.get("message")),
            last_transition_time=raw.get("lastTransitionTime"),
        )


@dataclass(frozen=True)
class Workers:
    """Worker pods of the current attempt by phase (status.workers)."""

    pending: int = 0
    active: int = 0
    succeeded: int = 0
    failed: int = 0


@dataclass(frozen=True)
class JobStatus:
    """status of a TrainingJob; every field has a value even before the operator wrote any."""

    state: str | None = None
    message: str = ""
    progress: float | None = None
    current_epoch: int | None = None
    total_epochs: int | None = None
    step: int | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    restart_count: int = 0
    last_restart_reason: str | None = None
    # InPlace (the pods stayed) or Recreate, for a job with failurePolicy.restartStrategy InPlace.
    last_restart_kind: str | None = None
    failure_reason: str | None = None
    workers: Workers = Workers()
    conditions: tuple[Condition, ...] = ()
    latest_checkpoint: str | None = None
    duration: str | None = None
    # status.tracking: the job's MLflow run (one across restarts), its page, and why the trainer's last
    # call to the tracking server failed.
    mlflow_run_id: str | None = None
    mlflow_run_url: str | None = None
    # The job's W&B run (one across restarts), its page when online, and the mode it is logged in.
    wandb_run_id: str | None = None
    wandb_run_url: str | None = None
    wandb_mode: str | None = None
    tracking_unavailable: str | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> JobStatus:
        raw = raw or {}
        workers = raw.get("workers") or {}
        metrics = raw.get("metrics") or {}
        tracking: Mapping[str, Any] = raw["tracking"] if isinstance(raw.get("tracking"), dict) else {}
        return cls(
            state=raw.get("state") or None,
            message=_text(raw.get("message")),
            progress=parse_percent(raw.get("progress")),
            current_epoch=_int(raw.get("currentEpoch")),
            total_epochs=_int(raw.get("totalEpochs")),
            step=_int(raw.get("step")),
            metrics={
                str(key): float(value)
                for key, value in metrics.items()
                if isinstance(value, int | float) and not isinstance(value, bool)
            },
            restart_count=_int(raw.get("restartCount")) or 0,
            last_restart_reason=raw.get("lastRestartReason") or None,
            last_restart_kind=raw.get("lastRestartKind") or None,
            failure_reason=raw.get("failureReason") or None,
            workers=Workers(
                **{k: _int(workers.get(k)) or 0 for k in ("pending", "active", "succeeded", "failed")}
            ),
            conditions=tuple(
                Condition.from_dict(c) for c in raw.get("conditions") or [] if isinstance(c, dict)
            ),
            latest_checkpoint=(raw.get("checkpoint") or {}).get("latest") or None,
            duration=raw.get("duration") or None,
            mlflow_run_id=_text(tracking.get("mlflowRunId")) or None,
            mlflow_run_url=_text(tracking.get("mlflowRunUrl")) or None,
            wandb_run_id=_text(tracking.get("wandbRunId")) or None,
            wandb_run_url=_text(tracking.get("wandbRunUrl")) or None,
            wandb_mode=_text(tracking.get("wandbMode")) or None,
            tracking_unavailable=_text(tracking.get("unavailable")) or None,
        )

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    def condition(self, type_: str) -> Condition | None:
        for entry in self.conditions:
            if entry.type == type_:
                return entry
        return None

    def percent(self) -> float | None:
        """How far training got, 0-100: status.progress, else currentEpoch/totalEpochs; 100 once Completed."""
        if self.state == "Completed":
            return 100.0
        if self.progress is not None:
            return self.progress
        if self.current_epoch is not None and self.total_epochs:
            return min(100.0, 100.0 * self.current_epoch / self.total_epochs)
        return None


@dataclass(frozen=True)
class TrainingJob:
    """One TrainingJob as the API server returned it; `raw` is the whole JSON object."""

    name: str
    namespace: str
    uid: str
    resource_version: str
    num_workers: int
    suspended: bool
    status: JobStatus
    raw: JsonDict = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, raw: JsonDict) -> TrainingJob:
        metadata = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        return cls(
            name=_text(metadata.get("name")),
            namespace=_text(metadata.get("namespace")),
            uid=_text(metadata.get("uid")),
            resource_version=_text(metadata.get("resourceVersion")),
            num_workers=_int(spec.get("numWorkers")) or 0,
            suspended=bool(spec.get("suspend")),
            status=JobStatus.from_dict(raw.get("status")),
            raw=raw,
        )

    @property
    def state(self) -> str | None:
        return self.status.state

    @property
    def replicas(self) -> Replicas:
        """The job's pods by role (crd/replicas.py): a rank here is a slot, the chief's 0 when it has one."""
        spec = self.raw.get("spec") or {}
        roles = spec.get("tensorflow") or {}
        return Replicas(
            chief=_int(roles.get("chief")) or 0,
            master=1 if spec.get("framework") in contract.MASTER_FRAMEWORKS else 0,
            workers=self.num_workers,
            ps=_int(roles.get("ps")) or 0,
            evaluator=_int(roles.get("evaluator")) or 0,
            launcher=1 if spec.get("framework") == "mpi" else 0,
        )

    def pod_name(self, rank: int) -> str:
        """The pod of rank `rank` (its slot), as builders/names.py names it."""
        replica = self.replicas.at(rank)
        return f"{self.name}-{replica.type}-{replica.index}"

    def summary(self) -> str:
        """One line: state, epoch, progress, metrics, workers, restarts (what `make demo` prints)."""
        return describe_status(self.status)


def describe_status(status: JobStatus) -> str:
    parts = [f"{status.state or '(no status yet)':<12}"]
    if status.total_epochs is not None or status.current_epoch is not None:
        total = "?" if status.total_epochs is None else status.total_epochs
        parts.append(f"epoch {status.current_epoch or 0}/{total}")
    if status.progress is not None:
        parts.append(f"progress {status.progress:>3g}%")
    parts += [f"{key} {status.metrics[key]:.3f}" for key in sorted(status.metrics)]
    workers = status.workers
    counts = [
        f"{count} {label}"
        for label, count in (
            ("pending", workers.pending),
            ("active", workers.active),
            ("succeeded", workers.succeeded),
            ("failed", workers.failed),
        )
        if count
    ]
    if counts:
        parts.append("workers: " + ", ".join(counts))
    if status.restart_count:
        parts.append(f"restarts {status.restart_count}")
    return "  ".join(parts).rstrip()


def why_not_running(status: JobStatus) -> str | None:
    """One line saying why the job does not run right now, from its conditions; None while it runs.

    The most decisive condition wins: Failed, Succeeded, Suspended, Restarting, then Admitted=False
    (a job waiting in a Kueue queue: which queue and why), then Running=False (which names what blocks
    the pods: unschedulable, starting), then Stalled.
    """
    decisive = [(type_, True, type_) for type_ in ("Failed", "Succeeded", "Suspended", "Restarting")]
    decisive += [("Admitted", False, "not admitted"), ("Running", False, "not running")]
    decisive += [("Stalled", True, "Stalled")]
    for type_, value, label in decisive:
        entry = status.condition(type_)
        if entry is not None and entry.is_true == value:
            return _reason_line(label, entry)
    running = status.condition("Running")
    if running is None and status.state not in (None, "Running"):
        return f"{status.state}: {status.message}" if status.message else status.state
    if running is None and status.state is None:
        return "the operator has not reported on this job yet"
    return None


def _reason_line(label: str, entry: Condition) -> str:
    detail = ": ".join(part for part in (entry.reason, entry.message) if part)
    return f"{label}: {detail}" if detail else label


# ------------------------------------------------------------------------------------------ events


@dataclass(frozen=True)
class JobEvent:
    """One core/v1 Event about a job (as `kubectl get events` shows it)."""

    type: str
    reason: str
    message: str
    count: int
    first_time: str | None
    last_time: str | None
    source: str

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> JobEvent:
        series = raw.get("series") or {}
        source = raw.get("source") or {}
        last = series.get("lastObservedTime") or raw.get("lastTimestamp") or raw.get("eventTime")
        first = raw.get("firstTimestamp") or raw.get("eventTime") or last
        return cls(
            type=_text(raw.get("type")),
            reason=_text(raw.get("reason")),
            message=_text(raw.get("message")),
            count=_int(series.get("count")) or _int(raw.get("count")) or 1,
            first_time=first,
            last_time=last,
            source=_text(raw.get("reportingComponent") or source.get("component")),
        )


def events_in_order(items: Sequence[Mapping[str, Any]], uid: str = "") -> list[JobEvent]:
    """Events oldest first (by when they last happened), as `--sort-by=.lastTimestamp` would; with
    `uid`, only those about that job (not an earlier job of the same name)."""
    events = [
        JobEvent.from_dict(item)
        for item in items
        if not uid or (item.get("involvedObject") or {}).get("uid") in (None, "", uid)
    ]
    return sorted(events, key=lambda event: event.last_time or "")


# ------------------------------------------------------------------------------------------- ranks


@dataclass(frozen=True)
class RankStatus:
    """The pod of one rank (replica index) and how its trainer container is doing."""

    rank: int
    pod: str | None
    node: str | None = None
    phase: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    attempt: int | None = None

    def state_text(self) -> str:
        """ "exit 0 (Completed)", "waiting: ContainerCreating", "running", or "" when nothing is known."""
        if self.exit_code is not None:
            return f"exit {self.exit_code}" + (f" ({self.reason})" if self.reason else "")
        if self.reason:
            return f"waiting: {self.reason}"
        return "running" if self.phase == "Running" else ""


def rank_statuses(job: TrainingJob, pods: Sequence[JsonDict]) -> list[RankStatus]:
    """One entry per rank, the pod's slot (crd/replicas.py; the worker index in a job of workers only,
    and any pod of a worker beyond numWorkers): the job's own pod of the newest attempt (pods of an
    earlier job of the same name are left out)."""
    by_rank: dict[int, JsonDict] = {}
    for pod in pods:
        owners = (pod.get("metadata") or {}).get("ownerReferences") or []
        if job.uid and not any(owner.get("uid") == job.uid for owner in owners):
            continue
        labels = (pod.get("metadata") or {}).get("labels") or {}
        rank = _rank(job.replicas, labels)
        if rank is None:
            continue
        current = by_rank.get(rank)
        if current is None or _attempt(pod) > _attempt(current):
            by_rank[rank] = pod
    ranks = sorted(set(range(job.replicas.size)) | set(by_rank))
    return [_rank_status(rank, by_rank.get(rank)) for rank in ranks]


def _rank(replicas: Replicas, labels: Mapping[str, Any]) -> int | None:
    """The slot of the pod with these labels (a pod without the role label is a worker)."""
    index = _int_label(labels.get(contract.REPLICA_INDEX_LABEL))
    role = labels.get(contract.REPLICA_TYPE_LABEL, ReplicaType.WORKER.value)
    if index is None or role not in {str(member) for member in ReplicaType}:
        return None
    if role == ReplicaType.WORKER and not replicas.has_roles:
        return index
    return replicas.slot(ReplicaType(role), index)


def _int_label(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _attempt(pod: JsonDict) -> int:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return _int_label(labels.get(contract.ATTEMPT_LABEL)) or 0


def _rank_status(rank: int, pod: JsonDict | None) -> RankStatus:
    if pod is None:
        return RankStatus(rank=rank, pod=None)
    status = pod.get("status") or {}
    container = next(
        (
            entry
            for entry in status.get("containerStatuses") or []
            if entry.get("name") == contract.CONTAINER_NAME
        ),
        None,
    )
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    state = (container or {}).get("state") or {}
    if state.get("terminated"):
        exit_code = _int(state["terminated"].get("exitCode"))
        reason = state["terminated"].get("reason")
        message = state["terminated"].get("message")
    elif state.get("waiting"):
        reason = state["waiting"].get("reason")
        message = state["waiting"].get("message")
    if reason is None and status.get("phase") == "Pending":
        scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        if scheduled is not None and scheduled.get("status") == "False":
            reason, message = scheduled.get("reason"), scheduled.get("message")
    return RankStatus(
        rank=rank,
        pod=str((pod.get("metadata") or {}).get("name")),
        node=(pod.get("spec") or {}).get("nodeName") or None,
        phase=status.get("phase"),
        exit_code=exit_code,
        reason=reason,
        message=" ".join(str(message).split()) if message else None,
        attempt=_attempt(pod),
    )


__all__ = [
    "CONDITION_TYPES",
    "STATES",
    "TERMINAL_STATES",
    "Condition",
    "JobEvent",
    "JobStatus",
    "RankStatus",
    "TrainingJob",
    "Workers",
    "describe_status",
    "events_in_order",
    "rank_statuses",
    "why_not_running",
]
