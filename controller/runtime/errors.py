"""Errors from the Kubernetes API, one class per answer the controller reacts to differently.

Callers branch on the class (a 409 AlreadyExists lowers an expectation, a 404 on delete means done,
a 410 restarts a watch with a relist) instead of comparing status codes all over the code base.
"""

from __future__ import annotations

from typing import Any

from controller.runtime import boundedjson


class KubeError(Exception):
    """Anything that went wrong talking to the API server."""


class TransportError(KubeError):
    """No HTTP answer: connection refused or reset, TLS failure, timeout."""


class ApiError(KubeError):
    """The API server answered with an error status."""

    status: int = 0

    def __init__(self, status: int, reason: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class Forbidden(ApiError):
    pass


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """409 on a write whose resourceVersion or UID precondition no longer holds."""


class AlreadyExists(ApiError):
    """409 on create: an object with that name exists."""


class Gone(ApiError):
    """410: the requested resourceVersion is too old (watch must relist)."""


class Invalid(ApiError):
    """422: schema, CEL or field validation refused the object."""


class TooManyRequests(ApiError):
    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(status, reason, message, body)
        self.retry_after = retry_after


class ServerError(ApiError):
    """5xx: the server or something behind it failed; worth retrying."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    410: Gone,
    422: Invalid,
}


def error_from_status(
    status: int, payload: bytes | str | dict[str, Any] | None, retry_after: str | None = None
) -> ApiError:
    """Maps an HTTP error answer (ideally a metav1.Status body) to the matching ApiError subclass."""
    body: dict[str, Any] = {}
    if isinstance(payload, dict):
        body = payload
    elif payload:
        try:
            decoded = boundedjson.loads(payload)
            if isinstance(decoded, dict):
                body = decoded
        except ValueError:
            body = {"message": payload.decode(errors="replace") if isinstance(payload, bytes) else payload}
    status = int(body.get("code") or status)
    reason = str(body.get("reason") or "")
    message = str(body.get("message") or reason or f"HTTP {status}")
    if status == 409:
        cls: type[ApiError] = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls(status, reason or "Conflict", message, body)
    if status == 429:
        return TooManyRequests(
            status, reason or "TooManyRequests", message, body, _seconds(retry_after, body)
        )
    if status >= 500:
        return ServerError(status, reason or "InternalError", message, body)
    return _BY_STATUS.get(status, ApiError)(status, reason, message, body)


def _seconds(header: str | None, body: dict[str, Any]) -> float | None:
    details = body.get("details") or {}
    for candidate in (header, details.get("retryAfterSeconds")):
        try:
            if candidate is not None:
                return max(0.0, float(candidate))
        except (TypeError, ValueError):
            continue
    return None


def is_retryable(exc: BaseException) -> bool:
    """429, 5xx and transport failures are transient; every other API error is an answer."""
    return isinstance(exc, TooManyRequests | ServerError | TransportError)
