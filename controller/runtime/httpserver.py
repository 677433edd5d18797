"""A small HTTP/1.1 server whose cost a client cannot grow: a cap on concurrent connections, deadlines
on every read and write, and TLS negotiated off the accept loop.

Why: the standard library's ThreadingHTTPServer starts a thread per connection, without limit, and
its socket timeout restarts with every byte received, so a flood of idle (or byte-dribbling)
connections holds threads and memory for as long as the clients like, and a TLS client that never
finishes its handshake would stall the accept loop if the handshake ran there. The operator's
endpoints (controller/runtime/serving.py) are served by this instead:

- at most `Limits.max_connections` connections are served at once; the one past the cap is closed at
  once (a plain-HTTP client first gets a 503), so threads and buffers stay bounded;
- a new connection has `request_head_timeout` seconds, TLS handshake included, to send a complete
  request line and headers, of at most `max_head_bytes`; after a response, a kept-alive connection
  has `idle_timeout` seconds for the next request's head; a response must be written within
  `write_timeout`. These are deadlines for the whole step, not per byte, and a bound on the head's
  size (controller-runtime's servers set Go's ReadHeaderTimeout, IdleTimeout and MaxHeaderBytes for
  the same reasons);
- TLS (an `ssl.SSLContext` from a callable, so a rotated certificate is picked up by the next
  connection) is negotiated in the connection's own thread, under the request-head deadline.

Handlers are plain functions from a `Request` to a `Response`; this module knows nothing of metrics
or probes. `parse_address` reads Go-style listen addresses.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, cast
from urllib.parse import parse_qs, urlsplit

logger = logging.getLogger(__name__)

# Bytes handed to the socket per send: a deadline is checked between chunks.
_WRITE_CHUNK: Final = 64 * 1024
# How often a server at its cap says so in the log, at most.
_REFUSAL_LOG_INTERVAL: Final = 60.0
_BUSY: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 26\r\nConnection: close\r\n\r\ntoo many open connections\n"
)


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


@dataclass(frozen=True)
class Limits:
    """What one client may cost the server (see the module's docstring)."""

    max_connections: int = 64
    request_head_timeout: float = 10.0
    idle_timeout: float = 60.0
    write_timeout: float = 30.0
    # A request's line and headers together (a bearer token is 1 to 2 KB); a longer head closes the
    # connection. The standard library alone would read 100 header lines of 64 KB each.
    max_head_bytes: int = 64 * 1024


@dataclass(frozen=True)
class Request:
    """One request as a handler sees it: the method, the path without its trailing slash, the query."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)
    # Close the connection after this response (e.g. a client that failed to authenticate gets no
    # kept-alive connection to hold).
    close: bool = False


Handler = Callable[[Request], Response]
TlsContext = Callable[[], ssl.SSLContext]


class _Deadline:
    """The moment the current step of a connection (a head to read, a response to write) must end."""

    def __init__(self) -> None:
        self.at = math.inf

    def start(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def remaining(self) -> float | None:
        """Seconds left (None: no deadline yet); TimeoutError once it has passed."""
        if self.at == math.inf:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left


class HeadTooLarge(OSError):
    """A request's head went past `Limits.max_head_bytes`."""


class _DeadlineReader(io.RawIOBase):
    """Socket reads under the connection's deadline (each recv may wait only for what is left of it)
    and within a budget of bytes (`budget`, set for each request's head)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline
        self.budget = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.budget <= 0:
            raise HeadTooLarge("request head too large")
        self._sock.settimeout(self._deadline.remaining())
        received = self._sock.recv_into(memoryview(buffer).cast("B")[: self.budget])
        self.budget -= received
        return received


class _DeadlineWriter(io.BufferedIOBase):
    """Socket writes under the connection's deadline, in chunks so that a slow reader cannot stretch it."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _WRITE_CHUNK):
            self._sock.settimeout(self._deadline.remaining())
            self._sock.sendall(view[start : start + _WRITE_CHUNK])
        return len(view)


class _ConnectionHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "trainingjob-operator"

    def setup(self) -> None:
        self.connection = self.request
        self.deadline = cast(_BoundedServer, self.server).first_deadline()
        self.served = 0
        self.reader = _DeadlineReader(self.connection, self.deadline)
        self.rfile = io.BufferedReader(self.reader)
        self.wfile = _DeadlineWriter(self.connection, self.deadline)

    def finish(self) -> None:
        self.rfile.close()

    def log_message(self, format: str, *args: Any) -> None:
        return None  # probes and scrapes would flood the log

    def handle_one_request(self) -> None:
        server = cast(_BoundedServer, self.server)
        if self.served:
            self.deadline.start(server.limits.idle_timeout)
        self.reader.budget = server.limits.max_head_bytes
        try:
            self.raw_requestline = self.rfile.readline(65537)
            if len(self.raw_requestline) > 65536:
                self.requestline = self.request_version = self.command = ""
                self.send_error(414)
                return
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():
                return
        except (TimeoutError, OSError):
            self.close_connection = True
            return
        self.served += 1
        if self.command not in ("GET", "HEAD"):
            self.send_error(405, explain="only GET and HEAD")
            return
        split = urlsplit(self.path)
        request = Request(
            method=self.command,
            path=split.path.rstrip("/") or "/",
            query=parse_qs(split.query, keep_blank_values=True),
            headers={name.lower(): value for name, value in self.headers.items()},
        )
        try:
            response = server.handler(request)
        except Exception:
            logger.exception("%s: handling %s failed", server.name, request.path)
            response = Response(500, b"internal error\n")
        self._send(response)

    def _send(self, response: Response) -> None:
        self.deadline.start(cast(_BoundedServer, self.server).limits.write_timeout)
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in response.headers.items():
            self.send_header(name, value)
        if response.close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)


class _BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        *,
        name: str,
        handler: Handler,
        limits: Limits,
        tls: TlsContext | None,
        dual_stack: bool,
    ) -> None:
        self.name = name
        self.handler = handler
        self.limits = limits
        self._tls = tls
        self._dual_stack = dual_stack
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.refused = 0
        self._refused_since_log = 0
        self._last_refusal_log = -math.inf
        self._local = threading.local()
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _ConnectionHandler)

    def server_bind(self) -> None:
        if self._dual_stack:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        # HTTPServer.server_bind would resolve our own name (socket.getfqdn), a DNS lookup that can hang.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._open)

    def first_deadline(self) -> _Deadline:
        """The deadline of a connection's first request head, which began at its accept."""
        return cast(_Deadline, self._local.deadline)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Runs in the accept loop: a connection past the cap is turned away here, at once."""
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            return
        with self._lock:
            self._open.add(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(request, request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Runs in the connection's thread: the TLS handshake, then requests until the client is done."""
        deadline = _Deadline()
        deadline.start(self.limits.request_head_timeout)
        self._local.deadline = deadline
        connection = request
        try:
            if self._tls is not None:
                connection = self._handshake(request, deadline)
                if connection is None:
                    return
            super().process_request_thread(connection, client_address)
        finally:
            self._release(request, connection)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that broke mid-request (reset, TLS alert, deadline) is the client's business."""
        logger.debug("%s: connection from %s ended with an error", self.name, client_address, exc_info=True)

    def _handshake(self, request: socket.socket, deadline: _Deadline) -> ssl.SSLSocket | None:
        assert self._tls is not None
        wrapped: ssl.SSLSocket | None = None
        try:
            request.settimeout(deadline.remaining())
            wrapped = self._tls().wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            with self._lock:
                self._open.discard(request)
                self._open.add(wrapped)
            wrapped.settimeout(deadline.remaining())
            wrapped.do_handshake()
        except (OSError, ValueError) as error:
            logger.debug("%s: TLS handshake failed: %s", self.name, error)
            self.shutdown_request(request if wrapped is None else wrapped)
            if wrapped is not None:
                with self._lock:
                    self._open.discard(wrapped)
            return None
        return wrapped

    def _release(self, request: socket.socket, connection: socket.socket) -> None:
        with self._lock:
            self._open.discard(request)
            self._open.discard(connection)
        self._slots.release()

    def _refuse(self, request: socket.socket) -> None:
        with self._lock:
            self.refused += 1
            self._refused_since_log += 1
            now = time.monotonic()
            count = self._refused_since_log
            if now - self._last_refusal_log >= _REFUSAL_LOG_INTERVAL:
                self._refused_since_log, self._last_refusal_log = 0, now
            else:
                count = 0
        if self._tls is None:
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(_BUSY)
        self.shutdown_request(request)
        if count:
            logger.warning(
                "%s: %d connection(s) refused: %d are open, the most it serves at once",
                self.name,
                count,
                self.limits.max_connections,
                extra={"refused": count, "max_connections": self.limits.max_connections},
            )

    def close_open_connections(self) -> None:
        with self._lock:
            connections = list(self._open)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class HttpServer:
    """One listening socket served from a daemon thread by `handler`, within `limits`, HTTPS when `tls`
    gives a context. `start()` binds (an OSError says why it cannot) and returns the bound port."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        handler: Handler,
        *,
        limits: Limits = Limits(),
        tls: TlsContext | None = None,
    ) -> None:
        self.name = name
        self.host = host
        self.handler = handler
        self.limits = limits
        self.tls = tls
        self._requested_port = port
        # Where it listens once started ("::" or "0.0.0.0" for every interface).
        self.bound_host = host
        self._server: _BoundedServer | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        """The bound port once started (the requested one before)."""
        with self._lock:
            return self._server.server_port if self._server is not None else self._requested_port

    @property
    def address(self) -> str:
        """host:port it listens on, for the log."""
        host = self.bound_host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def active_connections(self) -> int:
        """Connections being served now (each holds one thread)."""
        with self._lock:
            return self._server.active if self._server is not None else 0

    @property
    def refused_connections(self) -> int:
        """Connections turned away because `limits.max_connections` were open."""
        with self._lock:
            return self._server.refused if self._server is not None else 0

    def start(self) -> int:
        """Binds and serves; the bound port (useful with port 0). The caller says so in the log."""
        with self._lock:
            if self._server is not None:
                return self._server.server_port
            host = self.host
            dual_stack = False
            if not host:
                dual_stack = socket.has_dualstack_ipv6()
                host = "::" if dual_stack else "0.0.0.0"  # noqa: S104 - ":port" means every interface
            server = _BoundedServer(
                (host, self._requested_port),
                name=self.name,
                handler=self.handler,
                limits=self.limits,
                tls=self.tls,
                dual_stack=dual_stack,
            )
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.2}, name=self.name, daemon=True
            )
            thread.start()
            self._server, self._thread = server, thread
            self.bound_host = host
            return server.server_port

    def stop(self, timeout: float = 5.0) -> None:
        """Stops accepting, closes the listening socket and ends the connections being served."""
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.close_open_connections()
        if thread is not None:
            thread.join(timeout)
