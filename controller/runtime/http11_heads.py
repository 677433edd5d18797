"""The heads of HTTP/1.1 messages as the operator's HTTP/1.1 client (http11.py) writes requests and reads
answers: pure functions over strings and bytes, apart from sockets and pools, so that what RFC 9110 and
RFC 9112 ask of a user agent for each line is in one place.

Requests: the target is percent-encoded where a request line cannot hold it (as urllib3 does); a
header whose name is not a token or whose value holds a control character other than a tab is refused
(RFC 9110 sections 5.1 and 5.5: more than http.client refuses, which lets NUL and folded values
through). Answers: only what an API client needs is parsed; a header line with whitespace between its
name and colon is refused (RFC 9112 section 5.1), a folded line is joined to the header before it
with a space (section 5.2), and Transfer-Encoding is read as a list of codings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final
from urllib.parse import quote

import urllib3

# How a folded header line starts.
_BLANKS: Final = (b" ", b"\t")
# A request target holds only these unencoded (RFC 3986 path and query characters; "%" is kept, as an
# escape already made); anything else is percent-encoded, as urllib3 does.
_TARGET_SAFE: Final = "!$&'()*+,;=:@/?%"
_NEEDS_ENCODING: Final = re.compile(r"[^A-Za-z0-9\-._~!$&'()*+,;=:@/?%]")
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE: Final = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")
# Request header fields already checked: nearly every request carries the same few, and checking a
# bearer token character by character would cost more than writing the rest of the head.
_LEGAL_FIELDS: Final[set[tuple[str, str]]] = set()
_LEGAL_FIELDS_KEPT: Final = 256


class ProtocolError(urllib3.exceptions.ProtocolError):
    """The answer broke HTTP/1.1 framing, or the connection ended before the answer did (a urllib3
    ProtocolError, so that whoever handles urllib3's transport errors handles these)."""


def request_head(
    method: str, target: str, host: str, headers: Mapping[str, str], length: int | None
) -> bytes:
    """The request line and headers; a body's length is sent as Content-Length. A header whose name is
    not a token or whose value holds a control character (a line break, NUL; a tab is allowed) is a
    ValueError, as line breaks are in http.client."""
    if _NEEDS_ENCODING.search(target):
        target = quote(target, safe=_TARGET_SAFE)
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    for name, value in headers.items():
        if (name, value) not in _LEGAL_FIELDS:
            _check_field(name, value)
        lines.append(f"{name}: {value}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _check_field(name: str, value: str) -> None:
    """A request header as RFC 9110 has them: the name a token (section 5.1), the value visible
    characters, spaces and tabs (section 5.5); line breaks, obsolete folds included, and other control
    characters are refused. Remembers the fields found legal."""
    if not _TOKEN.fullmatch(name):
        raise ValueError(
            f"invalid header name {name!r}: a header name is letters, digits and !#$%&'*+-.^_`|~"
        )
    if not _FIELD_VALUE.fullmatch(value):
        raise ValueError(f"invalid header {name!r}: control characters (line breaks, NUL) are not allowed")
    if len(_LEGAL_FIELDS) >= _LEGAL_FIELDS_KEPT:
        _LEGAL_FIELDS.clear()
    _LEGAL_FIELDS.add((name, value))


def parse_head(head: bytes) -> tuple[str, int, dict[str, str]]:
    """The HTTP version, the status and the headers (names lower case, repeated ones joined) of a head."""
    status_line, *header_lines = head.split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    key = ""
    for raw in header_lines:
        name, colon, value = raw.partition(b":")
        if not colon or not name or name.strip() != name:
            _unfold(headers, key, raw)
            continue
        key = name.lower().decode("latin-1")
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return parts[0].decode("latin-1"), int(parts[1]), headers


def _unfold(headers: dict[str, str], key: str, raw: bytes) -> None:
    """A line that is not `name: value`. A folded line (obs-fold) continues the header before it after a
    space, as RFC 9112 section 5.2 has a user agent do; anything else is a ProtocolError, whitespace
    between a name and its colon included (section 5.1)."""
    if raw[:1] not in _BLANKS:
        name, colon, _ = raw.partition(b":")
        what = (
            "whitespace between a header's name and its colon"
            if colon and name.strip()
            else "not a header line"
        )
        raise ProtocolError(f"{what}: {raw[:80]!r}")
    if not key:
        raise ProtocolError(f"a folded line before the first header: {raw[:80]!r}")
    text = raw.strip().decode("latin-1")
    if text:
        headers[key] = f"{headers[key]} {text}".lstrip()


def transfer_codings(field: str) -> list[str]:
    """The codings of a Transfer-Encoding field, in order, lower case: a comma-separated list whose
    empty elements do not count (RFC 9110 section 5.6.1)."""
    return [coding for coding in (part.strip(" \t").lower() for part in field.split(",")) if coding]
