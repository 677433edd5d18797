"""A thin raw-JSON REST client for the Kubernetes API, with the behaviour client-go gives Go controllers.

The official Python client is used only for what it does well: reading kubeconfig / in-cluster
credentials (tokens, client certificates, exec plugins, token refresh) and building the TLS/proxy
aware urllib3 pool that opens the connections. Everything above the socket is done here, because the
generated typed layer is slow and lossy for a long-running controller, retries nothing, has no
client-side QPS limit and its watch helper mishandles expired resourceVersions. So this module sends
and receives plain dicts, retries 429 (honouring Retry-After), 5xx and transport failures with
jittered exponential backoff, rate-limits every request with a token bucket, counts every HTTP attempt
for `rest_client_requests_total`, and opens single-shot watches (`watch.WatchStream`) that another
thread can close. The HTTP exchange itself (credentials, the QPS budget, the count) is transport.py's,
the HTTP/1.1 framing http11.py's.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, Literal, TypeVar
from urllib.parse import urlencode

import kubernetes
import tenacity
import urllib3

from controller.runtime import boundedjson, fastjson
from controller.runtime.clock import Clock, RealClock
from controller.runtime.errors import KubeError, TooManyRequests, is_retryable
from controller.runtime.http11 import StreamingAnswer
from controller.runtime.ratelimit import TokenBucket
from controller.runtime.resource import Resource
from controller.runtime.transport import Connection, NoMetrics, RestMetrics
from controller.runtime.watch import WatchStream

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
PatchType = Literal["merge", "json", "strategic", "apply"]
Timeout = float | tuple[float, float]
_T = TypeVar("_T")

# client-go dials with a 30 s timeout; the API server ends ordinary (non-watch) requests after 60 s
# (--request-timeout), so a read timeout a little above that lets the server's own answer arrive first.
DEFAULT_CONNECT_TIMEOUT: Final = 30.0
DEFAULT_READ_TIMEOUT: Final = 70.0

PATCH_CONTENT_TYPES: Final[Mapping[str, str]] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


def _timeout(value: Timeout | None, default_read: float) -> urllib3.Timeout:
    if value is None:
        return urllib3.Timeout(connect=DEFAULT_CONNECT_TIMEOUT, read=default_read)
    if isinstance(value, tuple):
        return urllib3.Timeout(connect=value[0], read=value[1])
    return urllib3.Timeout(connect=min(value, DEFAULT_CONNECT_TIMEOUT), read=value)


def _encode_query(query: Mapping[str, object] | None) -> str:
    if not query:
        return ""
    pairs: list[tuple[str, str]] = []
    for key, value in query.items():
        if value is None:
            continue
        if isinstance(value, bool):
            pairs.append((key, "true" if value else "false"))
        else:
            pairs.append((key, str(value)))
    return "?" + urlencode(pairs) if pairs else ""


class _Retries:
    """When a request is tried again: retryable failures only (429, 5xx, no answer), within
    `max_attempts` and `max_elapsed` seconds, after exponential backoff with jitter in [d, 2d) that a
    429's Retry-After can only lengthen."""

    def __init__(
        self,
        clock: Clock,
        *,
        max_attempts: int,
        max_elapsed: float,
        backoff_initial: float,
        backoff_max: float,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._clock = clock
        self._max_attempts = max_attempts
        self._max_elapsed = max_elapsed
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max

    def call(self, method: str, path: str, attempt: Callable[[], _T]) -> _T:
        """`attempt()`, tried again while the policy allows. The first try runs without tenacity
        (most requests succeed at once, and building a `Retrying` costs about as much as an exchange
        with the API server); a retryable failure is handed to tenacity as its first attempt's
        outcome, so the waits, the budget and the log are tenacity's from there on."""
        started = self._clock.monotonic()
        try:
            return attempt()
        except Exception as exc:
            if not is_retryable(exc) or self._max_attempts <= 1:
                raise
            first_failure: list[Exception] = [exc]

        def replayed() -> _T:
            if first_failure:
                raise first_failure.pop()
            return attempt()

        return self._retrying(method, path, started)(replayed)

    def _retrying(self, method: str, path: str, started: float) -> tenacity.Retrying:

        def stop(state: tenacity.RetryCallState) -> bool:
            # The wait is computed before the stop check, so a retry that could only start after
            # the time budget is not attempted at all.
            upcoming = float(getattr(state, "upcoming_sleep", 0.0))
            return (
                state.attempt_number >= self._max_attempts
                or self._clock.monotonic() - started + upcoming > self._max_elapsed
            )

        def before_sleep(state: tenacity.RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            delay = state.next_action.sleep if state.next_action is not None else 0.0
            logger.debug(
                "retrying %s %s after attempt %d failed (%s); waiting %.3fs",
                method,
                path,
                state.attempt_number,
                exc,
                delay,
            )

        return tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_retryable),
            stop=stop,
            wait=self._wait,
            sleep=self._clock.sleep,
            before_sleep=before_sleep,
            reraise=True,
        )

    def _wait(self, state: tenacity.RetryCallState) -> float:
        base = min(self._backoff_max, math.ldexp(self._backoff_initial, state.attempt_number - 1))
        delay = min(self._backoff_max, base * (1.0 + random.random()))  # noqa: S311 - jitter, not crypto
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
            delay = max(delay, exc.retry_after)
        return delay


class KubeClient:
    """Thread-safe; build one per process and share it (the connection pool and the QPS budget are shared)."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        qps: float,
        burst: int,
        metrics: RestMetrics | None = None,
        clock: Clock | None = None,
        *,
        max_attempts: int = 5,
        max_elapsed: float = 60.0,
        backoff_initial: float = 0.2,
        backoff_max: float = 10.0,
        timeout: Timeout | None = None,
        fast_http_client: bool = True,
    ) -> None:
        self._api = api_client
        self._clock: Clock = clock or RealClock()
        bucket = TokenBucket(qps, burst, self._clock) if qps > 0 else None
        metrics = metrics or NoMetrics()
        self._connection = Connection(api_client, metrics, bucket, fast_http_client=fast_http_client)
        self.host: str = self._connection.host
        self._retries = _Retries(
            self._clock,
            max_attempts=max_attempts,
            max_elapsed=max_elapsed,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )
        self._timeout = timeout

    @property
    def api_client(self) -> kubernetes.client.ApiClient:
        """The official client this one borrows credentials and connections from."""
        return self._api

    def close(self) -> None:
        """Drops pooled connections (open watches keep theirs until closed)."""
        self._connection.close()

    # ---- the one request path -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, object] | None = None,
        body: JsonObject | Sequence[Any] | None = None,
        content_type: str = "application/json",
        timeout: Timeout | None = None,
        check_nesting: bool = True,
        answer: bool = True,
    ) -> JsonObject:
        """Sends one API request (retrying transient failures) and returns the decoded JSON object.

        An empty answer body decodes to `{}`; values nested too deeply are truncated (see
        `boundedjson.loads`; `check_nesting` False for answers whose schema bounds their depth).
        `answer` False (create, patch): a successful answer is read, not decoded, and `{}` returned,
        for a caller that needs only to know the write was taken (decoding a created pod is costly).
        Raises the mapped `ApiError` for error answers, `TransportError` when no answer arrived.
        """
        method = method.upper()
        return self._retries.call(
            method,
            path,
            partial(
                self._attempt,
                method,
                path,
                query=query,
                body=body,
                content_type=content_type,
                timeout=timeout,
                check_nesting=check_nesting,
                answer=answer,
            ),
        )

    def _attempt(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, object] | None,
        body: JsonObject | Sequence[Any] | None,
        content_type: str,
        timeout: Timeout | None,
        check_nesting: bool,
        answer: bool,
    ) -> JsonObject:
        data = None if body is None else fastjson.dumps(body)
        payload = self._connection.exchange(
            method,
            path + _encode_query(query),
            data=data,
            content_type=content_type if data is not None else None,
            timeout=_timeout(timeout if timeout is not None else self._timeout, DEFAULT_READ_TIMEOUT),
            description=f"{method} {path}",
        )
        return _decode_object(payload if answer else b"", method, path, check_nesting=check_nesting)

    # ---- conveniences -----------------------------------------------------------------------------------

    def get(self, res: Resource, ns: str | None, name: str) -> JsonObject:
        return self.request("GET", res.path(ns, name), check_nesting=not res.built_in)

    def list(
        self,
        res: Resource,
        ns: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
    ) -> JsonObject:
        query: dict[str, object] = {
            "labelSelector": label_selector or None,
            "fieldSelector": field_selector or None,
            "resourceVersion": resource_version or None,
            "limit": limit,
            "continue": continue_ or None,
        }
        return self.request("GET", res.path(ns), query=query, check_nesting=not res.built_in)

    def create(self, res: Resource, ns: str | None, body: JsonObject, *, answer: bool = True) -> JsonObject:
        return self.request("POST", res.path(ns), body=body, check_nesting=not res.built_in, answer=answer)

    def replace(
        self, res: Resource, ns: str | None, name: str, body: JsonObject, *, subresource: str | None = None
    ) -> JsonObject:
        return self.request("PUT", res.path(ns, name, subresource), body=body, check_nesting=not res.built_in)

    def patch(
        self,
        res: Resource,
        ns: str | None,
        name: str,
        body: JsonObject | Sequence[Any],
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        force: bool = True,
        answer: bool = True,
    ) -> JsonObject:
        """PATCH with the given patch type; `force` applies to server-side apply only."""
        content_type = PATCH_CONTENT_TYPES[patch_type]
        query: dict[str, object] = {"fieldManager": field_manager}
        if patch_type == "apply":
            if not field_manager:
                raise ValueError("server-side apply needs a field manager")
            query["force"] = force
        if patch_type == "json" and not isinstance(body, Sequence):
            raise ValueError("a JSON patch is a list of operations")
        return self.request(
            "PATCH",
            res.path(ns, name, subresource),
            query=query,
            body=body,
            content_type=content_type,
            check_nesting=not res.built_in,
            answer=answer,
        )

    def delete(
        self,
        res: Resource,
        ns: str | None,
        name: str,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation: str | None = "Background",
        grace_period_seconds: int | None = None,
    ) -> JsonObject | None:
        """DELETE with DeleteOptions; preconditions make it safe against a same-named replacement.

        Returns the answer (the object being deleted, or a Status) or None for an empty answer.
        A missing object raises `NotFound`; a failed precondition raises `Conflict`.
        """
        options: JsonObject = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation is not None:
            options["propagationPolicy"] = propagation
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        return (
            self.request("DELETE", res.path(ns, name), body=options, check_nesting=not res.built_in) or None
        )

    # ---- watch ------------------------------------------------------------------------------------------

    def watch(
        self,
        res: Resource,
        ns: str | None = None,
        *,
        resource_version: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int,
        read_timeout: float,
        allow_bookmarks: bool = True,
    ) -> WatchStream:
        """Opens one watch (rate-limited, never retried: the informer owns reconnect policy)."""
        query: dict[str, object] = {
            "watch": True,
            "resourceVersion": resource_version or None,
            "labelSelector": label_selector or None,
            "fieldSelector": field_selector or None,
            "allowWatchBookmarks": True if allow_bookmarks else None,
            "timeoutSeconds": int(timeout_seconds),
        }
        path = res.path(ns)
        response = self.open_stream(path, query=query, read_timeout=read_timeout, description=f"WATCH {path}")
        return WatchStream(response, f"WATCH {path}", check_nesting=not res.built_in)

    def open_stream(
        self,
        path: str,
        *,
        query: Mapping[str, object] | None = None,
        read_timeout: float | None,
        description: str | None = None,
        accept: str = "application/json",
    ) -> StreamingAnswer:
        """GET whose answer is read as it arrives (watches, followed pod logs); rate-limited, never retried.

        Returns the open response of a 200 answer; the caller reads it and calls `release_conn()`.
        A `read_timeout` of None waits for the next byte as long as it takes (a followed log).
        An error answer raises the mapped `ApiError`, no answer `TransportError`.
        """
        return self._connection.open_stream(
            path + _encode_query(query),
            accept=accept,
            timeout=urllib3.Timeout(
                connect=DEFAULT_CONNECT_TIMEOUT
                if read_timeout is None
                else min(DEFAULT_CONNECT_TIMEOUT, read_timeout),
                read=read_timeout,
            ),
            description=description or f"GET {path}",
        )


def _decode_object(payload: bytes, method: str, path: str, *, check_nesting: bool = True) -> JsonObject:
    if not payload.strip():
        return {}
    try:
        decoded = boundedjson.loads(payload, check_nesting=check_nesting)
    except ValueError as exc:
        raise KubeError(f"{method} {path}: answer is not JSON: {exc}") from exc
    if not isinstance(decoded, dict):
        raise KubeError(f"{method} {path}: answer is not a JSON object")
    return decoded
