"""JSON logs, one object per line, carrying the job a line is about.

Why this module exists: the operator runs many reconciles concurrently, so a plain text line such as
"created pod" is useless unless it says which job it belongs to. Log collectors in a cluster parse
JSON, so every record becomes one JSON object with `time` (RFC 3339, UTC, milliseconds), `level`,
`logger` and `message`, plus the `namespace`, `name` and `reconcile_id` of the reconcile that logged
it, and any `extra=` fields (`action`, `object`, `reason`, `error`, ...). Exceptions travel as one
`exc_info` field so a traceback never splits into many lines.

The job context comes from context variables set with `log_context(...)` around a reconcile; each
worker thread has its own context, so concurrent reconciles never see each other's fields, and code
deep in the call stack logs without passing the job around. Formatting stays lazy: `%`-style
arguments are only rendered when a record is actually emitted.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import IO, Any, Final

from pythonjsonlogger.core import merge_record_extra
from pythonjsonlogger.json import JsonFormatter as _BaseJsonFormatter

LEVELS: Final[Mapping[str, int]] = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
}
DEFAULT_LEVEL: Final = logging.INFO
LEVEL_ENV: Final = "LOG_LEVEL"
CONTEXT_FIELDS: Final = ("namespace", "name", "reconcile_id")

# The context of the current thread (or task): field name -> value. Never mutated in place.
_context: ContextVar[Mapping[str, str] | None] = ContextVar("trainingjob_log_context", default=None)
# Where the filter stores the emitting thread's context on a record (underscore: not an output field).
_RECORD_ATTRIBUTE: Final = "_trainingjob_log_context"


def parse_level(value: str | int) -> int:
    """DEBUG, INFO, WARNING (or WARN) or ERROR, in any case, or the matching `logging` number."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value in LEVELS.values():
            return value
    elif isinstance(value, str):
        level = LEVELS.get(value.strip().upper())
        if level is not None:
            return level
    raise ValueError(f"invalid log level {value!r}: use one of DEBUG, INFO, WARNING, ERROR")


def resolve_level(flag: str | None, environ: Mapping[str, str] | None = None) -> int:
    """The level from --log-level if given, else from $LOG_LEVEL, else INFO."""
    if flag:
        return parse_level(flag)
    env = (os.environ if environ is None else environ).get(LEVEL_ENV, "").strip()
    if env:
        try:
            return parse_level(env)
        except ValueError as error:
            raise ValueError(f"{LEVEL_ENV}: {error}") from None
    return DEFAULT_LEVEL


def new_reconcile_id() -> str:
    """A unique id for one reconcile, to tie together the lines it logs (controller-runtime uses UUIDs)."""
    return str(uuid.uuid4())


@contextmanager
def log_context(
    *, namespace: str | None = None, name: str | None = None, reconcile_id: str | None = None
) -> Iterator[None]:
    """Adds the given fields to every line logged by this thread until the block ends.

    Nested blocks add to (and may override) the outer fields; leaving a block restores them.
    """
    fields = dict(_context.get() or {})
    for key, value in (("namespace", namespace), ("name", name), ("reconcile_id", reconcile_id)):
        if value is not None:
            fields[key] = value
    token = _context.set(fields)
    try:
        yield
    finally:
        _context.reset(token)


def current_context() -> dict[str, str]:
    """The fields `log_context` set for the calling thread."""
    return dict(_context.get() or {})


class ContextFilter(logging.Filter):
    """Stamps each record with the emitting thread's context, so a handler that formats later (in
    another thread) still writes the right job."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, _RECORD_ATTRIBUTE):
            setattr(record, _RECORD_ATTRIBUTE, _context.get())
        return True


def _rfc3339_millis(created: float, msecs: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(msecs):03d}Z"


class JsonFormatter(_BaseJsonFormatter):
    """Fields in a fixed order: time, level, logger, message, context, extras, then exc_info/stack_info."""

    def add_fields(
        self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        log_data["time"] = _rfc3339_millis(record.created, record.msecs)
        log_data["level"] = record.levelname
        log_data["logger"] = record.name
        log_data["message"] = record.message
        context = getattr(record, _RECORD_ATTRIBUTE, None)
        if context is None:
            context = _context.get()
        if context:
            log_data.update(context)
        merge_record_extra(record, log_data, reserved=self._skip_fields)
        log_data.update(message_dict)


_lock = threading.Lock()
_handler: logging.StreamHandler[IO[str]] | None = None


def setup_logging(level: str | int = DEFAULT_LEVEL, stream: IO[str] | None = None) -> logging.Handler:
    """Sends every log record, as one JSON line, to `stream` (default: the current sys.stderr).

    Idempotent: a second call changes the level (and the stream, if given) of the handler installed
    by the first instead of adding another. Handlers installed by others are left alone.
    """
    global _handler  # noqa: PLW0603 - one root handler per process is the point
    resolved = parse_level(level)
    with _lock:
        root = logging.getLogger()
        if _handler is None or _handler not in root.handlers:
            handler: logging.StreamHandler[IO[str]] = logging.StreamHandler(stream or sys.stderr)
            handler.setFormatter(JsonFormatter())
            handler.addFilter(ContextFilter())
            root.addHandler(handler)
            _handler = handler
        elif stream is not None and _handler.stream is not stream:
            _handler.setStream(stream)
        root.setLevel(resolved)
        return _handler


def teardown_logging() -> None:
    """Removes the handler `setup_logging` installed (tests; a process normally keeps it)."""
    global _handler  # noqa: PLW0603 - see setup_logging
    with _lock:
        if _handler is not None:
            logging.getLogger().removeHandler(_handler)
            _handler = None
