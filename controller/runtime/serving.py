"""The operator's HTTP endpoints: /metrics for Prometheus, /healthz (alias /livez) and /readyz for the
kubelet's probes, served from one daemon thread.

Probes answer like Kubernetes components: 200 "ok", or 503 with the failing checks' reasons, and
`?verbose` lists every check. /metrics speaks the text and OpenMetrics formats (content negotiation),
gzip when asked, and `name[]` filters.

Listening address: `parse_address` reads Go-style `host:port` strings. An empty host (":8080") means
every interface, like Go's `net.Listen`, which is what the operator needs inside a cluster so that
Prometheus can scrape the pod IP; "127.0.0.1:8080" listens on loopback only, which is what local
development uses.
"""

from __future__ import annotations

import gzip
import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

Check = Callable[[], tuple[bool, str]]


def parse_address(text: str) -> tuple[str, int]:
    """Parses a Go-style listen address: "host:port", "[ipv6]:port" or ":port".

    An empty host means every interface (IPv4 and, where available, IPv6), like Go's net.Listen; use
    "127.0.0.1:port" to listen on loopback only. Port 0 asks the kernel for a free port.
    """
    host, separator, port_text = text.strip().rpartition(":")
    if not separator:
        raise ValueError(f"invalid listen address {text!r}: expected host:port or :port")
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            raise ValueError(f"invalid listen address {text!r}: unbalanced brackets")
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"invalid listen address {text!r}: write IPv6 addresses as [address]:port")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"invalid listen address {text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"invalid listen address {text!r}: port must be between 0 and 65535")
    return host, port


def _normalise_checks(checks: Check | Mapping[str, Check], default_name: str) -> dict[str, Check]:
    if callable(checks):
        return {default_name: checks}
    return dict(checks)


def _run_check(check: Check) -> tuple[bool, str]:
    try:
        ok, reason = check()
    except Exception as exc:
        logger.exception("health check raised")
        return False, f"check raised {type(exc).__name__}: {exc}"
    return bool(ok), str(reason)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: MetricsServer, *, dual_stack: bool) -> None:
        self.app = app
        self._dual_stack = dual_stack
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        if self._dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # HTTPServer.server_bind would resolve our own name (socket.getfqdn), a DNS lookup that can hang.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "trainingjob-operator"
    # Idle keep-alive connections are closed after this many seconds.
    timeout = 60

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        app = cast(_HttpServer, self.server).app
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        query = parse_qs(split.query, keep_blank_values=True)
        if path == "/metrics":
            self._metrics(app, query)
        elif path in ("/healthz", "/livez"):
            self._checks("healthz", app.health_checks, query)
        elif path == "/readyz":
            self._checks("readyz", app.ready_checks, query)
        else:
            self._send(404, b"404 page not found\n")

    def _metrics(self, app: MetricsServer, query: dict[str, list[str]]) -> None:
        try:
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            registry: Collector = app.registry
            names = query.get("name[]")
            if names:
                registry = app.registry.restricted_registry(names)
            body = encoder(registry)
        except Exception:
            logger.exception("rendering metrics failed")
            self._send(500, b"rendering metrics failed\n")
            return
        headers = {}
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, content_type, headers)

    def _checks(self, endpoint: str, checks: Mapping[str, Check], query: dict[str, list[str]]) -> None:
        results = {name: _run_check(check) for name, check in checks.items()}
        healthy = all(ok for ok, _ in results.values())
        if "verbose" in query:
            lines = ["[+]ping ok"]
            for name, (ok, reason) in results.items():
                lines.append(f"[+]{name} ok" if ok else f"[-]{name} failed: {reason}")
            lines.append(f"{endpoint} check {'passed' if healthy else 'failed'}")
            self._send(200 if healthy else 503, ("\n".join(lines) + "\n").encode())
            return
        if healthy:
            self._send(200, b"ok")
            return
        failed = [(name, reason) for name, (ok, reason) in results.items() if not ok]
        if len(results) == 1:
            text = failed[0][1]
        else:
            text = "\n".join(f"{name}: {reason}" for name, reason in failed)
        self._send(503, (text + "\n").encode())

    def _send(
        self,
        code: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)


class MetricsServer:
    """Serves /metrics, /healthz (alias /livez) and /readyz from a daemon thread.

    `ready` and `healthy` are checks returning `(ok, reason)`, or mappings of named checks; /readyz and
    /healthz answer 200 "ok", or 503 with the failing reasons; `?verbose` lists every check the way
    Kubernetes components do. Request logging is off (probes would flood the logs).
    """

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        *,
        ready: Check | Mapping[str, Check],
        healthy: Check | Mapping[str, Check],
    ) -> None:
        self.host = host
        self.registry = registry
        self.ready_checks = _normalise_checks(ready, "ready")
        self.health_checks = _normalise_checks(healthy, "healthy")
        self._requested_port = port
        self._server: _HttpServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def add_ready_check(self, name: str, check: Check) -> None:
        """Adds a readiness check (e.g. a cache started after the server); requests see all or none."""
        self.ready_checks = {**self.ready_checks, name: check}

    def remove_ready_check(self, name: str) -> None:
        """Drops a readiness check (e.g. of a cache stopped because its API went away)."""
        self.ready_checks = {key: check for key, check in self.ready_checks.items() if key != name}

    @property
    def port(self) -> int:
        """The bound port once started (the requested one before)."""
        with self._lock:
            return self._server.server_port if self._server is not None else self._requested_port

    def start(self) -> int:
        """Binds and starts serving; returns the bound port (useful with port 0)."""
        with self._lock:
            if self._server is not None:
                return self._server.server_port
            host = self.host
            dual_stack = False
            if not host:
                dual_stack = socket.has_dualstack_ipv6()
                host = "::" if dual_stack else "0.0.0.0"  # noqa: S104 - ":port" means every interface
            server = _HttpServer((host, self._requested_port), self, dual_stack=dual_stack)
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="metrics-server", daemon=True
            )
            thread.start()
            self._server, self._thread = server, thread
            logger.info(
                "serving metrics and health checks",
                extra={"address": f"{host}:{server.server_port}"},
            )
            return server.server_port

    def stop(self, timeout: float = 5.0) -> None:
        """Stops accepting requests and closes the listening socket."""
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout)
