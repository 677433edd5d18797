"""One HTTP exchange with the API server: credentials, the client-side QPS budget, the count per attempt.

Below `client.KubeClient` (which retries, encodes and decodes) and apart from it, so that the request
path's cost can be read in one place: a burst of creates spends much of the operator's CPU here.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from importlib.metadata import version
from typing import Final, Protocol
from urllib.parse import urlsplit

import kubernetes
import urllib3

from controller.runtime import borrowed, http11
from controller.runtime.errors import TransportError, error_from_status
from controller.runtime.ratelimit import TokenBucket
from controller.runtime.watch import TRANSPORT_EXCEPTIONS

logger = logging.getLogger(__name__)

TRANSPORT_ERROR_CODE: Final = "<error>"
# Pool size when the configuration does not say: a handful of workers, informer watches, a lease.
DEFAULT_POOL_SIZE: Final = 16


class RestMetrics(Protocol):
    """Receives one call per HTTP attempt, like client-go's rest_client_requests_total."""

    def request(self, code: str, method: str, host: str) -> None: ...


class NoMetrics:
    """Counts nothing (a client built without metrics)."""

    def request(self, code: str, method: str, host: str) -> None:
        return None


def _headers(api_client: kubernetes.client.ApiClient, content_type: str | None) -> dict[str, str]:
    headers: dict[str, str] = {str(k): str(v) for k, v in api_client.default_headers.items()}
    headers["Accept"] = "application/json"
    if content_type is not None:
        headers["Content-Type"] = content_type
    # auth_settings() runs the configuration's refresh hook, so rotated service-account tokens and
    # exec-plugin credentials are picked up per request, as in the official client.
    for setting in api_client.configuration.auth_settings().values():
        if setting.get("in") == "header" and setting.get("value"):
            headers[str(setting["key"])] = str(setting["value"])
    return headers


# The urllib3 pools whose connections were found unusable and said so in the log: clients built on one
# official client share its pool, and the operator builds three.
_REPORTED: Final[weakref.WeakSet[urllib3.HTTPConnectionPool]] = weakref.WeakSet()


def _http11_pool(server: urllib3.HTTPConnectionPool, host: str, maxsize: int) -> http11.ConnectionPool | None:
    """The HTTP/1.1 client's pool over connections `server` opens; None (logged) when they cannot be
    borrowed."""
    try:
        opener = borrowed.opener(server)
    except borrowed.Unsupported as reason:
        if server not in _REPORTED:
            _REPORTED.add(server)
            logger.warning(
                "API requests go through urllib3 (more CPU per request): the operator's HTTP/1.1 client "
                "cannot use urllib3 %s's connections here: %s",
                version("urllib3"),
                reason,
            )
        return None
    return http11.ConnectionPool(opener, host, maxsize)


class Connection:
    """HTTP exchanges with the API server: credentials refreshed per request, the client-side QPS
    budget, and one count per attempt for rest_client_requests_total. An answer other than 2xx raises
    its ApiError, no answer TransportError.

    Requests and streams (watches, logs) go through `http11.ConnectionPool`, over connections that the
    official client's urllib3 pool opens (TLS from the kubeconfig). They go through urllib3 instead
    with `fast_http_client` False (the operator's --fast-http-client=false), when urllib3's connections
    cannot be borrowed (checked here, see borrowed.py), and through a kubeconfig's proxy, where the
    official client's proxy manager rewrites every request.
    """

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        metrics: RestMetrics,
        bucket: TokenBucket | None,
        *,
        fast_http_client: bool = True,
    ) -> None:
        self._api = api_client
        self.pool = api_client.rest_client.pool_manager
        self._base = str(api_client.configuration.host).rstrip("/")
        base = urlsplit(self._base)
        self.host: str = base.netloc or self._base
        self._prefix = base.path
        # The API server's urllib3 pool, looked up once (the manager's `request` parses the URL and
        # finds the pool again on every call).
        self._server: urllib3.HTTPConnectionPool | None = None
        self._direct: http11.ConnectionPool | None = None
        if type(self.pool) is urllib3.PoolManager and base.scheme in ("http", "https"):
            self._server = self.pool.connection_from_url(self._base)
            if fast_http_client:
                maxsize = api_client.configuration.connection_pool_maxsize or DEFAULT_POOL_SIZE
                self._direct = _http11_pool(self._server, self.host.rpartition("@")[2], int(maxsize))
        self._metrics = metrics
        self._bucket = bucket

    def close(self) -> None:
        """Drops pooled connections; a later request opens new ones."""
        self.pool.clear()
        if self._server is not None:
            self._server = self.pool.connection_from_url(self._base)
        if self._direct is not None:
            self._direct.clear()

    def exchange(
        self,
        method: str,
        path_and_query: str,
        *,
        timeout: urllib3.Timeout,
        description: str,
        data: bytes | None = None,
        content_type: str | None = None,
    ) -> bytes:
        """One complete request; returns the body of a 2xx answer."""
        headers = self._prepare(content_type, "application/json")
        if self._direct is None:
            response = self._urllib3(
                method, path_and_query, headers=headers, data=data, timeout=timeout, description=description
            )
            return response.data or b""
        try:
            answer = self._direct.request(method, self._prefix + path_and_query, headers, data, timeout)
        except TRANSPORT_EXCEPTIONS as exc:
            raise self._no_answer(method, description, exc) from exc
        self._metrics.request(str(answer.status), method, self.host)
        if not 200 <= answer.status < 300:
            raise error_from_status(answer.status, answer.body, answer.headers.get("retry-after"))
        return answer.body

    def open_stream(
        self, path_and_query: str, *, timeout: urllib3.Timeout, description: str, accept: str
    ) -> http11.StreamingAnswer:
        """A GET whose 2xx answer is returned unread (the caller reads it and releases it)."""
        headers = self._prepare(None, accept)
        if self._direct is None:
            return self._urllib3(
                "GET",
                path_and_query,
                headers=headers,
                data=None,
                timeout=timeout,
                description=description,
                stream=True,
            )
        try:
            stream = self._direct.open(self._prefix + path_and_query, headers, timeout)
        except TRANSPORT_EXCEPTIONS as exc:
            raise self._no_answer("GET", description, exc) from exc
        self._metrics.request(str(stream.status), "GET", self.host)
        if 200 <= stream.status < 300:
            return stream
        try:
            payload = stream.read()
        except TRANSPORT_EXCEPTIONS:
            payload = b""
        finally:
            stream.close()
        raise error_from_status(stream.status, payload, stream.headers.get("retry-after"))

    def _no_answer(self, method: str, description: str, exc: BaseException) -> TransportError:
        self._metrics.request(TRANSPORT_ERROR_CODE, method, self.host)
        return TransportError(f"{description}: {str(exc) or type(exc).__name__}")

    def _prepare(self, content_type: str | None, accept: str) -> dict[str, str]:
        if self._bucket is not None:
            self._bucket.wait()
        headers = _headers(self._api, content_type)
        headers["Accept"] = accept
        return headers

    def _urllib3(
        self,
        method: str,
        path_and_query: str,
        *,
        headers: dict[str, str],
        data: bytes | None,
        timeout: urllib3.Timeout,
        description: str,
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        send: Callable[..., urllib3.BaseHTTPResponse]
        if self._server is not None:
            send, url = self._server.urlopen, self._prefix + path_and_query
        else:
            send, url = self.pool.urlopen, self._base + path_and_query
        try:
            response = send(
                method,
                url,
                body=data,
                headers=headers,
                timeout=timeout,
                retries=False,
                redirect=False,
                preload_content=not stream,
                release_conn=not stream,
            )
        except TRANSPORT_EXCEPTIONS as exc:
            raise self._no_answer(method, description, exc) from exc
        status = int(response.status)
        self._metrics.request(str(status), method, self.host)
        if not 200 <= status < 300:
            try:
                payload = response.data if not stream else response.read()
            except TRANSPORT_EXCEPTIONS:
                payload = b""
            finally:
                if stream:
                    response.release_conn()
            raise error_from_status(status, payload or b"", response.headers.get("Retry-After"))
        return response
