"""A thin raw-JSON REST client for the Kubernetes API, with the behaviour client-go gives Go controllers.

The official Python client is used only for what it does well: reading kubeconfig / in-cluster
credentials (tokens, client certificates, exec plugins, token refresh) and building the TLS/proxy
aware urllib3 pool. Everything above the socket is done here, because the generated typed layer is
slow and lossy for a long-running controller, retries nothing, has no client-side QPS limit and its
watch helper mishandles expired resourceVersions. So this module sends and receives plain dicts,
retries 429 (honouring Retry-After), 5xx and transport failures with jittered exponential backoff,
rate-limits every request with a token bucket, counts every HTTP attempt for
`rest_client_requests_total`, and exposes a single-shot watch stream that another thread can close.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import random
import threading
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Literal, NamedTuple, Protocol, Self
from urllib.parse import quote, urlencode, urlsplit

import kubernetes
import tenacity
import urllib3

from controller import boundedjson
from controller.clock import Clock, RealClock
from controller.errors import (
    ApiError,
    Gone,
    KubeError,
    TooManyRequests,
    TransportError,
    error_from_status,
    is_retryable,
)
from controller.ratelimit import TokenBucket
from crd import contract

logger = logging.getLogger("controller.kube")

JsonObject = dict[str, Any]
PatchType = Literal["merge", "json", "strategic", "apply"]
Timeout = float | tuple[float, float]

# client-go dials with a 30 s timeout; the API server ends ordinary (non-watch) requests after 60 s
# (--request-timeout), so a read timeout a little above that lets the server's own answer arrive first.
DEFAULT_CONNECT_TIMEOUT: Final = 30.0
DEFAULT_READ_TIMEOUT: Final = 70.0
# Pool size when the caller does not say: a handful of workers, three informer watches, a lease.
DEFAULT_POOL_SIZE: Final = 16
TRANSPORT_ERROR_CODE: Final = "<error>"

PATCH_CONTENT_TYPES: Final[Mapping[str, str]] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}

_TRANSPORT_EXCEPTIONS: Final = (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)


# API groups of Kubernetes' own kinds without the reserved .k8s.io suffix ("" is the core group).
_BUILT_IN_GROUPS: Final = frozenset({"", "apps", "batch", "policy", "autoscaling", "extensions"})


class Resource(NamedTuple):
    """One API resource: enough to build its REST paths."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def built_in(self) -> bool:
        """Whether this is one of Kubernetes' own kinds, whose compiled-in schema bounds how deeply its
        objects nest. A custom resource's schema may let a user nest a value without bound, so its
        answers are checked before they are decoded (controller/boundedjson.py)."""
        return self.group in _BUILT_IN_GROUPS or self.group.endswith(".k8s.io")

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """REST path; a namespaced resource without a namespace addresses all namespaces (list/watch)."""
        if namespace is not None and not self.namespaced:
            raise ValueError(f"{self.plural} is cluster-scoped; got namespace {namespace!r}")
        if name is not None and self.namespaced and namespace is None:
            raise ValueError(f"{self.plural} is namespaced; a name needs a namespace")
        if subresource is not None and name is None:
            raise ValueError("a subresource needs a name")
        parts = ["/api/v1" if not self.group else f"/apis/{self.group}/{self.version}"]
        if namespace is not None:
            parts.append(f"namespaces/{_segment(namespace)}")
        parts.append(self.plural)
        if name is not None:
            parts.append(_segment(name))
        if subresource is not None:
            parts.append(_segment(subresource))
        return "/".join(parts)


def _segment(value: str) -> str:
    if not value:
        raise ValueError("empty path segment")
    return quote(value, safe="")


PODS: Final = Resource("", "v1", "pods", "Pod")
SERVICES: Final = Resource("", "v1", "services", "Service")
CONFIGMAPS: Final = Resource("", "v1", "configmaps", "ConfigMap")
EVENTS: Final = Resource("", "v1", "events", "Event")
SERVICEACCOUNTS: Final = Resource("", "v1", "serviceaccounts", "ServiceAccount")
PVCS: Final = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
SECRETS: Final = Resource("", "v1", "secrets", "Secret")
NODES: Final = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES: Final = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases", "Lease")
ROLES: Final = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLEBINDINGS: Final = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
PRIORITYCLASSES: Final = Resource(
    "scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False
)
CRDS: Final = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False
)
TRAININGJOBS: Final = Resource(contract.GROUP, contract.VERSION, contract.PLURAL, contract.KIND)


class RestMetrics(Protocol):
    """Receives one call per HTTP attempt, like client-go's rest_client_requests_total."""

    def request(self, code: str, method: str, host: str) -> None: ...


class _NoMetrics:
    def request(self, code: str, method: str, host: str) -> None:
        return None


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
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self._api = api_client
        self._config = api_client.configuration
        self._pool = api_client.rest_client.pool_manager
        self._base = str(self._config.host).rstrip("/")
        self.host: str = urlsplit(self._base).netloc or self._base
        self._clock: Clock = clock or RealClock()
        self._metrics: RestMetrics = metrics or _NoMetrics()
        self._bucket = TokenBucket(qps, burst, self._clock) if qps > 0 else None
        self._max_attempts = max_attempts
        self._max_elapsed = max_elapsed
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._timeout = timeout

    @property
    def api_client(self) -> kubernetes.client.ApiClient:
        """The official client this one borrows credentials and connections from."""
        return self._api

    def close(self) -> None:
        """Drops pooled connections (open watches keep theirs until closed)."""
        self._pool.clear()

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
    ) -> JsonObject:
        """Sends one API request (retrying transient failures) and returns the decoded JSON object.

        An empty answer body decodes to `{}`; values nested too deeply are truncated (see
        `boundedjson.loads`; `check_nesting` False for answers whose schema bounds their depth).
        Raises the mapped `ApiError` for error answers and
        `TransportError` when no answer arrived, after the retry budget is spent for retryable ones.
        """
        method = method.upper()
        started = self._clock.monotonic()

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

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(is_retryable),
            stop=stop,
            wait=self._wait,
            sleep=self._clock.sleep,
            before_sleep=before_sleep,
            reraise=True,
        )
        result: JsonObject = retrying(
            self._attempt,
            method,
            path,
            query=query,
            body=body,
            content_type=content_type,
            timeout=timeout,
            check_nesting=check_nesting,
        )
        return result

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """Exponential backoff with jitter in [d, 2d); a 429's Retry-After is the minimum."""
        base = min(self._backoff_max, math.ldexp(self._backoff_initial, state.attempt_number - 1))
        delay = min(self._backoff_max, base * (1.0 + random.random()))  # noqa: S311 - jitter, not crypto
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, TooManyRequests) and exc.retry_after is not None:
            delay = max(delay, exc.retry_after)
        return delay

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
    ) -> JsonObject:
        self._throttle()
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = self._headers(content_type if data is not None else None)
        url = self._base + path + _encode_query(query)
        try:
            response = self._pool.request(
                method,
                url,
                body=data,
                headers=headers,
                timeout=_timeout(timeout if timeout is not None else self._timeout, DEFAULT_READ_TIMEOUT),
                retries=False,
                preload_content=True,
            )
        except _TRANSPORT_EXCEPTIONS as exc:
            self._metrics.request(TRANSPORT_ERROR_CODE, method, self.host)
            raise TransportError(f"{method} {path}: {exc}") from exc
        status = int(response.status)
        self._metrics.request(str(status), method, self.host)
        payload: bytes = response.data or b""
        if not 200 <= status < 300:
            raise error_from_status(status, payload, response.headers.get("Retry-After"))
        return _decode_object(payload, method, path, check_nesting=check_nesting)

    def _throttle(self) -> None:
        if self._bucket is not None:
            self._bucket.wait()

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers: dict[str, str] = {str(k): str(v) for k, v in self._api.default_headers.items()}
        headers["Accept"] = "application/json"
        if content_type is not None:
            headers["Content-Type"] = content_type
        # auth_settings() runs the configuration's refresh hook, so rotated service-account tokens and
        # exec-plugin credentials are picked up per request, as in the official client.
        for setting in self._config.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[str(setting["key"])] = str(setting["value"])
        return headers

    # ---- conveniences -----------------------------------------------------------------------------------

    def get(self, res: Resource, ns: str | None, name: str) -> JsonObject:
        return self.request("GET", res.path(ns, name))

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

    def create(self, res: Resource, ns: str | None, body: JsonObject) -> JsonObject:
        return self.request("POST", res.path(ns), body=body)

    def replace(
        self, res: Resource, ns: str | None, name: str, body: JsonObject, *, subresource: str | None = None
    ) -> JsonObject:
        return self.request("PUT", res.path(ns, name, subresource), body=body)

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
            "PATCH", res.path(ns, name, subresource), query=query, body=body, content_type=content_type
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
        return self.request("DELETE", res.path(ns, name), body=options) or None

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
    ) -> urllib3.BaseHTTPResponse:
        """GET whose answer is read as it arrives (watches, followed pod logs); rate-limited, never retried.

        Returns the open response of a 200 answer; the caller reads it and calls `release_conn()`.
        A `read_timeout` of None waits for the next byte as long as it takes (a followed log).
        An error answer raises the mapped `ApiError`, no answer `TransportError`.
        """
        description = description or f"GET {path}"
        self._throttle()
        url = self._base + path + _encode_query(query)
        headers = self._headers(None)
        headers["Accept"] = accept
        try:
            response = self._pool.request(
                "GET",
                url,
                headers=headers,
                timeout=urllib3.Timeout(
                    connect=DEFAULT_CONNECT_TIMEOUT
                    if read_timeout is None
                    else min(DEFAULT_CONNECT_TIMEOUT, read_timeout),
                    read=read_timeout,
                ),
                retries=False,
                preload_content=False,
            )
        except _TRANSPORT_EXCEPTIONS as exc:
            self._metrics.request(TRANSPORT_ERROR_CODE, "GET", self.host)
            raise TransportError(f"{description}: {exc}") from exc
        status = int(response.status)
        self._metrics.request(str(status), "GET", self.host)
        if status != 200:
            try:
                payload = response.read()
            except _TRANSPORT_EXCEPTIONS:
                payload = b""
            finally:
                response.release_conn()
            raise error_from_status(status, payload, response.headers.get("Retry-After"))
        return response


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


class WatchStream:
    """One open watch: iterate for `(type, object)` pairs; `close()` from any thread ends it.

    Iteration ends when the server closes the stream (its timeoutSeconds) or after `close()`.
    An ERROR event raises the mapped ApiError (`Gone` for 410 / reason Expired); a broken
    connection or read timeout raises TransportError. Lines that are not watch events are logged
    and skipped.
    """

    _CHUNK: Final = 64 * 1024

    def __init__(
        self, response: urllib3.BaseHTTPResponse, description: str, *, check_nesting: bool = True
    ) -> None:
        self._response = response
        self._description = description
        self._check_nesting = check_nesting
        self._lock = threading.Lock()
        self._closed = False
        self._reading = False
        self._released = False
        self._iterating = False

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Idempotent; safe to call while another thread is blocked reading the stream."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reading = self._reading
        self._shutdown()
        if not reading:
            self._release()

    def _shutdown(self) -> None:
        # Shutting the socket down (rather than closing it) makes a blocked recv() return at once
        # without racing the reader thread on the file descriptor.
        try:
            self._response.shutdown()
        except (ValueError, RuntimeError, OSError):
            return

    def _release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        try:
            self._response.close()
        except _TRANSPORT_EXCEPTIONS:
            logger.debug("closing %s failed", self._description, exc_info=True)
        finally:
            self._response.release_conn()

    def __iter__(self) -> Iterator[tuple[str, JsonObject]]:
        with self._lock:
            if self._iterating:
                raise RuntimeError("a watch stream can be iterated once")
            self._iterating = True
        return self._events()

    def _events(self) -> Iterator[tuple[str, JsonObject]]:
        buffer = b""
        try:
            while True:
                chunk = self._read()
                if not chunk:
                    tail = buffer.strip()
                    if tail and not self.closed:
                        event = self._parse(tail)
                        if event is not None:
                            yield event
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = self._parse(line)
                    if event is not None:
                        yield event
        finally:
            self.close()

    def _read(self) -> bytes:
        """Next bytes of the stream; b"" at the end or once closed."""
        with self._lock:
            already_closed = self._closed
            self._reading = not already_closed
        if already_closed:
            return b""
        error: BaseException | None = None
        data = b""
        try:
            data = self._response.read1(self._CHUNK)
        except _TRANSPORT_EXCEPTIONS as exc:
            error = exc
        with self._lock:
            self._reading = False
            closed = self._closed
        if closed:
            self._release()
            return b""
        if error is not None:
            if isinstance(error, urllib3.exceptions.ReadTimeoutError):
                raise TransportError(f"{self._description}: read timed out") from error
            raise TransportError(f"{self._description}: {error}") from error
        return data

    def _parse(self, line: bytes) -> tuple[str, JsonObject] | None:
        try:
            event = boundedjson.loads(line, check_nesting=self._check_nesting)
        except ValueError:
            logger.warning("%s: skipping a line that is not JSON: %.200r", self._description, line)
            return None
        if not isinstance(event, dict):
            logger.warning("%s: skipping a non-object event: %.200r", self._description, line)
            return None
        event_type = event.get("type")
        obj = event.get("object")
        if not isinstance(event_type, str) or not isinstance(obj, dict):
            logger.warning("%s: skipping a malformed event: %.200r", self._description, line)
            return None
        if event_type == "ERROR":
            raise _watch_error(obj)
        return event_type, obj


def _watch_error(status: JsonObject) -> ApiError:
    code = status.get("code")
    error = error_from_status(code if isinstance(code, int) and code > 0 else 500, status)
    if not isinstance(error, Gone) and status.get("reason") in ("Expired", "Gone"):
        return Gone(410, str(status.get("reason")), error.message, status)
    return error


def from_kubeconfig(
    path: str | None = None,
    context: str | None = None,
    qps: float = 20.0,
    burst: int = 30,
    *,
    pool_size: int = DEFAULT_POOL_SIZE,
    metrics: RestMetrics | None = None,
) -> KubeClient:
    """Explicit kubeconfig path, else in-cluster service account, else $KUBECONFIG / ~/.kube/config.

    qps/burst default to controller-runtime's 20/30. `pool_size` must cover every worker thread plus
    every open watch (each pins a connection) plus a few for leader election and events.
    """
    configuration = kubernetes.client.Configuration()
    if path is not None:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=configuration, persist_config=False
        )
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    else:
        default = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=default, context=context, client_configuration=configuration, persist_config=False
        )
    configuration.connection_pool_maxsize = pool_size
    api_client = kubernetes.client.ApiClient(configuration)
    api_client.user_agent = f"{contract.OPERATOR_NAME}/{_version()}"
    return KubeClient(api_client, qps, burst, metrics)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - only at start-up

    try:
        return version(contract.OPERATOR_NAME)
    except PackageNotFoundError:
        return "dev"
