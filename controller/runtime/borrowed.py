"""The connections the operator's HTTP/1.1 client (http11.py) borrows from urllib3, checked at start-up.

http11 writes the requests and reads the answers itself but lets urllib3 open the connections, so that
TLS is set up from the kubeconfig exactly as the official client sets it up (CA, client certificate,
server name, verification) and the operator never configures TLS itself. Borrowing relies on what
urllib3 does not promise: a connection pool's private `_new_conn` (an unopened connection with the
pool's settings), and an opened connection's `sock` being the standard library's socket (an
`ssl.SSLSocket` over TLS) on which HTTP/1.1 is spoken. A urllib3 release, urllib3's pyOpenSSL backend,
its HTTP/2 support or a pool customised with its own connection class would break that. `opener` checks
it once, when the client is built, so that the transport can take urllib3's own path instead (correct,
at more CPU per request) rather than fail every request.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.util import ssl_ as urllib3_ssl

if TYPE_CHECKING:  # a Protocol urllib3 defines for type checkers only
    from urllib3._base_connection import BaseHTTPConnection


class Unsupported(Exception):
    """The connections this urllib3 makes are not what http11 can use; the message says why."""


def opener(pool: urllib3.HTTPConnectionPool) -> Callable[[], BaseHTTPConnection]:
    """The pool's maker of unopened connections, once one connection it made has been checked (and
    closed unopened): urllib3's own HTTPConnection or HTTPSConnection, whose `connect` leaves a
    standard-library socket in `sock`, with TLS from the standard library's ssl module offering
    HTTP/1.1 only. Unsupported, naming what differs, otherwise."""
    new_connection = getattr(pool, "_new_conn", None)
    if not callable(new_connection):
        raise Unsupported("urllib3's connection pool has no _new_conn")
    if pool.proxy is not None:
        raise Unsupported("the connection pool goes through a proxy")
    connection = new_connection()
    try:
        _check(connection)
    finally:
        connection.close()
    return new_connection  # type: ignore[no-any-return]


def _check(connection: object) -> None:
    kind = type(connection)
    if kind not in (HTTPConnection, HTTPSConnection):
        raise Unsupported(
            f"urllib3's pool makes {kind.__module__}.{kind.__qualname__} connections, not "
            "urllib3.connection.HTTPConnection or HTTPSConnection"
        )
    if getattr(connection, "sock", "missing") is not None:
        raise Unsupported("an unopened urllib3 connection has no `sock` (None until it connects)")
    if kind is HTTPSConnection:
        _check_tls(connection)


def _check_tls(connection: object) -> None:
    factory: object = urllib3_ssl.SSLContext  # None without ssl; pyOpenSSL's class once injected
    if not (isinstance(factory, type) and issubclass(factory, ssl.SSLContext)):
        raise Unsupported(
            f"urllib3 makes its TLS contexts with {factory!r} (pyOpenSSL?), whose sockets are not the "
            "standard library's"
        )
    context = getattr(connection, "ssl_context", None)
    if context is not None and not isinstance(context, ssl.SSLContext):
        raise Unsupported(f"the pool's TLS context is a {type(context).__name__}, not an ssl.SSLContext")
    if "h2" in getattr(urllib3_ssl, "ALPN_PROTOCOLS", ()):
        raise Unsupported("urllib3 offers HTTP/2 to servers (urllib3.http2 is in use)")
