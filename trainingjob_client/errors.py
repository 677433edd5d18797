"""The client's exceptions: one class per thing a caller (a notebook, a script, the kubectl plugin) handles.

The REST layer (controller.runtime.client) raises errors per HTTP answer; a person at a notebook needs to know
what went wrong with *their job* instead: it does not exist (maybe it is in another namespace), the
cluster cannot be reached, the API server refused the spec, the wait timed out, the job ended in a
state other than the one awaited, its pods (and so its logs) are gone. Every message is one sentence
that names the job, the namespace or the API server; none needs a traceback to be understood.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from controller.runtime import errors as api

if TYPE_CHECKING:
    from trainingjob_client.views import TrainingJob


class TrainingJobError(Exception):
    """Base of everything this client raises; `str(error)` is one line for a person."""


class ConfigError(TrainingJobError):
    """No usable kubeconfig or in-cluster configuration (missing, unreadable, no such context)."""


class ClusterUnreachable(TrainingJobError):
    """The API server did not answer (connection refused, timed out, TLS failure)."""


class ApiNotInstalled(TrainingJobError):
    """The cluster does not serve the TrainingJob API: the CRD is not installed."""


class PermissionDenied(TrainingJobError):
    """The API server refused the credentials (401) or the request (403)."""


class JobNotFound(TrainingJobError):
    """No TrainingJob of that name in that namespace."""

    def __init__(self, namespace: str, name: str, elsewhere: tuple[str, ...] = ()) -> None:
        message = f'TrainingJob "{name}" not found in namespace "{namespace}"'
        if elsewhere:
            places = ", ".join(f'"{ns}"' for ns in elsewhere)
            message += f" (there is one in namespace {places})"
        super().__init__(message)
        self.namespace = namespace
        self.name = name
        self.elsewhere = elsewhere


class JobDeleted(JobNotFound):
    """The job was deleted while it was being watched or awaited."""

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(namespace, name)
        self.args = (f'TrainingJob "{name}" in namespace "{namespace}" was deleted while being watched',)


class JobExists(TrainingJobError):
    """A TrainingJob of that name exists already."""


class JobRejected(TrainingJobError):
    """The API server refused the manifest (schema, CEL rules, immutable fields); the message names
    the field."""


class InvalidManifest(TrainingJobError, ValueError):
    """What was given is not one TrainingJob manifest (bad YAML, another kind, two documents)."""


class WaitTimeout(TrainingJobError, TimeoutError):
    """The awaited state or condition did not come within the timeout; `job` is the last one seen."""

    def __init__(self, message: str, job: TrainingJob | None) -> None:
        super().__init__(message)
        self.job = job


class JobEnded(TrainingJobError):
    """The job finished in a state that can never become the awaited one (e.g. Failed while waiting
    for Completed); `job` is the finished job."""

    def __init__(self, message: str, job: TrainingJob) -> None:
        super().__init__(message)
        self.job = job


class LogsUnavailable(TrainingJobError):
    """The rank's log cannot be read: its pod is gone, its container has not started, or its node
    does not serve logs."""


class ApiFailure(TrainingJobError):
    """Any other error answer of the API server."""


_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")]+)")
_KNOWN_CAUSES = (
    ("timed out", "timed out"),
    ("CERTIFICATE_VERIFY_FAILED", "the server's TLS certificate is not trusted"),
    ("SSLError", "TLS handshake failed"),
    ("[SSL", "TLS handshake failed"),
    ("RemoteDisconnected", "the server closed the connection"),
    ("Connection reset", "connection reset"),
)


def transport_reason(text: str) -> str:
    """The useful part of a connection error's text: "connection refused", "timed out", ..."""
    found = _ERRNO.search(text)
    if found:
        return found.group(1).strip().rstrip(".").lower()
    for fragment, reason in _KNOWN_CAUSES:
        if fragment in text:
            return reason
    return " ".join(text.split())[:200]


def status_message(body: dict[str, Any], fallback: str) -> str:
    """The message of a metav1.Status answer, on one line."""
    message = body.get("message") if isinstance(body, dict) else None
    return " ".join(str(message or fallback).split())


def translate(  # noqa: PLR0911 - one return per kind of answer
    error: api.KubeError, *, namespace: str, name: str | None = None, host: str = ""
) -> TrainingJobError:
    """The client's exception for an error of the REST layer, about job `name` (or a list call)."""
    if isinstance(error, api.TransportError):
        where = f" at {host}" if host else ""
        return ClusterUnreachable(
            f"cannot reach the Kubernetes API server{where}: {transport_reason(str(error))}"
        )
    if not isinstance(error, api.ApiError):
        return ApiFailure(" ".join(str(error).split()))
    message = status_message(error.body, error.message)
    if isinstance(error, api.NotFound):
        details = error.body.get("details") or {}
        if name is not None and details.get("name") == name:
            return JobNotFound(namespace, name)
        if "could not find the requested resource" in message or details.get("name") is None:
            return ApiNotInstalled(
                "the cluster does not serve TrainingJobs (ml.example.com/v1): is the CRD installed? "
                f"({message})"
            )
        return ApiFailure(message)
    if isinstance(error, api.Unauthorized):
        return PermissionDenied(f"the API server did not accept the credentials: {message}")
    if isinstance(error, api.Forbidden):
        return PermissionDenied(message)
    if isinstance(error, api.AlreadyExists):
        return JobExists(f'TrainingJob "{name}" already exists in namespace "{namespace}"')
    if isinstance(error, api.Invalid | api.BadRequest):
        return JobRejected(message)
    return ApiFailure(
        f"the API server answered {error.status} {error.reason}: {message}".replace(" : ", ": ")
    )
