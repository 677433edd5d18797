"""TrainingJobs in the states the metrics tests scrape (tests/unit/test_metrics.py,
tests/unit/test_metrics_server.py): running, pending, completed, in another namespace, queued.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from controller.runtime.clock import rfc3339

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def job(
    name: str, namespace: str = "ml", status: dict[str, Any] | None = None, spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "ml.example.com/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": spec or {"model": "bert", "dataset": "squad", "numWorkers": 2, "gpusPerWorker": 1},
    }
    if status is not None:
        obj["status"] = status
    return obj


RUNNING = job(
    "bert",
    status={
        "state": "Running",
        "progress": "45%",
        "currentEpoch": 4,
        "totalEpochs": 10,
        "metrics": {"loss": 0.41, "accuracy": 0.87, "gpu_utilization": 73.5},
        "resources": {"gpus": 8, "workers": 4},
        "restartCount": 2,
        "startTime": rfc3339(NOW - timedelta(hours=1)),
    },
)


PENDING = job("fresh")


COMPLETED = job(
    "done",
    status={
        "state": "Completed",
        "progress": "100%",
        "startTime": rfc3339(NOW - timedelta(hours=5)),
        "completionTime": rfc3339(NOW - timedelta(hours=3)),
    },
)


OTHER_NAMESPACE = job("gpt", namespace="research", status={"state": "Failed", "restartCount": 3})


def admitted(value: str, reason: str, at: datetime) -> dict[str, Any]:
    return {"type": "Admitted", "status": value, "reason": reason, "lastTransitionTime": rfc3339(at)}


QUEUED = job(
    "waiting",
    status={"state": "Queued", "conditions": [admitted("False", "Pending", NOW - timedelta(minutes=5))]},
)
