"""JSON logs: one object per line, job context per thread, exceptions on one line, levels, laziness."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from controller.runtime.logs import (
    current_context,
    log_context,
    new_reconcile_id,
    parse_level,
    resolve_level,
    setup_logging,
    teardown_logging,
)

TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
log = logging.getLogger("tests.logs")


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    level = root.level
    out = io.StringIO()
    setup_logging("DEBUG", out)
    try:
        yield out
    finally:
        teardown_logging()
        root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    text = stream.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_one_json_object_per_line_with_the_standard_fields(stream: io.StringIO) -> None:
    log.info("created %d pods", 2)
    log.warning("second")
    first, second = lines(stream)
    assert list(first) == ["time", "level", "logger", "message"]
    assert first["level"] == "INFO"
    assert first["logger"] == "tests.logs"
    assert first["message"] == "created 2 pods"
    assert TIME.match(first["time"]), first["time"]
    assert second["level"] == "WARNING"


def test_time_is_utc_with_milliseconds(stream: io.StringIO) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    log.info("now")
    logged = datetime.fromisoformat(lines(stream)[0]["time"].replace("Z", "+00:00"))
    assert logged.tzinfo is not None
    assert logged.utcoffset() is not None
    assert (logged - before).total_seconds() < 60


def test_context_fields_and_extras(stream: io.StringIO) -> None:
    with log_context(namespace="ml", name="bert", reconcile_id="r-1"):
        log.info("creating pod", extra={"action": "create", "object": "bert-worker-0", "reason": "Missing"})
    log.info("outside")
    inside, outside = lines(stream)
    assert inside == {
        "time": inside["time"],
        "level": "INFO",
        "logger": "tests.logs",
        "message": "creating pod",
        "namespace": "ml",
        "name": "bert",
        "reconcile_id": "r-1",
        "action": "create",
        "object": "bert-worker-0",
        "reason": "Missing",
    }
    assert list(inside)[:7] == ["time", "level", "logger", "message", "namespace", "name", "reconcile_id"]
    assert "namespace" not in outside
    assert "reconcile_id" not in outside


def test_nested_contexts_add_and_restore() -> None:
    assert current_context() == {}
    with log_context(namespace="ml", name="bert"):
        with log_context(reconcile_id="r-2"):
            assert current_context() == {"namespace": "ml", "name": "bert", "reconcile_id": "r-2"}
        with log_context(name="gpt"):
            assert current_context() == {"namespace": "ml", "name": "gpt"}
        assert current_context() == {"namespace": "ml", "name": "bert"}
    assert current_context() == {}


def test_threads_keep_their_own_context(stream: io.StringIO) -> None:
    rounds = 50
    barrier = threading.Barrier(2, timeout=10)
    errors: list[BaseException] = []

    def worker(job: str) -> None:
        try:
            with log_context(namespace="ml", name=job, reconcile_id=new_reconcile_id()):
                barrier.wait()
                for index in range(rounds):
                    log.info("step %d of %s", index, job)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(job,)) for job in ("bert", "gpt")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not errors
    records = lines(stream)
    assert len(records) == 2 * rounds
    ids: dict[str, set[str]] = {"bert": set(), "gpt": set()}
    for record in records:
        assert record["message"].endswith(f"of {record['name']}"), record
        ids[record["name"]].add(record["reconcile_id"])
    assert all(len(values) == 1 for values in ids.values())
    assert ids["bert"] != ids["gpt"]


def test_a_new_thread_starts_without_the_parents_context(stream: io.StringIO) -> None:
    with log_context(namespace="ml", name="bert"):
        thread = threading.Thread(target=lambda: log.info("from a fresh thread"))
        thread.start()
        thread.join(10)
    (record,) = lines(stream)
    assert "name" not in record


def test_exception_is_one_line_with_the_traceback(stream: io.StringIO) -> None:
    with log_context(namespace="ml", name="bert"):
        try:
            _ = 1 / 0
        except ZeroDivisionError:
            log.exception("reconcile failed", extra={"error": "division"})
    text = stream.getvalue()
    assert text.count("\n") == 1
    (record,) = lines(stream)
    assert record["level"] == "ERROR"
    assert record["name"] == "bert"
    assert record["error"] == "division"
    assert record["exc_info"].startswith("Traceback (most recent call last):")
    assert "ZeroDivisionError: division by zero" in record["exc_info"]
    assert list(record)[-1] == "exc_info"


def test_values_json_cannot_encode_natively_are_rendered(stream: io.StringIO) -> None:
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    log.info("odd extras", extra={"when": moment, "what": {"nested": [1, 2]}, "obj": object()})
    (record,) = lines(stream)
    assert record["when"].startswith("2026-01-01T00:00:00")
    assert record["what"] == {"nested": [1, 2]}
    assert isinstance(record["obj"], str)


def test_levels_filter_and_formatting_is_lazy(stream: io.StringIO) -> None:
    class Expensive:
        rendered = 0

        def __str__(self) -> str:
            Expensive.rendered += 1
            return "expensive"

    setup_logging("info")
    log.debug("hidden %s", Expensive())
    assert Expensive.rendered == 0
    log.info("shown %s", Expensive())
    assert Expensive.rendered >= 1  # pytest's own capture handlers render it too
    (record,) = lines(stream)
    assert record["message"] == "shown expensive"


def test_setup_is_idempotent(stream: io.StringIO) -> None:
    root = logging.getLogger()
    handlers = list(root.handlers)
    handler = setup_logging("WARNING", stream)
    assert root.handlers == handlers
    assert setup_logging("warning") is handler
    assert root.level == logging.WARNING
    other = io.StringIO()
    setup_logging("INFO", other)
    log.info("to the new stream")
    assert stream.getvalue() == ""
    assert json.loads(other.getvalue())["message"] == "to the new stream"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("DEBUG", logging.DEBUG),
        ("debug", logging.DEBUG),
        (" Info ", logging.INFO),
        ("warning", logging.WARNING),
        ("WARN", logging.WARNING),
        ("Error", logging.ERROR),
        (logging.ERROR, logging.ERROR),
    ],
)
def test_parse_level(value: str | int, expected: int) -> None:
    assert parse_level(value) == expected


@pytest.mark.parametrize("value", ["verbose", "", "TRACE", "5", 5, True])
def test_parse_level_rejects_with_a_clear_message(value: str | int) -> None:
    with pytest.raises(ValueError, match=r"invalid log level .*: use one of DEBUG, INFO, WARNING, ERROR"):
        parse_level(value)


def test_resolve_level_prefers_the_flag_then_the_environment() -> None:
    assert resolve_level(None, {}) == logging.INFO
    assert resolve_level(None, {"LOG_LEVEL": ""}) == logging.INFO
    assert resolve_level(None, {"LOG_LEVEL": "debug"}) == logging.DEBUG
    assert resolve_level("error", {"LOG_LEVEL": "debug"}) == logging.ERROR
    with pytest.raises(ValueError, match=r"^LOG_LEVEL: invalid log level 'loud'"):
        resolve_level(None, {"LOG_LEVEL": "loud"})
    with pytest.raises(ValueError, match=r"^invalid log level 'loud'"):
        resolve_level("loud", {})


def test_setup_rejects_an_invalid_level() -> None:
    with pytest.raises(ValueError, match="invalid log level"):
        setup_logging("chatty", io.StringIO())


def test_reconcile_ids_are_unique() -> None:
    assert len({new_reconcile_id() for _ in range(100)}) == 100
