"""What every part of the progress helper shares: the names the operator and the pod agree on, the
limits of a report, and the logging that says each distinct problem once.

Apart from the package's __init__.py so that the report's encoding, its transport to the API server,
the background sender and the checkpoint helpers can each live in their own file and still agree on
these values. Standard library only, Python 3.9 or later, like every module of the helper.
"""

from __future__ import annotations

import logging
import math
import threading
from datetime import datetime, timezone
from typing import Final

DEFAULT_ANNOTATION: Final = "ml.example.com/progress"
# The metrics key for GPU utilisation in percent (0-100). The operator exports it per job as
# trainingjob_gpu_utilization_percent, which the TrainingJobLowGPUUtilization alert and the dashboard's
# GPU utilisation panel read; a job that does not report it has no such series. This helper does not
# measure it: read it in your code (e.g. torch.cuda.utilization(), or pynvml) and report it.
GPU_UTILIZATION: Final = "gpu_utilization"
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
# Local runs and tests only: where to report instead of the in-cluster API, and with which
# credentials. The API's base URL: https://host:port (e.g. the local control plane, for a trainer run
# by hand) or plain http:// (`kubectl proxy`, tests). The token file (re-read for every request, like
# the mounted one) and the CA bundle that verifies an https API replace the service-account
# directory's `token` and `ca.crt`. The TRAININGJOB_ prefix is reserved at
# admission, so a job's spec.env can never set them: inside a pod the reporter always talks to the
# in-cluster API with the pod's own service-account token.
API_URL_ENV: Final = "TRAININGJOB_PROGRESS_API_URL"
TOKEN_FILE_ENV: Final = "TRAININGJOB_PROGRESS_TOKEN_FILE"  # noqa: S105 - a variable name, not a secret
CA_FILE_ENV: Final = "TRAININGJOB_PROGRESS_CA_FILE"
# The operator copies a report into status at most every few seconds; sending more often only adds
# API traffic.
DEFAULT_MIN_INTERVAL: Final = 5.0
DEFAULT_TIMEOUT: Final = 5.0
MAX_METRICS: Final = 64
MAX_METRIC_NAME: Final = 63
MAX_DISTINCT_ERRORS: Final = 64
MAX_RESPONSE_BYTES: Final = 64 * 1024
# Training images bring their own Python, older than the operator's: this file runs on 3.9 and later.
UTC: Final = timezone.utc  # noqa: UP017 - datetime.UTC is 3.11+

log = logging.getLogger("trainingjob_progress")


class OnceLogger:
    """Logs each distinct message once: a trainer that cannot reach the API for hours reports every few
    seconds, and the same warning each time would bury its own logs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    def warning(self, key: str, message: str, *args: object) -> None:
        with self._lock:
            if key in self._seen or len(self._seen) >= MAX_DISTINCT_ERRORS:
                return
            self._seen.add(key)
        log.warning(message, *args)


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def count(value: object) -> int | None:
    """A non-negative whole number, or None for anything else (bools, negatives, NaN, strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def number(value: object) -> float | None:
    """A finite float from anything float() accepts (numbers, numpy scalars, one-element tensors)."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        result = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        return None
    return result if math.isfinite(result) else None
