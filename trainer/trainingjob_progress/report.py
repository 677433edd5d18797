"""The progress report as the operator reads it: the JSON document in the progress annotation.

Split out of the Reporter so that what a report says (counts, finite metrics, the latest checkpoint
repeated until a newer one comes) is decided apart from when and how it is sent. The operator's side
of this format is docs/progress.md; values it cannot use are left out here with a warning (once)
rather than sent and rejected there.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .base import MAX_METRIC_NAME, MAX_METRICS, UTC, OnceLogger, count, number, rfc3339


class ReportBuilder:
    """Turns report() arguments into the annotation's document, remembering the newest checkpoint."""

    def __init__(self, once: OnceLogger) -> None:
        self._once = once
        self._lock = threading.Lock()
        self._checkpoint: str | None = None
        self._checkpoint_time: str | None = None
        self._mlflow: dict[str, str] = {}
        self._wandb: dict[str, str] = {}
        # Why each tracker's last call failed, by tracker ("mlflow", "wandb"): one failing tracker
        # does not hide behind another that works.
        self._tracking_errors: dict[str, str] = {}

    def set_tracking(
        self,
        *,
        mlflow_run_id: str | None,
        mlflow_experiment_id: str | None,
        error: str | None,
        wandb: Mapping[str, str | None] | None = None,
        tracker: str = "mlflow",
    ) -> None:
        """The experiment-tracking run every later report names, and why `tracker`'s last call to its
        server failed (None once one succeeds). `wandb` holds the W&B run's runId, url and mode."""
        with self._lock:
            if mlflow_run_id:
                self._mlflow = {"runId": mlflow_run_id}
                if mlflow_experiment_id:
                    self._mlflow["experimentId"] = mlflow_experiment_id
            if wandb and wandb.get("runId"):
                self._wandb = {key: str(value) for key, value in wandb.items() if value}
            if error:
                self._tracking_errors[tracker] = error[:1024]
            else:
                self._tracking_errors.pop(tracker, None)

    def build(
        self,
        *,
        epoch: int | None,
        total_epochs: int | None,
        step: int | None,
        total_steps: int | None,
        metrics: Mapping[str, Any] | None,
        checkpoint: str | None,
        checkpoint_time: datetime | str | None,
    ) -> dict[str, Any]:
        now = datetime.now(UTC)
        report: dict[str, Any] = {}
        for key, value in (
            ("epoch", epoch),
            ("totalEpochs", total_epochs),
            ("step", step),
            ("totalSteps", total_steps),
        ):
            if value is None:
                continue
            counted = count(value)
            if counted is None:
                self._once.warning(
                    f"field:{key}", "progress field %s=%r is not a count, left out", key, value
                )
            else:
                report[key] = counted
        if metrics:
            report["metrics"] = self._metrics(metrics)
        with self._lock:
            if checkpoint and checkpoint != self._checkpoint:
                self._checkpoint = str(checkpoint)
                self._checkpoint_time = None
            if checkpoint and checkpoint_time is not None:
                self._checkpoint_time = (
                    rfc3339(checkpoint_time) if isinstance(checkpoint_time, datetime) else checkpoint_time
                )
            if self._checkpoint is not None:
                if self._checkpoint_time is None:
                    self._checkpoint_time = rfc3339(now)
                report["checkpoint"] = self._checkpoint
                report["checkpointTime"] = self._checkpoint_time
            if self._mlflow:
                report["mlflow"] = dict(self._mlflow)
            if self._wandb:
                report["wandb"] = dict(self._wandb)
            if self._tracking_errors:
                report["trackingError"] = "; ".join(self._tracking_errors.values())[:1024]
        report["time"] = rfc3339(now)
        return report

    def _metrics(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        accepted: dict[str, float] = {}
        for name, value in metrics.items():
            finite = number(value)
            if not isinstance(name, str) or not name or finite is None:
                self._once.warning(
                    f"metric:{name}", "metric %r=%r is not a finite number, left out", name, value
                )
                continue
            if len(accepted) >= MAX_METRICS:
                self._once.warning("metrics", "more than %d metrics: the rest are left out", MAX_METRICS)
                break
            accepted[name[:MAX_METRIC_NAME]] = finite
        return accepted


def annotation_patch(annotation: str, report: Mapping[str, Any]) -> bytes:
    """The JSON merge patch that sets the progress annotation of a pod to `report`."""
    text = json.dumps(report, sort_keys=True, separators=(",", ":"))
    return json.dumps({"metadata": {"annotations": {annotation: text}}}).encode()
