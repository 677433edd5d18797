"""What one client may cost the operator's HTTP servers (controller/runtime/httpserver.py): a connection
past the cap is turned away at once and a freed slot serves again; an idle connection, a request head
sent a byte at a time, a kept-alive connection that sends nothing more and a client that never reads
its answer are each closed at their deadline; a TLS client that never finishes its handshake holds
its own connection only; a failing handler is a 500, a method other than GET or HEAD a 405, and stop
ends the connections being served.

Why: before, every connection got a thread without limit and a read timeout that restarted with each
byte, so a flood of idle connections to the metrics port could hold threads and memory for good. The
tests wait for the server's condition with deadlines (tests.cluster.wait_for); the short limits make
them quick, no assertion is about how long anything took.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from controller.runtime.httpserver import Handler, HttpServer, Limits, Request, Response
from controller.runtime.servingcert import ServingCertificate
from testbed import wait_for

# What a test allows a server to take before it counts as a failure (not what it should take).
PATIENCE = 30.0
SLOW = Limits(max_connections=3, request_head_timeout=PATIENCE, idle_timeout=PATIENCE, write_timeout=PATIENCE)


def hello(request: Request) -> Response:
    return Response(200, f"hello {request.path}\n".encode())


@contextmanager
def serving(
    handler: Handler = hello, limits: Limits = SLOW, tls: ServingCertificate | None = None
) -> Iterator[HttpServer]:
    server = HttpServer(
        "test-server", "127.0.0.1", 0, handler, limits=limits, tls=tls.context if tls else None
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def connect(server: HttpServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=PATIENCE)


def get(server: HttpServer, path: str = "/ok") -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=PATIENCE) as response:
        return response.status, response.read()


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    chunks = []
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def active(server: HttpServer, count: int) -> bool:
    return server.active_connections == count


def test_a_connection_past_the_cap_is_refused_and_a_freed_slot_serves_again() -> None:
    with serving() as server, ExitStack() as stack:
        idle = [stack.enter_context(connect(server)) for _ in range(3)]
        wait_for("3 connections served", lambda: active(server, 3), timeout=PATIENCE, interval=0.01)
        with connect(server) as extra:
            answer = read_to_end(extra)
        assert answer.startswith(b"HTTP/1.1 503 Service Unavailable\r\n"), answer
        assert answer.endswith(b"too many open connections\n")
        assert server.refused_connections == 1
        assert server.active_connections == 3
        idle[0].close()
        wait_for("a slot freed", lambda: active(server, 2), timeout=PATIENCE, interval=0.01)
        assert get(server) == (200, b"hello /ok\n")
        assert server.refused_connections == 1


def test_a_refusal_is_logged_once_with_the_cap(caplog: pytest.LogCaptureFixture) -> None:
    limits = Limits(max_connections=1, request_head_timeout=PATIENCE)
    with serving(limits=limits) as server, connect(server):
        wait_for("1 connection served", lambda: active(server, 1), timeout=PATIENCE, interval=0.01)
        for _ in range(3):
            with connect(server) as extra:
                read_to_end(extra)
        assert server.refused_connections == 3
    refusals = [record.getMessage() for record in caplog.records if "refused" in record.getMessage()]
    assert refusals == ["test-server: 1 connection(s) refused: 1 are open, the most it serves at once"]


def test_a_connection_that_sends_nothing_is_closed_at_the_head_deadline() -> None:
    with serving(limits=Limits(request_head_timeout=0.2)) as server, connect(server) as idle:
        assert read_to_end(idle) == b""
        wait_for("the connection released", lambda: active(server, 0), timeout=PATIENCE, interval=0.01)


def test_a_head_sent_a_byte_at_a_time_does_not_outlive_its_deadline() -> None:
    """Each byte restarted the old server's timeout; the deadline is for the whole head."""
    with serving(limits=Limits(request_head_timeout=0.5)) as server, connect(server) as dribbler:
        dribbler.sendall(b"GET /ok HTTP/1.1\r\n")
        closed = False
        deadline = time.monotonic() + PATIENCE
        while not closed and time.monotonic() < deadline:
            try:
                dribbler.sendall(b"X")
            except OSError:
                break
            # Waits for the server to close (readable at EOF), a byte's worth at most.
            readable, _, _ = select.select([dribbler], [], [], 0.05)
            closed = bool(readable)
        assert read_to_end(dribbler) == b""
        assert server.active_connections == 0 or wait_for(
            "the connection released", lambda: active(server, 0), timeout=PATIENCE, interval=0.01
        )


def test_a_request_head_past_the_limit_closes_the_connection_unanswered() -> None:
    """100 header lines of 1 KB: what the standard library allows (100 of 64 KB), past the limit."""
    served: list[str] = []

    def record(request: Request) -> Response:
        served.append(request.path)
        return hello(request)

    with serving(record, Limits(request_head_timeout=PATIENCE, max_head_bytes=16 * 1024)) as server:
        with connect(server) as client:
            headers = "".join(f"X-Padding-{number}: {'x' * 1000}\r\n" for number in range(100))
            with contextlib.suppress(OSError):  # the server may close while the head is still sent
                client.sendall(f"GET /big HTTP/1.1\r\nHost: test\r\n{headers}\r\n".encode())
            assert read_to_end(client) == b""
        assert get(server, "/small") == (200, b"hello /small\n")
    assert served == ["/small"]


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout() -> None:
    with serving(limits=Limits(request_head_timeout=PATIENCE, idle_timeout=0.2)) as server:
        with connect(server) as client:
            client.sendall(b"GET /first HTTP/1.1\r\nHost: test\r\n\r\n")
            answer = read_to_end(client)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert answer.endswith(b"hello /first\n")


def test_a_client_that_never_reads_its_answer_is_dropped_at_the_write_deadline() -> None:
    # More than the server's send buffer and the client's receive buffer hold together.
    big = b"x" * (16 * 1024 * 1024)

    def large(request: Request) -> Response:
        return Response(200, big)

    limits = Limits(request_head_timeout=PATIENCE, write_timeout=0.3)
    with serving(large, limits) as server, socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", server.port))
        client.sendall(b"GET /big HTTP/1.1\r\nHost: test\r\n\r\n")
        wait_for("the connection released", lambda: active(server, 0), timeout=PATIENCE, interval=0.01)


def test_a_failing_handler_is_a_500_and_other_methods_are_405() -> None:
    def broken(request: Request) -> Response:
        raise RuntimeError("boom")

    with serving(broken) as server:
        with pytest.raises(urllib.error.HTTPError) as failed:
            get(server)
        assert failed.value.code == 500
        failed.value.close()
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/ok", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=PATIENCE)  # noqa: S310
        assert refused.value.code == 405
        refused.value.close()


def test_stop_ends_the_connections_being_served() -> None:
    server = HttpServer("test-server", "127.0.0.1", 0, hello, limits=SLOW)
    server.start()
    with connect(server) as idle:
        wait_for("1 connection served", lambda: active(server, 1), timeout=PATIENCE, interval=0.01)
        server.stop()
        assert read_to_end(idle) == b""


# ---- TLS ------------------------------------------------------------------------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> ServingCertificate:
    return ServingCertificate.generate(["localhost", "127.0.0.1"], scratch=tmp_path)


def https_get(server: HttpServer, certificate: ServingCertificate, path: str = "/ok") -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(certificate.cert))
    url = f"https://127.0.0.1:{server.port}{path}"
    with urllib.request.urlopen(url, timeout=PATIENCE, context=context) as response:
        return response.status, response.read()


def test_https_with_the_self_signed_certificate(certificate: ServingCertificate) -> None:
    with serving(tls=certificate) as server:
        assert server.scheme == "https"
        assert https_get(server, certificate) == (200, b"hello /ok\n")
        with connect(server) as plain:
            plain.sendall(b"GET /ok HTTP/1.1\r\nHost: test\r\n\r\n")
            assert b"hello" not in read_to_end(plain)


def test_a_stalled_tls_handshake_holds_only_its_own_connection(certificate: ServingCertificate) -> None:
    """The handshake runs in the connection's thread: the accept loop keeps serving others."""
    limits = Limits(max_connections=3, request_head_timeout=0.5)
    with serving(tls=certificate, limits=limits) as server, connect(server) as stalled:
        wait_for("the stalled connection served", lambda: active(server, 1), timeout=PATIENCE, interval=0.01)
        done = threading.Event()
        answers: list[tuple[int, bytes]] = []

        def other() -> None:
            answers.append(https_get(server, certificate))
            done.set()

        threading.Thread(target=other, daemon=True).start()
        assert done.wait(PATIENCE)
        assert answers == [(200, b"hello /ok\n")]
        assert read_to_end(stalled) == b""
