"""A raw socket server that sends exactly the bytes a test scripts, over TCP or TLS, for the tests of the
operator's HTTP/1.1 client (controller/runtime/http11.py) and of the transport above it.

An HTTP server library would frame its answers itself; these tests need the framings an API server or a
proxy in front of one may send (and the broken ones), answers split across reads or packed into one,
connections closed at the worst moment and answers sent before the request's body was read.
"""

from __future__ import annotations

import fcntl
import socket
import ssl
import struct
import subprocess
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class _Script:
    answers: list[bytes]
    then_close: bool
    read_body: bool


class RawServer:
    """Accepts connections; each one is served by the next scripted handler, which gets the socket and
    the request bytes the client sent (up to the end of its head and any Content-Length body). With
    `tls`, connections are TLS (the server side of the context)."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._tls = tls
        self.requests: list[bytes] = []
        self.connections = 0
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._scripts: list[_Script] = []
        self.closed = threading.Semaphore(0)
        self._accepting.start()

    def script(self, *answers: bytes, then_close: bool = False, read_body: bool = True) -> None:
        """One connection's answers, one per request; then the server closes it (`then_close`) or
        waits for the client to. Without `read_body`, each answer is sent as soon as the request's head
        has arrived and the connection is closed with the body unread (as an API server refuses a body
        over its limit, or a proxy a request without credentials)."""
        self._scripts.append(_Script(list(answers), then_close or not read_body, read_body))

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            script = self._scripts.pop(0) if self._scripts else _Script([], False, True)
            thread = threading.Thread(target=self._serve, args=(conn, script), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket, script: _Script) -> None:
        try:
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)
            self._answer(conn, script)
        except OSError:
            pass  # the client went away (a test that ends the exchange itself)
        finally:
            conn.close()
            self.closed.release()

    def _answer(self, conn: socket.socket, script: _Script) -> None:
        buffer = b""
        for answer in script.answers:
            while b"\r\n\r\n" not in buffer:
                data = conn.recv(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            if not script.read_body:
                self.requests.append(head + b"\r\n\r\n")
                conn.sendall(answer)
                _close_write_and_wait(conn)
                return
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            while len(buffer) < length:
                buffer += conn.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + buffer[:length])
            buffer = buffer[length:]
            conn.sendall(answer)
        while not script.then_close and conn.recv(65536):
            pass  # held open until the client closes it

    def close(self) -> None:
        self._listener.close()


def _close_write_and_wait(conn: socket.socket, timeout: float = 10.0) -> None:
    """What an API server (Go's net/http) does before it closes a connection whose request body it did
    not read: it half-closes and waits, because closing a socket with unread data makes the kernel
    reset the connection at once, dropping an answer it has not sent yet. Here the wait ends when the
    client's kernel has acknowledged every byte of the answer (the send queue is empty), so the reset
    the close then causes never overtakes it."""
    conn.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + timeout
    while _unacknowledged(conn) and time.monotonic() < deadline:
        time.sleep(0.01)


def _unacknowledged(conn: socket.socket) -> int:
    """Bytes in the socket's send queue the peer has not acknowledged (Linux SIOCOUTQ)."""
    answer = fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    return int(struct.unpack("i", answer)[0])


def sent_by_http11(request: bytes) -> bool:
    """Whether a recorded request came from the operator's HTTP/1.1 client: urllib3 (through
    http.client) adds Accept-Encoding to every request, the HTTP/1.1 client does not."""
    return b"\r\naccept-encoding:" not in request.lower()


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with openssl (as the dev cluster makes its own)."""
    certificate, key = directory / "server.crt", directory / "server.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", str(key), "-out", str(certificate), "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return certificate, key


def server_context(certificate: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(certificate), str(key))
    return context
