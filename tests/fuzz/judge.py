"""Pure judgements of a fuzz run: which layer of the API server refused a manifest, whether an
accepted job got a clear outcome, which operator log lines are violations, what write budget a job has.

Why: the fuzz run's imperative shell (tests/fuzz/harness.py) only fetches answers, jobs, Events, log
lines and metrics; every decision about them is made here, in functions the unit tests call directly
with recorded API answers, so the property the fuzzer checks is itself tested.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.fuzz.schema_strategies import Schema, schema_paths

JsonDict = dict[str, Any]

# A CEL rule's error shows the value's type, never the value: `Invalid value: "object": <message>`.
CEL_VALUE = re.compile(r'^Invalid value: "(object|string|integer|number|array|boolean|map|list)": ')
# What the API server adds after any other error; it names no field.
UNCHECKED_RULES = "some validation rules were not checked"
QUOTED = re.compile(r"'([^']{12,})'")


# ----------------------------------------------------------------------------------------- refusals


_CEL_CACHE: dict[int, tuple[str, ...]] = {}


def cel_messages(root: Schema) -> tuple[str, ...]:
    """Every CEL rule message of the schema (static messages, and the literal parts of message
    expressions)."""
    cached = _CEL_CACHE.get(id(root))
    if cached is None:
        texts: list[str] = []
        for _, node in schema_paths(root):
            for entry in node.get("x-kubernetes-validations") or ():
                if entry.get("message"):
                    texts.append(str(entry["message"]))
                texts += QUOTED.findall(str(entry.get("messageExpression", "")))
        cached = tuple(text.strip(" '") for text in texts if text.strip(" '"))
        _CEL_CACHE[id(root)] = cached
    return cached


STATUS_LAYERS = {413: "too-large", 409: "conflict"}


def refusal_layer(status: int, body: Mapping[str, Any], root: Schema) -> str:
    """Which layer refused a create: decode, unknown-field, metadata, schema, list, cel, too-large,
    conflict, or server-error."""
    message = str(body.get("message", ""))
    if status == 400:
        return "unknown-field" if "strict decoding error" in message else "decode"
    if status != 422:
        return STATUS_LAYERS.get(status, "server-error" if status >= 500 else f"http-{status}")
    return _invalid_layer(body, root)


def _invalid_layer(body: Mapping[str, Any], root: Schema) -> str:
    """The layer of a 422 Invalid answer, from its first cause (the API server's note that further
    rules were not checked names no field and is skipped)."""
    causes = [
        cause
        for cause in (body.get("details") or {}).get("causes") or ()
        if UNCHECKED_RULES not in str(cause.get("message", ""))
    ]
    if not causes:
        return "schema"
    cause = causes[0]
    text = str(cause.get("message", ""))
    if cause.get("reason") == "FieldValueDuplicate":
        return "list"
    if any(known in text for known in cel_messages(root)) or (
        CEL_VALUE.match(text) and " in body " not in text
    ):
        return "cel"
    if str(cause.get("field", "")).startswith("metadata"):
        return "metadata"
    return "schema"


# ----------------------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class Outcome:
    """What an accepted job shows. `label` is counted in the summary; `problem` is None when the job
    has a clear outcome, else what it lacks."""

    label: str
    problem: str | None


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for entry in status.get("conditions") or ():
        if isinstance(entry, Mapping) and entry.get("type") == kind:
            return entry
    return None


def judge_job(job: Mapping[str, Any] | None, events: Sequence[Mapping[str, Any]]) -> Outcome:
    """An accepted job must have a state (or a blocked condition, or Failed with a reason and a message)
    and at least one Event. A job already gone was deleted by its TTL after it finished; its Events
    remain."""
    if job is None:
        return Outcome("deleted", None if events else "deleted without any Event")
    status = job.get("status") or {}
    state = status.get("state")
    created = _condition(status, "Created")
    blocked = bool(created and created.get("status") == "False" and created.get("reason") == "FailedCreate")
    if state == "Failed":
        label = f"Failed/{status.get('failureReason') or '?'}"
        if not status.get("message") or not status.get("failureReason"):
            return Outcome(label, "Failed without a failureReason and a message")
    elif blocked:
        label = "blocked"
        if not (created or {}).get("message"):
            return Outcome(label, "Created=False FailedCreate without a message")
    elif state:
        label = str(state)
    else:
        return Outcome("no-state", "no state and no blocked condition")
    if not events:
        return Outcome(label, "no Event")
    return Outcome(label, None)


def events_by_uid(events: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for event in events:
        uid = str((event.get("involvedObject") or {}).get("uid", ""))
        grouped.setdefault(uid, []).append(event)
    return grouped


# ---------------------------------------------------------------------------------------- log lines


@dataclass(frozen=True)
class LogProblem:
    namespace: str
    name: str
    message: str


def log_problems(entries: Iterable[Mapping[str, Any]], justified: Sequence[str] = ()) -> list[LogProblem]:
    """Operator log entries that are ERROR lines or carry a traceback, except those whose message
    contains one of the `justified` fragments."""
    problems: list[LogProblem] = []
    for entry in entries:
        level = str(entry.get("level", "")).upper()
        trace = str(entry.get("exc_info", ""))
        if level not in ("ERROR", "CRITICAL") and "Traceback" not in trace:
            continue
        message = str(entry.get("message", ""))
        if any(fragment in message for fragment in justified):
            continue
        summary = message if not trace else f"{message} | {trace.strip().splitlines()[-1]}"
        problems.append(
            LogProblem(str(entry.get("namespace", "")), str(entry.get("name", "")), summary[:500])
        )
    return problems


# ------------------------------------------------------------------------------------- write budget

# Writes a job may cost beyond its pods: ServiceAccount, Role, RoleBinding, ConfigMap, two Services, a
# claim, their Events, status patches for each transition and a blocked or failed report.
WRITES_PER_JOB = 40
# Per pod: the create, its Event, a delete on failure or restart.
WRITES_PER_POD = 3


def write_budget(manifests: Iterable[Mapping[str, Any]]) -> int:
    """The most writes (POST, PUT, PATCH, DELETE) the operator may need to bring these jobs to their
    outcome; far more means a write loop."""
    total = 0
    for manifest in manifests:
        spec = manifest.get("spec") or {}
        workers = spec.get("numWorkers")
        pods = workers if isinstance(workers, int) and 0 < workers <= 1000 else 1
        total += WRITES_PER_JOB + WRITES_PER_POD * pods
    return total
