"""One open watch on the API server, read line by line, that another thread can close at any moment.

The informer owns the reconnect policy; this module only turns a chunked watch answer into
`(type, object)` pairs, maps ERROR events to the API errors they carry (410 Gone restarts the watch
with a relist), skips lines that are not watch events, and makes `close()` end a blocked read at once
(shutting the socket down, which a half-open connection or a silent API server would otherwise never
do).
"""

from __future__ import annotations

import http.client
import logging
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any, Final, Self

import urllib3

from controller.runtime import boundedjson
from controller.runtime.errors import ApiError, Gone, TransportError, error_from_status
from controller.runtime.http11 import StreamingAnswer

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

# What a failed exchange raises below the HTTP answer: connection refused or reset, TLS, timeouts.
TRANSPORT_EXCEPTIONS: Final = (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)


class WatchStream:
    """One open watch: iterate for `(type, object)` pairs; `close()` from any thread ends it.

    Iteration ends when the server closes the stream (its timeoutSeconds) or after `close()`.
    An ERROR event raises the mapped ApiError (`Gone` for 410 / reason Expired); a broken
    connection or read timeout raises TransportError. Lines that are not watch events are logged
    and skipped.
    """

    _CHUNK: Final = 64 * 1024

    def __init__(self, response: StreamingAnswer, description: str, *, check_nesting: bool = True) -> None:
        self._response = response
        self._description = description
        self._check_nesting = check_nesting
        self._lock = threading.Lock()
        self._closed = False
        self._reading = False
        self._released = False
        self._iterating = False

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Idempotent; safe to call while another thread is blocked reading the stream."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reading = self._reading
        self._shutdown()
        if not reading:
            self._release()

    def _shutdown(self) -> None:
        # Shutting the socket down (rather than closing it) makes a blocked recv() return at once
        # without racing the reader thread on the file descriptor.
        try:
            self._response.shutdown()
        except (ValueError, RuntimeError, OSError):
            return

    def _release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        try:
            self._response.close()
        except TRANSPORT_EXCEPTIONS:
            logger.debug("closing %s failed", self._description, exc_info=True)
        finally:
            self._response.release_conn()

    def __iter__(self) -> Iterator[tuple[str, JsonObject]]:
        with self._lock:
            if self._iterating:
                raise RuntimeError("a watch stream can be iterated once")
            self._iterating = True
        return self._events()

    def _events(self) -> Iterator[tuple[str, JsonObject]]:
        buffer = b""
        try:
            while True:
                chunk = self._read()
                if not chunk:
                    tail = buffer.strip()
                    if tail and not self.closed:
                        event = self._parse(tail)
                        if event is not None:
                            yield event
                    return
                # A read holds all events that have arrived (many, in a burst): split once.
                *lines, buffer = (buffer + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = self._parse(line)
                    if event is not None:
                        yield event
        finally:
            self.close()

    def _read(self) -> bytes:
        """Next bytes of the stream; b"" at the end or once closed."""
        with self._lock:
            already_closed = self._closed
            self._reading = not already_closed
        if already_closed:
            return b""
        error: BaseException | None = None
        data = b""
        try:
            data = self._response.read1(self._CHUNK)
        except TRANSPORT_EXCEPTIONS as exc:
            error = exc
        with self._lock:
            self._reading = False
            closed = self._closed
        if closed:
            self._release()
            return b""
        if error is not None:
            if isinstance(error, urllib3.exceptions.ReadTimeoutError | TimeoutError):
                raise TransportError(f"{self._description}: read timed out") from error
            raise TransportError(f"{self._description}: {error}") from error
        return data

    def _parse(self, line: bytes) -> tuple[str, JsonObject] | None:
        try:
            event = boundedjson.loads(line, check_nesting=self._check_nesting)
        except ValueError:
            logger.warning("%s: skipping a line that is not JSON: %.200r", self._description, line)
            return None
        if not isinstance(event, dict):
            logger.warning("%s: skipping a non-object event: %.200r", self._description, line)
            return None
        event_type = event.get("type")
        obj = event.get("object")
        if not isinstance(event_type, str) or not isinstance(obj, dict):
            logger.warning("%s: skipping a malformed event: %.200r", self._description, line)
            return None
        if event_type == "ERROR":
            raise _watch_error(obj)
        return event_type, obj


def _watch_error(status: JsonObject) -> ApiError:
    code = status.get("code")
    error = error_from_status(code if isinstance(code, int) and code > 0 else 500, status)
    if not isinstance(error, Gone) and status.get("reason") in ("Expired", "Gone"):
        return Gone(410, str(status.get("reason")), error.message, status)
    return error
