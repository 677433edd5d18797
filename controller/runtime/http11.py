"""A small HTTP/1.1 client for the API server: requests, and answers read as they arrive (watches, logs).

A bring-up of 500 jobs sends about 5,000 requests, and through urllib3 and http.client each one cost
the operator 230 to 500 us of CPU (header objects, `email` parsing of the answer's head, per-request
pool bookkeeping), a quarter of its CPU in all. An exchange here writes the request in one `sendall`,
reads the answer 64 KB at a time and parses only what an API client needs (the status, the framing,
`Retry-After`), at about a third of the cost. A watch reads its events the same way, all that have
arrived in one read, instead of a chunk at a time through http.client's buffered reader.

Connections are urllib3's: the official client's connection pool opens them (TLS from the kubeconfig:
CA, client certificate, server name, verification), so this module never configures TLS itself;
borrowed.py checks at start-up that they can be borrowed, and the transport takes urllib3's own path
when they cannot, or when the operator runs with --fast-http-client=false. This module keeps the opened
sockets in its own small pool, like urllib3's: the last returned is reused first, a kept-alive
connection the server has closed (or sent anything on) is dropped before it is reused, at most
`maxsize` idle ones are kept. Nothing is retried here; the caller's retry policy decides.

The framing is RFC 9112's for a user agent: chunked frames the body only as the last transfer coding
(else the body ends with the connection); with Content-Length beside Transfer-Encoding, the latter
wins and the connection is not reused. An answer the server sent before it stopped reading the
request's body (a 413 for a body too large) is read, as urllib3 reads it. The heads themselves are
written and read by http11_heads.py.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import urllib3
from urllib3.util.wait import wait_for_read

from controller.runtime.http11_heads import ProtocolError, parse_head, request_head, transfer_codings

if TYPE_CHECKING:  # a Protocol urllib3 defines for type checkers only
    from urllib3._base_connection import BaseHTTPConnection

_READ_SIZE: Final = 64 * 1024
# A head larger than this is not an API server's answer.
_MAX_HEAD: Final = 64 * 1024
_NO_BODY_STATUSES: Final = frozenset({204, 304})
# How a send ends when the server has stopped reading the request (perhaps after answering it): over TCP
# a reset or a broken pipe, over TLS also an EOF where OpenSSL expected more.
_SEND_CUT: Final = (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError)


class StreamingAnswer(Protocol):
    """What readers of a streamed answer (watches, followed logs) use: a `Stream` here, or urllib3's
    response through a proxy."""

    @property
    def status(self) -> int: ...

    def read1(self, amount: int = ...) -> bytes: ...

    def read(self, amt: int | None = None) -> bytes: ...

    def shutdown(self) -> None: ...

    def close(self) -> None: ...

    def release_conn(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """A complete answer; header names are lower case."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class _Socket:
    """One open connection and the bytes read from it that the current answer has not consumed yet."""

    __slots__ = ("buffer", "connection", "generation", "raw")

    def __init__(self, connection: BaseHTTPConnection, raw: socket.socket, generation: int) -> None:
        self.connection = connection
        self.raw = raw
        self.generation = generation
        self.buffer = bytearray()

    def close(self) -> None:
        self.connection.close()

    def fill(self) -> None:
        """Reads what has arrived (at least one byte); the end of the connection is a ProtocolError."""
        if not self.more():
            raise ProtocolError("the server closed the connection before the answer ended")

    def take(self, count: int) -> bytes:
        while len(self.buffer) < count:
            self.fill()
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data

    def line(self) -> bytes:
        """One CRLF-terminated line, without its end."""
        return self.until(b"\r\n", "a line of the answer")

    def until(self, end: bytes, what: str) -> bytes:
        """The bytes up to `end` (which is consumed, not returned), reading until it has arrived."""
        while True:
            found = self.buffer.find(end)
            if found >= 0:
                data = bytes(self.buffer[:found])
                del self.buffer[: found + len(end)]
                return data
            if len(self.buffer) > _MAX_HEAD:
                raise ProtocolError(f"{what} is too long")
            self.fill()

    def more(self) -> bool:
        """Reads what has arrived; False at the end of the connection."""
        data = self.raw.recv(_READ_SIZE)
        self.buffer += data
        return bool(data)


class _Body:
    """An answer's body as it arrives, whatever its framing: chunked (watches), Content-Length, or
    until the server closes the connection. `read1` returns what can be decoded from the bytes already
    read (many watch events at once when they arrived together), waiting for more only when nothing
    can be; b"" once the body has ended."""

    __slots__ = ("_both_lengths", "_chunked", "_crlf_due", "_left", "_sock", "_until_close", "ended")

    def __init__(self, sock: _Socket, headers: Mapping[str, str], *, empty: bool) -> None:
        self._sock = sock
        self._chunked = False
        self._until_close = False
        self._crlf_due = False
        self._left = 0  # bytes left: of the current chunk, or of a Content-Length body
        self.ended = empty
        coding = headers.get("transfer-encoding")
        # Transfer-Encoding overrides a Content-Length beside it, and the connection is not used again:
        # such an answer may be an attempt at response splitting (RFC 9112 section 6.3, rule 3).
        self._both_lengths = coding is not None and "content-length" in headers
        if empty:
            return
        if coding is not None:
            # Chunked only as the final coding; otherwise the body ends with the connection (rule 4).
            codings = transfer_codings(coding)
            self._chunked = bool(codings) and codings[-1] == "chunked"
            self._until_close = not self._chunked
            return
        if "content-length" not in headers:
            self._until_close = True
            return
        self._left = _count(headers["content-length"].encode("latin-1"), 10, "a Content-Length")
        self.ended = self._left == 0

    @property
    def ends_connection(self) -> bool:
        """True when the connection cannot carry another exchange after this body: the body ends with
        it, or the answer framed itself twice."""
        return self._until_close or self._both_lengths

    def read_all(self) -> bytes:
        if not self._chunked and not self._until_close:
            data, self._left, self.ended = self._sock.take(self._left), 0, True
            return data
        parts = []
        while data := self.read1(_READ_SIZE):
            parts.append(data)
        return b"".join(parts)

    def read1(self, amount: int) -> bytes:
        while not self.ended:
            data = self._decode(amount)
            if data:
                return data
            if not self.ended:
                if self._until_close and not self._sock.more():
                    self.ended = True
                    break
                if not self._until_close:
                    self._sock.fill()
        return b""

    def _decode(self, amount: int) -> bytes:
        buffer = self._sock.buffer
        if not self._chunked:
            count = min(len(buffer), amount) if self._until_close else min(len(buffer), amount, self._left)
            data = bytes(buffer[:count])
            del buffer[:count]
            if not self._until_close:
                self._left -= count
                self.ended = self._left == 0
            return data
        parts: list[bytes] = []
        room = amount
        while room > 0:
            if self._left:
                count = min(self._left, len(buffer), room)
                if not count:
                    break
                parts.append(bytes(buffer[:count]))
                del buffer[:count]
                self._left -= count
                room -= count
                self._crlf_due = self._left == 0
                continue
            if not self._next_chunk(buffer):
                break
        return b"".join(parts)

    def _next_chunk(self, buffer: bytearray) -> bool:
        """Reads the next chunk's size from the buffer; False when it has not arrived, or at the end."""
        if self._crlf_due:
            if len(buffer) < 2:
                return False
            if buffer[:2] != b"\r\n":
                raise ProtocolError("a chunk does not end with CRLF")
            del buffer[:2]
            self._crlf_due = False
        end = buffer.find(b"\r\n")
        if end < 0:
            if len(buffer) > _MAX_HEAD:
                raise ProtocolError("a chunk size line is too long")
            return False
        size_field = bytes(buffer[:end]).split(b";", 1)[0].strip()
        del buffer[: end + 2]
        self._left = _count(size_field, 16, "a chunk size")
        if self._left == 0:
            while self._sock.line():  # trailers, up to the empty line that ends them
                pass
            self.ended = True
            return False
        return True


def _count(field: bytes, base: int, what: str) -> int:
    """A length field: digits only (no sign, no spaces inside)."""
    text = field.strip()
    digits = b"0123456789abcdefABCDEF" if base == 16 else b"0123456789"
    if not text or text.strip(digits):
        raise ProtocolError(f"not {what}: {field[:20]!r}")
    return int(text, base)


def _read_head_of_answer(sock: _Socket) -> tuple[str, int, dict[str, str]]:
    while True:
        version, status, headers = parse_head(sock.until(b"\r\n\r\n", "the answer's head"))
        if not 100 <= status < 200:
            return version, status, headers  # 1xx interim answers (none is asked for) are skipped


def _read_answer(sock: _Socket, method: str) -> tuple[Answer, bool]:
    """The answer and whether the connection can carry another request."""
    version, status, headers = _read_head_of_answer(sock)
    body = _Body(sock, headers, empty=method == "HEAD" or status in _NO_BODY_STATUSES)
    data = body.read_all()
    reusable = (
        version == "HTTP/1.1"
        and "close" not in headers.get("connection", "").lower()
        and not body.ends_connection
        and not sock.buffer
    )
    return Answer(status, headers, data), reusable


def _answer_after_cut(sock: _Socket, method: str, cut: OSError) -> Answer:
    """The answer a server sent before it stopped reading the request: the API server's 413 for a body
    over its limit, a proxy's 401. urllib3 reads it too; when none came, the send's error is raised."""
    try:
        answer, _ = _read_answer(sock, method)
    except (OSError, ProtocolError):
        raise cut from None
    return answer


class Stream:
    """An answer read as it arrives (a watch), on a connection of its own that is closed at the end.

    The interface is the part of urllib3's response a watch uses: `read1`, `shutdown` (from another
    thread, to end a blocked read at once), `close` and `release_conn`.
    """

    def __init__(self, sock: _Socket, status: int, headers: Mapping[str, str]) -> None:
        self._sock = sock
        self.status = status
        self.headers = headers
        self._body = _Body(sock, headers, empty=status in _NO_BODY_STATUSES)

    def read1(self, amount: int = _READ_SIZE) -> bytes:
        return self._body.read1(amount)

    def read(self, amt: int | None = None) -> bytes:
        """The rest of the body (`amt` None), or up to `amt` bytes as urllib3 would."""
        if amt is None:
            return self._body.read_all()
        parts: list[bytes] = []
        while amt > 0 and (data := self._body.read1(amt)):
            parts.append(data)
            amt -= len(data)
        return b"".join(parts)

    def shutdown(self) -> None:
        self._sock.raw.shutdown(socket.SHUT_RD)

    def close(self) -> None:
        self._sock.close()

    def release_conn(self) -> None:
        self._sock.close()


class ConnectionPool:
    """Kept-alive connections to one server; thread-safe. `new_connection` returns an unopened urllib3
    connection carrying the TLS settings (what the official client's pool would open)."""

    def __init__(self, new_connection: Callable[[], BaseHTTPConnection], host: str, maxsize: int) -> None:
        self._new_connection = new_connection
        self._host = host
        self._maxsize = max(1, maxsize)
        self._lock = threading.Lock()
        self._idle: list[_Socket] = []
        self._generation = 0

    def clear(self) -> None:
        """Closes the idle connections; those in use are closed when their answer has been read."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for sock in idle:
            sock.close()

    def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: urllib3.Timeout,
    ) -> Answer:
        """One exchange; OSError (timeouts included), urllib3's connect errors or ProtocolError when no
        complete answer arrived. An answer sent before the body was all written is the answer."""
        head = request_head(method, target, self._host, headers, None if body is None else len(body))
        sock = self._checkout(timeout)
        reusable = False
        try:
            sock.raw.settimeout(_seconds(timeout.read_timeout))
            try:
                sock.raw.sendall(head + body if body else head)
            except _SEND_CUT as cut:
                return _answer_after_cut(sock, method, cut)
            answer, reusable = _read_answer(sock, method)
        finally:
            self._checkin(sock, reusable)
        return answer

    def open(self, target: str, headers: Mapping[str, str], timeout: urllib3.Timeout) -> Stream:
        """A GET whose answer's body is read as it arrives, on a new connection (a watch holds its
        connection for minutes; a kept-alive one is left to ordinary requests)."""
        sock = self._connect(timeout, self._generation)
        try:
            sock.raw.settimeout(_seconds(timeout.read_timeout))
            sock.raw.sendall(request_head("GET", target, self._host, headers, None))
            _, status, answer_headers = _read_head_of_answer(sock)
        except BaseException:
            sock.close()
            raise
        return Stream(sock, status, answer_headers)

    def _checkout(self, timeout: urllib3.Timeout) -> _Socket:
        while True:
            with self._lock:
                if not self._idle:
                    generation = self._generation
                    break
                sock = self._idle.pop()
            if _usable(sock):
                return sock
            sock.close()
        return self._connect(timeout, generation)

    def _connect(self, timeout: urllib3.Timeout, generation: int) -> _Socket:
        connection = self._new_connection()
        connection.timeout = _seconds(timeout.connect_timeout)
        connection.connect()
        raw = getattr(connection, "sock", None)
        if not isinstance(raw, socket.socket):
            connection.close()
            raise ProtocolError(f"{type(connection).__name__} has no socket after connecting")
        return _Socket(connection, raw, generation)

    def _checkin(self, sock: _Socket, reusable: bool) -> None:
        if reusable:
            with self._lock:
                if sock.generation == self._generation and len(self._idle) < self._maxsize:
                    self._idle.append(sock)
                    return
        sock.close()


def _usable(sock: _Socket) -> bool:
    """A kept-alive connection on which the server has sent nothing since the last answer: readable
    means it was closed (or is talking out of turn), and the next request would fail on it."""
    return not wait_for_read(sock.raw, timeout=0.0)


def _seconds(value: object) -> float | None:
    """A timeout of urllib3's in seconds; its "default" sentinel is no timeout."""
    return float(value) if isinstance(value, int | float) else None


__all__ = ["Answer", "ConnectionPool", "ProtocolError", "Stream", "StreamingAnswer"]
