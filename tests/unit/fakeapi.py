"""A scripted Kubernetes API server over real HTTP, so client and informer tests exercise real sockets.

Mocking the client's internals would test the mocks; the failure modes that matter (a watch that
stalls, a stream cut short, a 429 with Retry-After, a connection dropped without an answer) live in
the HTTP layer. Each test scripts the answers per `(method, path)` in order and reads back what the
client sent.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """A complete answer with a JSON (or raw) body."""

    status: int = 200
    body: JsonObject | bytes | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Stream:
    """A chunked watch answer: one JSON line per event, then either the end of the stream or a stall.

    A stalled stream keeps the connection open and sends nothing until the client goes away or the
    server is released (as a half-open connection or a silent API server would).
    """

    events: tuple[JsonObject | bytes, ...] = ()
    stall: bool = False


@dataclass(frozen=True)
class Drop:
    """Closes the connection without answering (a transport failure on the client side)."""


Answer = Reply | Stream | Drop


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") == "true"

    def json(self) -> Any:
        return json.loads(self.body)


def status(code: int, reason: str, message: str = "") -> JsonObject:
    """A metav1.Status body."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message or reason,
    }


def event(kind: str, obj: JsonObject) -> JsonObject:
    return {"type": kind, "object": obj}


class FakeApi:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._scripts: dict[tuple[str, str], deque[Answer]] = {}
        self._defaults: dict[tuple[str, str], Answer] = {}
        self._requests: list[Recorded] = []
        self._released = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _handler_for(self))
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.01,), name="fakeapi", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def script(self, method: str, path: str, *answers: Answer) -> None:
        """Queues answers for `(method, path)`, served once each in order."""
        with self._lock:
            self._scripts.setdefault((method, path), deque()).extend(answers)

    def default(self, method: str, path: str, answer: Answer) -> None:
        """The answer once the script for `(method, path)` is used up (else 404)."""
        with self._lock:
            self._defaults[(method, path)] = answer

    def requests(
        self,
        method: str | None = None,
        path: str | None = None,
        where: Callable[[Recorded], bool] | None = None,
    ) -> list[Recorded]:
        with self._lock:
            return self._matching(method, path, where)

    def _matching(
        self, method: str | None, path: str | None, where: Callable[[Recorded], bool] | None
    ) -> list[Recorded]:
        return [
            r
            for r in self._requests
            if (method is None or r.method == method)
            and (path is None or r.path == path)
            and (where is None or where(r))
        ]

    def wait_for_requests(
        self,
        count: int,
        method: str | None = None,
        path: str | None = None,
        where: Callable[[Recorded], bool] | None = None,
        timeout: float = 10.0,
    ) -> list[Recorded]:
        """Blocks until at least `count` matching requests arrived; fails the test on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                found = self._matching(method, path, where)
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"expected {count} requests to {method} {path}, got {len(found)}")
                self._lock.wait(remaining)

    def configuration(self) -> kubernetes.client.Configuration:
        configuration = kubernetes.client.Configuration()
        configuration.host = self.url
        configuration.api_key = {"authorization": "test-token"}
        configuration.api_key_prefix = {"authorization": "Bearer"}
        return configuration

    def api_client(self) -> kubernetes.client.ApiClient:
        return kubernetes.client.ApiClient(self.configuration())

    def _record_and_pick(self, recorded: Recorded) -> Answer:
        with self._lock:
            self._requests.append(recorded)
            self._lock.notify_all()
            key = (recorded.method, recorded.path)
            queue = self._scripts.get(key)
            if queue:
                return queue.popleft()
            default = self._defaults.get(key)
        if default is not None:
            return default
        return Reply(404, status(404, "NotFound", f"no script for {recorded.method} {recorded.path}"))


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that closes a kept-alive or watch connection is normal here, not worth a traceback.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _handler_for(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_GET(self) -> None:
            self._serve()

        def do_POST(self) -> None:
            self._serve()

        def do_PUT(self) -> None:
            self._serve()

        def do_PATCH(self) -> None:
            self._serve()

        def do_DELETE(self) -> None:
            self._serve()

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            split = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
            recorded = Recorded(self.command, split.path, query, dict(self.headers.items()), body)
            answer = api._record_and_pick(recorded)
            try:
                if isinstance(answer, Drop):
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                elif isinstance(answer, Reply):
                    self._reply(answer)
                else:
                    self._stream(answer)
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.close_connection = True

        def _reply(self, answer: Reply) -> None:
            payload = (
                answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body or {}).encode()
            )
            if answer.body is None:
                payload = b""
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def _stream(self, answer: Stream) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for item in answer.events:
                line = item if isinstance(item, bytes) else json.dumps(item).encode() + b"\n"
                self._chunk(line)
            if answer.stall:
                self._hold()
                self.close_connection = True
                return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _hold(self) -> None:
            while not api._released.wait(0.02):
                if _peer_gone(self.connection):
                    return

    return Handler


def _peer_gone(conn: socket.socket) -> bool:
    readable, _, _ = select.select([conn], [], [], 0)
    if not readable:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


@contextmanager
def running() -> Iterator[FakeApi]:
    api = FakeApi()
    api.start()
    try:
        yield api
    finally:
        api.stop()


def items_list(
    items: Iterable[JsonObject], resource_version: str, continue_: str | None = None
) -> JsonObject:
    metadata: JsonObject = {"resourceVersion": resource_version}
    if continue_:
        metadata["continue"] = continue_
    return {"kind": "List", "apiVersion": "v1", "metadata": metadata, "items": list(items)}
