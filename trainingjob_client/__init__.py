"""Python client for TrainingJobs (ml.example.com/v1): submit, wait with a progress bar, read logs.

    from trainingjob_client import TrainingJobClient

    client = TrainingJobClient(namespace="team-a")
    client.submit("mnist", model="cnn", dataset="mnist", num_workers=2, epochs=10)
    job = client.wait("mnist", for_state="Completed", progress=True)
    print(client.logs("mnist", rank=0))

The package is named for what it is, so `import trainingjob_client` reads as such in a notebook and
cannot be mistaken for the operator (`controller`) or for the trainer-side reporting helper
(`trainingjob_progress`). docs/client.md has the whole tour; the kubectl plugin
(`kubectl trainingjob ...`) is built on it.
"""

from trainingjob_client.client import TrainingJobClient
from trainingjob_client.errors import (
    ApiFailure,
    ApiNotInstalled,
    ClusterUnreachable,
    ConfigError,
    InvalidManifest,
    JobDeleted,
    JobEnded,
    JobExists,
    JobNotFound,
    JobRejected,
    LogsUnavailable,
    PermissionDenied,
    TrainingJobError,
    WaitTimeout,
)
from trainingjob_client.following import JobWatch
from trainingjob_client.manifest import JobFields, build_manifest
from trainingjob_client.progressbar import ProgressBar
from trainingjob_client.views import (
    Condition,
    JobEvent,
    JobStatus,
    RankStatus,
    TrainingJob,
    Workers,
    why_not_running,
)

__all__ = [
    "ApiFailure",
    "ApiNotInstalled",
    "ClusterUnreachable",
    "Condition",
    "ConfigError",
    "InvalidManifest",
    "JobDeleted",
    "JobEnded",
    "JobEvent",
    "JobExists",
    "JobFields",
    "JobNotFound",
    "JobRejected",
    "JobStatus",
    "JobWatch",
    "LogsUnavailable",
    "PermissionDenied",
    "ProgressBar",
    "RankStatus",
    "TrainingJob",
    "TrainingJobClient",
    "TrainingJobError",
    "WaitTimeout",
    "Workers",
    "build_manifest",
    "why_not_running",
]
