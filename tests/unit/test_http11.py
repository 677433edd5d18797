"""The small HTTP/1.1 client (controller/runtime/http11.py) against a raw socket server that sends exactly
the bytes a test scripts: every framing an API server (or a proxy in front of one) may use, answers
split across reads or packed into one, kept-alive connections the server closed, streams closed from
another thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import closing

import pytest
import urllib3
from urllib3.connection import HTTPConnection

from controller.runtime import http11, http11_heads
from tests.unit.rawserver import RawServer

TIMEOUT = urllib3.Timeout(connect=5.0, read=5.0)


@pytest.fixture
def server() -> Iterator[RawServer]:
    raw = RawServer()
    yield raw
    raw.close()


def pool_for(server: RawServer, maxsize: int = 4) -> http11.ConnectionPool:
    return http11.ConnectionPool(
        lambda: HTTPConnection("127.0.0.1", server.port), f"127.0.0.1:{server.port}", maxsize
    )


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def test_a_request_is_one_head_with_host_headers_and_length(server: RawServer) -> None:
    server.script(ok(b"{}"))
    answer = pool_for(server).request(
        "POST", "/api/v1/pods?x=1", {"Accept": "application/json", "X-Note": "a\tb é"}, b'{"a":1}', TIMEOUT
    )
    assert (answer.status, answer.body) == (200, b"{}")
    assert server.requests == [
        b"POST /api/v1/pods?x=1 HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept: application/json\r\n"
        b"X-Note: a\tb \xe9\r\nContent-Length: 7\r\n\r\n"
        b'{"a":1}' % server.port
    ]


def test_a_target_with_characters_a_request_line_cannot_hold_is_percent_encoded() -> None:
    head = http11_heads.request_head(
        "GET", "/api/v1/namespaces/ns/pods/a b?labelSelector=app%3Dx&q=é", "h", {}, None
    )
    assert head.startswith(
        b"GET /api/v1/namespaces/ns/pods/a%20b?labelSelector=app%3Dx&q=%C3%A9 HTTP/1.1\r\n"
    )


def test_a_header_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError, match="line breaks"):
        http11_heads.request_head("GET", "/", "h", {"Authorization": "Bearer x\r\nX-Injected: 1"}, None)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Note", "a\x00b"),
        ("X-Note", "escape \x1b[31m"),
        ("X-Note", "bell\x07"),
        ("X-Note", "delete\x7f"),
        ("X\x00Note", "v"),
        ("X Note", "v"),
        ("X:Note", "v"),
        ("", "v"),
        ("X-Nöte", "v"),
    ],
    ids=[
        "nul",
        "escape",
        "bell",
        "delete",
        "nul-in-name",
        "space-in-name",
        "colon-in-name",
        "no-name",
        "non-ascii-name",
    ],
)
def test_a_header_name_that_is_no_token_or_a_value_with_control_characters_is_refused(
    name: str, value: str
) -> None:
    """RFC 9110 sections 5.1 and 5.5: a name is a token; a value is visible characters, spaces and tabs."""
    with pytest.raises(ValueError, match="invalid header"):
        http11_heads.request_head("GET", "/", "h", {name: value}, None)


def test_kept_alive_connection_is_reused(server: RawServer) -> None:
    server.script(ok(b"1"), ok(b"2"), ok(b"3"))
    pool = pool_for(server)
    assert [pool.request("GET", "/", {}, None, TIMEOUT).body for _ in range(3)] == [b"1", b"2", b"3"]
    assert server.connections == 1


def test_chunked_answer_with_extensions_and_trailers(server: RawServer) -> None:
    server.script(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n",
        ok(b"next"),
    )
    pool = pool_for(server)
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"hello world"
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"next"
    assert server.connections == 1


def test_headers_are_lower_case_and_repeated_ones_joined(server: RawServer) -> None:
    server.script(
        b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nWarning: a\r\nWarning: b\r\n"
        b"Content-Length: 0\r\n\r\n"
    )
    answer = pool_for(server).request("GET", "/", {}, None, TIMEOUT)
    assert answer.status == 429
    assert answer.headers["retry-after"] == "3"
    assert answer.headers["warning"] == "a, b"


def test_a_folded_header_line_continues_the_header_before_it_after_a_space(server: RawServer) -> None:
    """RFC 9112 section 5.2: a user agent replaces an obsolete line fold with a space."""
    server.script(
        b"HTTP/1.1 200 OK\r\nWarning: 299 - first\r\n  second\r\n\tthird\r\nContent-Length: 2\r\n\r\nok"
    )
    answer = pool_for(server).request("GET", "/", {}, None, TIMEOUT)
    assert answer.headers["warning"] == "299 - first second third"
    assert answer.body == b"ok"


def test_transfer_encoding_overrides_content_length_and_the_connection_is_dropped(server: RawServer) -> None:
    """RFC 9112 section 6.3: both on one answer may be an attempt at response splitting; whatever comes
    after such an answer on its connection is not read as the next answer."""
    server.script(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        ok(b"smuggled"),
    )
    server.script(ok(b"next"))
    pool = pool_for(server)
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"hello"
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"next"
    assert server.connections == 2


def test_transfer_encoding_is_a_list_of_codings_and_chunked_frames_only_as_the_last(
    server: RawServer,
) -> None:
    """RFC 9112 section 6.3, rule 4: an answer whose final transfer coding is not chunked ends with the
    connection; the field is a case-insensitive list, not a string to search."""
    server.script(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, CHUNKED , \r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\nuntil the end",
        then_close=True,
    )
    server.script(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", then_close=True
    )
    server.script(ok(b"next"))
    pool = pool_for(server)
    assert [pool.request("GET", "/", {}, None, TIMEOUT).body for _ in range(4)] == [
        b"abc",
        b"until the end",
        b"5\r\nhello\r\n0\r\n\r\n",
        b"next",
    ]
    assert server.connections == 3


def test_an_answer_framed_by_the_end_of_the_connection_is_read_and_not_reused(server: RawServer) -> None:
    server.script(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"old": true}', then_close=True)
    server.script(ok(b"fresh"))
    pool = pool_for(server)
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b'{"old": true}'
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"fresh"
    assert server.connections == 2


def test_connection_close_is_honoured(server: RawServer) -> None:
    server.script(ok(b"1", b"Connection: close\r\n"))
    server.script(ok(b"2"))
    pool = pool_for(server)
    pool.request("GET", "/", {}, None, TIMEOUT)
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"2"
    assert server.connections == 2


def test_interim_answers_are_skipped_and_no_content_has_no_body(server: RawServer) -> None:
    server.script(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", ok(b"after"))
    pool = pool_for(server)
    answer = pool.request("DELETE", "/", {}, None, TIMEOUT)
    assert (answer.status, answer.body) == (204, b"")
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"after"


def test_a_kept_alive_connection_the_server_closed_while_idle_is_not_used_again(server: RawServer) -> None:
    server.script(ok(b"1"), then_close=True)
    server.script(ok(b"2"))
    pool = pool_for(server)
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"1"
    assert server.closed.acquire(timeout=5.0)
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"2"
    assert server.connections == 2


# More than the kernel buffers on both ends hold, so the send is still blocked when the server stops reading.
LARGE_BODY = b"x" * (16 * 1024 * 1024)
TOO_LARGE = b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: 14\r\n\r\nbody too large"


def test_an_answer_sent_before_the_body_was_read_is_returned(server: RawServer) -> None:
    """The API server's 413 for a body over its limit arrives while the body is being sent; the server
    then closes the connection with the rest unread, which cuts the send short."""
    server.script(TOO_LARGE, read_body=False)
    server.script(b"", read_body=False)  # then one that closes without answering
    pool = pool_for(server)
    answer = pool.request("POST", "/api/v1/namespaces/ns/configmaps", {}, LARGE_BODY, TIMEOUT)
    assert (answer.status, answer.body) == (413, b"body too large")
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        pool.request("POST", "/api/v1/namespaces/ns/configmaps", {}, LARGE_BODY, TIMEOUT)
    assert server.connections == 2
    assert not pool._idle


def test_an_answer_cut_short_is_a_protocol_error_and_the_connection_is_dropped(server: RawServer) -> None:
    server.script(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", then_close=True)
    server.script(ok(b"whole"))
    pool = pool_for(server)
    with pytest.raises(http11.ProtocolError, match="closed the connection"):
        pool.request("GET", "/", {}, None, TIMEOUT)
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"whole"


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
        b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\nab\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length\t: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n: nameless\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n Content-Length: 2\r\n\r\nok",
    ],
    ids=[
        "not-http",
        "bad-header",
        "bad-chunk-size",
        "chunk-without-crlf",
        "bad-length",
        "negative-length",
        "negative-chunk-size",
        "space-before-colon",
        "tab-before-colon",
        "empty-name",
        "folded-line-before-the-first-header",
    ],
)
def test_broken_framing_is_a_protocol_error(server: RawServer, answer: bytes) -> None:
    server.script(answer)
    with pytest.raises(http11.ProtocolError):
        pool_for(server).request("GET", "/", {}, None, TIMEOUT)


def test_no_answer_in_time_is_a_timeout(server: RawServer) -> None:
    server.script()  # reads the request, never answers
    with pytest.raises(TimeoutError):
        pool_for(server).request("GET", "/", {}, None, urllib3.Timeout(connect=5.0, read=0.2))


def test_clear_closes_idle_connections_and_those_in_use_when_they_return(server: RawServer) -> None:
    server.script(ok(b"1"), ok(b"unused"))
    server.script(ok(b"2"))
    pool = pool_for(server)
    pool.request("GET", "/", {}, None, TIMEOUT)
    pool.clear()
    assert pool.request("GET", "/", {}, None, TIMEOUT).body == b"2"
    assert server.connections == 2


def test_at_most_maxsize_idle_connections_are_kept(server: RawServer) -> None:
    pool = pool_for(server, maxsize=1)
    for _ in range(2):
        server.script(ok(b"x"), ok(b"y"))
    first = pool._checkout(TIMEOUT)
    second = pool._checkout(TIMEOUT)
    pool._checkin(first, reusable=True)
    pool._checkin(second, reusable=True)
    assert len(pool._idle) == 1
    assert second.raw.fileno() == -1


def test_a_stream_returns_events_as_they_arrive_and_packed_ones_at_once(server: RawServer) -> None:
    first, second = b'{"type":"ADDED"}\n', b'{"type":"MODIFIED"}\n'
    server.script(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n" % (len(first), first)
        + b"%x\r\n%s\r\n" % (len(second), second)
        + b"0\r\n\r\n"
    )
    stream = pool_for(server).open("/watch", {}, TIMEOUT)
    assert stream.status == 200
    assert stream.read1(65536) == first + second
    assert stream.read1(65536) == b""
    stream.release_conn()


def test_a_stream_read_in_small_pieces_and_cut_short(server: RawServer) -> None:
    server.script(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n3\r\nghi", then_close=True
    )
    stream = pool_for(server).open("/watch", {}, TIMEOUT)
    assert stream.read1(4) == b"abcd"
    assert stream.read(5) == b"efghi"
    with pytest.raises(http11.ProtocolError):
        stream.read1(65536)
    stream.close()


def test_a_stream_closed_from_another_thread_ends_a_blocked_read(server: RawServer) -> None:
    server.script(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")  # then nothing
    stream = pool_for(server).open("/watch", {}, urllib3.Timeout(connect=5.0, read=30.0))
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(stream.read1(65536))
        except Exception as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    stream.shutdown()
    reader.join(10.0)
    assert not reader.is_alive()
    assert len(outcome) == 1
    stream.release_conn()


def test_a_log_framed_by_the_end_of_the_connection_reads_whole(server: RawServer) -> None:
    server.script(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nline 1\nline 2\n", then_close=True)
    stream = pool_for(server).open("/log", {}, TIMEOUT)
    with closing(stream):
        assert stream.read() == b"line 1\nline 2\n"
