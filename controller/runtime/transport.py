"""One HTTP exchange with the API server: credentials, the client-side QPS budget, the count per attempt.

Below `client.KubeClient` (which retries, encodes and decodes) and apart from it, so that the request
path's cost can be read in one place: a burst of creates spends much of the operator's CPU here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol
from urllib.parse import urlsplit

import kubernetes
import urllib3

from controller.runtime.errors import TransportError, error_from_status
from controller.runtime.ratelimit import TokenBucket
from controller.runtime.watch import TRANSPORT_EXCEPTIONS

TRANSPORT_ERROR_CODE: Final = "<error>"


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


class Connection:
    """HTTP exchanges with the API server over the official client's connection pool: credentials
    refreshed per request, the client-side QPS budget, and one count per attempt for
    rest_client_requests_total. An answer other than 2xx raises its ApiError, no answer TransportError."""

    def __init__(
        self, api_client: kubernetes.client.ApiClient, metrics: RestMetrics, bucket: TokenBucket | None
    ) -> None:
        self._api = api_client
        self.pool = api_client.rest_client.pool_manager
        self._base = str(api_client.configuration.host).rstrip("/")
        base = urlsplit(self._base)
        self.host: str = base.netloc or self._base
        # The API server's connection pool, looked up once: the manager's `request` parses the URL and
        # finds the pool again on every call, a few percent of the operator's CPU in a burst of
        # creates. A proxy manager rewrites every request, so it stays in the path.
        self._server: urllib3.HTTPConnectionPool | None = None
        self._prefix = base.path
        if type(self.pool) is urllib3.PoolManager and base.scheme in ("http", "https"):
            self._server = self.pool.connection_from_url(self._base)
        self._metrics = metrics
        self._bucket = bucket

    def close(self) -> None:
        """Drops pooled connections; a later request opens new ones."""
        self.pool.clear()
        if self._server is not None:
            self._server = self.pool.connection_from_url(self._base)

    def exchange(
        self,
        method: str,
        path_and_query: str,
        *,
        timeout: urllib3.Timeout,
        stream: bool,
        description: str,
        data: bytes | None = None,
        content_type: str | None = None,
        accept: str = "application/json",
    ) -> urllib3.BaseHTTPResponse:
        """One request; a `stream` answer is returned unread (the caller reads it and releases it)."""
        if self._bucket is not None:
            self._bucket.wait()
        headers = _headers(self._api, content_type)
        headers["Accept"] = accept
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
            self._metrics.request(TRANSPORT_ERROR_CODE, method, self.host)
            raise TransportError(f"{description}: {exc}") from exc
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
