"""Training progress: from rank 0's report annotation into status, and the success policy it drives.

Rank 0 patches one annotation on its own Pod (crd.contract.PROGRESS_ANNOTATION) with a JSON object:

    {"epoch": 3, "totalEpochs": 10, "step": 1200, "totalSteps": 4000,
     "metrics": {"loss": 0.41, "accuracy": 0.87}, "checkpoint": "/checkpoints/epoch-3", "time": "..."}

`epoch` counts completed epochs. The operator already watches its pods, so reading the report costs
no API call; it copies the report into status only when it changed and at most once per
`min_interval` seconds, so a chatty trainer cannot turn into a stream of status writes. A report
that is not valid JSON, or has values of the wrong type, is ignored field by field and never fails
the job or the operator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from controller.runtime.clock import parse_time, rfc3339
from crd.spec import Spec, SuccessPolicy

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Report:
    epoch: int | None = None
    total_epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    checkpoint_time: str | None = None
    # When the reporter wrote it (its own clock): which of several pods' reports is the newest.
    time: str | None = None
    # The experiment-tracking run the trainer logs into, and why its last call to the tracking server
    # failed (absent once one succeeds).
    mlflow_run_id: str | None = None
    mlflow_experiment_id: str | None = None
    wandb_run_id: str | None = None
    wandb_run_url: str | None = None
    wandb_mode: str | None = None
    tracking_error: str | None = None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def parse_report(text: str | None) -> tuple[Report | None, str | None]:
    """Parses the annotation: (report, None), or (None, None) when absent, or (None, error) when unusable."""
    if not text:
        return None, None
    try:
        raw = json.loads(text)
    except ValueError as error:
        return None, f"progress annotation is not JSON: {error}"
    if not isinstance(raw, dict):
        return None, "progress annotation is not a JSON object"
    metrics_raw = raw.get("metrics")
    metrics: dict[str, float] = {}
    if isinstance(metrics_raw, dict):
        for key, value in list(metrics_raw.items())[:64]:
            numeric = not isinstance(value, bool) and isinstance(value, int | float)
            if isinstance(key, str) and numeric and math.isfinite(value):
                metrics[key[:63]] = float(value)
    checkpoint = raw.get("checkpoint")
    checkpoint_time = raw.get("checkpointTime")
    if isinstance(checkpoint, dict):
        checkpoint_time = checkpoint.get("time", checkpoint_time)
        checkpoint = checkpoint.get("path")
    mlflow: dict[str, Any] = raw["mlflow"] if isinstance(raw.get("mlflow"), dict) else {}
    wandb: dict[str, Any] = raw["wandb"] if isinstance(raw.get("wandb"), dict) else {}
    return Report(
        epoch=_count(raw.get("epoch")),
        total_epochs=_count(raw.get("totalEpochs")),
        step=_count(raw.get("step")),
        total_steps=_count(raw.get("totalSteps")),
        metrics=metrics,
        checkpoint=checkpoint[:1024] if isinstance(checkpoint, str) and checkpoint else None,
        checkpoint_time=checkpoint_time if isinstance(checkpoint_time, str) else None,
        time=_valid_time(raw["time"]) if isinstance(raw.get("time"), str) else None,
        mlflow_run_id=_identifier(mlflow.get("runId")),
        mlflow_experiment_id=_identifier(mlflow.get("experimentId")),
        wandb_run_id=_identifier(wandb.get("runId")),
        wandb_run_url=_web_url(wandb.get("url")),
        wandb_mode=_identifier(wandb.get("mode"), limit=16),
        tracking_error=_text(raw.get("trackingError"), 1024),
    ), None


def _identifier(value: Any, limit: int = 64) -> str | None:
    """A run's or experiment's id (or W&B's mode): letters, digits, dashes and underscores, at most
    `limit`."""
    if isinstance(value, str) and 0 < len(value) <= limit and all(c.isalnum() or c in "-_" for c in value):
        return value
    return None


def _web_url(value: Any) -> str | None:
    """A run's page as the trainer reported it: an http(s) URL, at most 512 characters."""
    if isinstance(value, str) and value.startswith(("https://", "http://")) and len(value) <= 512:
        return value
    return None


def _text(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def run_url(tracking_uri: str, experiment_id: str | None, run_id: str) -> str:
    """The run's page in the MLflow UI served at the tracking URI."""
    base = tracking_uri.rstrip("/")
    if experiment_id:
        return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"
    return f"{base}/#/runs/{run_id}"


def tracking_status(previous: Any, report: Report, spec: Spec) -> dict[str, Any] | None:
    """status.tracking after `report`: the run it names (with its URL), and `unavailable` while the
    trainer's last call to the tracking server failed. A report that says nothing of tracking keeps
    what status had."""
    tracking = dict(previous) if isinstance(previous, dict) else {}
    if report.mlflow_run_id is None and report.wandb_run_id is None and report.tracking_error is None:
        return tracking or None
    if report.wandb_run_id is not None and spec.monitoring.wandb_project:
        tracking["wandbRunId"] = report.wandb_run_id
        tracking.pop("wandbRunUrl", None)
        tracking.pop("wandbMode", None)
        if report.wandb_run_url is not None:
            tracking["wandbRunUrl"] = report.wandb_run_url
        if report.wandb_mode is not None:
            tracking["wandbMode"] = report.wandb_mode
    uri = spec.monitoring.mlflow_tracking_uri
    if report.mlflow_run_id is not None and uri:
        tracking["mlflowRunId"] = report.mlflow_run_id
        tracking["mlflowRunUrl"] = run_url(uri, report.mlflow_experiment_id, report.mlflow_run_id)
        if report.mlflow_experiment_id is not None:
            tracking["mlflowExperimentId"] = report.mlflow_experiment_id
    if report.tracking_error is not None:
        tracking["unavailable"] = report.tracking_error
    else:
        tracking.pop("unavailable", None)
    return tracking or None


def percent(report: Report, planned_epochs: int | None) -> str | None:
    if report.step is not None and report.total_steps:
        ratio = report.step / report.total_steps
    else:
        total = report.total_epochs or planned_epochs
        if report.epoch is None or not total:
            return None
        ratio = report.epoch / total
    return f"{min(100, max(0, math.floor(ratio * 100)))}%"


def _reported_fields(report: Report, planned_epochs: int | None) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if report.epoch is not None:
        fields["currentEpoch"] = report.epoch
    total = report.total_epochs or planned_epochs
    if total:
        fields["totalEpochs"] = total
    if report.step is not None:
        fields["step"] = report.step
    if report.metrics:
        fields["metrics"] = dict(report.metrics)
    progress = percent(report, planned_epochs)
    if progress is not None:
        fields["progress"] = progress
    return fields


@dataclass(frozen=True)
class ProgressUpdate:
    status: dict[str, Any]
    changed: bool
    retry_in: float | None


def apply_report(
    status: Mapping[str, Any],
    report: Report,
    spec: Spec,
    now: datetime,
    min_interval: float,
) -> ProgressUpdate:
    """Copies a report into status if it says something new and the rate limit allows it now.

    Returns the (possibly unchanged) status, whether it changed, and when to look again if the rate
    limit deferred a change.
    """
    fields = _reported_fields(report, spec.hyperparameters.epochs)
    tracking = tracking_status(status.get("tracking"), report, spec)
    if tracking is not None:
        fields["tracking"] = tracking
    checkpoint = dict(status.get("checkpoint") or {})
    new_checkpoint = report.checkpoint is not None and report.checkpoint != checkpoint.get("latest")
    if all(status.get(key) == value for key, value in fields.items()) and not new_checkpoint:
        return ProgressUpdate(dict(status), False, None)
    last = status.get("lastProgressTime")
    if last and min_interval > 0:
        elapsed = (now - parse_time(last)).total_seconds()
        if elapsed < min_interval:
            return ProgressUpdate(dict(status), False, min_interval - elapsed)
    updated = dict(status)
    updated.update(fields)
    updated["lastProgressTime"] = rfc3339(now)
    if new_checkpoint:
        updated["checkpoint"] = {
            "latest": report.checkpoint,
            "count": int(checkpoint.get("count", 0)) + 1,
            "time": _valid_time(report.checkpoint_time) or rfc3339(now),
        }
    success = spec.success_policy
    if report.metrics.get(success.metric) is not None and report.epoch is not None:
        updated["bestMetric"] = _best(
            status.get("bestMetric"), report.metrics[success.metric], report.epoch, success
        )
    return ProgressUpdate(updated, True, None)


def tracking_events(before: Any, after: Any) -> list[tuple[EventType, str, str]]:
    """The Events a change of status.tracking makes: the job's MLflow run created, replaced (the one
    it logged into was deleted in MLflow, or cannot be found), its W&B run started, tracking
    unavailable, and back."""
    old = before if isinstance(before, dict) else {}
    new = after if isinstance(after, dict) else {}
    events: list[tuple[EventType, str, str]] = []
    run, previous_run = new.get("mlflowRunId"), old.get("mlflowRunId")
    if run and not previous_run:
        events.append(("Normal", "MLflowRunCreated", f"MLflow run {run}: {new.get('mlflowRunUrl', '')}"))
    elif run and run != previous_run:
        events.append(
            (
                "Warning",
                "MLflowRunReplaced",
                f"the trainer logs into a new MLflow run {run}: run {previous_run} was deleted in MLflow or "
                f"could not be found ({new.get('mlflowRunUrl', '')})",
            )
        )
    wandb_run = new.get("wandbRunId")
    if wandb_run and wandb_run != old.get("wandbRunId"):
        where = new.get("wandbRunUrl") or f"logged {new.get('wandbMode', 'offline')}"
        events.append(("Normal", "WandbRunStarted", f"W&B run {wandb_run}: {where}"))
    if new.get("unavailable") and not old.get("unavailable"):
        events.append(
            (
                "Warning",
                "TrackingUnavailable",
                f"the trainer cannot reach the tracking server and trains on: {new['unavailable']}",
            )
        )
    elif old.get("unavailable") and not new.get("unavailable"):
        events.append(("Normal", "TrackingAvailable", "the trainer reaches the tracking server again"))
    return events


def _valid_time(text: str | None) -> str | None:
    if not text:
        return None
    try:
        return rfc3339(parse_time(text))
    except ValueError:
        return None


def _improves(value: float, best: float, policy: SuccessPolicy) -> bool:
    if policy.minimize:
        return value < best - policy.min_delta
    return value > best + policy.min_delta


def _best(previous: Any, value: float, epoch: int, policy: SuccessPolicy) -> dict[str, Any]:
    if not isinstance(previous, dict) or "value" not in previous:
        return {"value": value, "epoch": epoch}
    if _improves(value, float(previous["value"]), policy):
        return {"value": value, "epoch": epoch}
    return dict(previous)


def success_reached(status: Mapping[str, Any], policy: SuccessPolicy) -> tuple[str, str] | None:
    """(reason, message) when the reported metrics satisfy successPolicy, else None."""
    metric_name = policy.metric
    value = (status.get("metrics") or {}).get(metric_name)
    target = policy.target_accuracy
    if target is not None and value is not None:
        reached = value <= target if policy.minimize else value >= target
        if reached:
            return "TargetReached", f"{metric_name} {value:g} reached the target {target:g}"
    patience = policy.early_stopping_patience
    best = status.get("bestMetric")
    epoch = status.get("currentEpoch")
    if patience and isinstance(best, dict) and epoch is not None:
        stale = int(epoch) - int(best.get("epoch", 0))
        if stale >= int(patience):
            return "EarlyStopped", (
                f"{metric_name} has not improved on {best['value']:g} (epoch {best['epoch']}) "
                f"for {stale} epochs (patience {patience})"
            )
    return None
