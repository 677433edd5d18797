"""What a failed end-to-end test's report says about the cluster and the operator, kept short.

Why: CI keeps no files, and what it prints of a long failure report is its beginning and its end.
A failure on the real node is only explainable with the job's story: the operator's decisions (its
INFO and WARNING lines, not thousands of DEBUG ones), the Events of the test's namespace, and how
each pod ended (phase, exit codes, a deletion). These pure functions turn raw log lines, Events and
pods into a few lines each; tests/e2e/conftest.py attaches them to the report.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

JsonDict = dict[str, Any]


def _log_entry(line: str) -> tuple[str, str] | None:
    """(level, one short line) for a log line; None for urllib3's connection bookkeeping."""
    try:
        entry = json.loads(line)
    except ValueError:
        return "", line
    if not isinstance(entry, dict):
        return "", line
    message = str(entry.get("message", ""))
    if entry.get("logger") == "urllib3.util.retry" or message.startswith("Starting new"):
        return None
    job = f" {entry['namespace']}/{entry['name']}" if entry.get("name") else ""
    text = f"{entry.get('time', '')} {entry.get('level', '')}{job} {message}"
    if entry.get("exc_info"):
        text += "\n" + str(entry["exc_info"])
    return str(entry.get("level", "")), text


def log_digest(lines: Sequence[str], decisions: int = 120, tail: int = 25) -> str:
    """The operator's story in a log's `lines`: its last `decisions` lines above DEBUG (state changes,
    writes, warnings), then its last `tail` lines of any level, one short line per entry."""
    entries = [entry for entry in map(_log_entry, lines) if entry is not None]
    head = [text for level, text in entries[:-tail] if level != "DEBUG"][-decisions:]
    end = [text for _, text in entries[-tail:]]
    skipped = len(entries) - tail - len(head)
    return "\n".join([*head, *([f"[... {skipped} DEBUG lines above ...]"] if skipped > 0 else []), *end])


def _when(event: Mapping[str, Any]) -> str:
    return str(
        event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
    )


def events_digest(events: Iterable[Mapping[str, Any]]) -> str:
    """One line per Event, oldest first: time, type, reason, object, count and message."""
    lines = []
    for event in sorted(events, key=_when):
        involved = event.get("involvedObject") or {}
        count = event.get("count") or (event.get("series") or {}).get("count") or 1
        repeated = f" (x{count})" if count > 1 else ""
        lines.append(
            f"{_when(event)} {event.get('type', '')} {event.get('reason', '')} "
            f"{involved.get('kind', '')}/{involved.get('name', '')}{repeated}: {event.get('message', '')}"
        )
    return "\n".join(lines) or "(no Events)"


def _container_state(entry: Mapping[str, Any]) -> str:
    state = entry.get("state") or {}
    if "terminated" in state:
        ended = state["terminated"]
        return f"terminated exit {ended.get('exitCode')} {ended.get('reason', '')}".rstrip()
    if "waiting" in state:
        return f"waiting {state['waiting'].get('reason', '')}".rstrip()
    return "running" if "running" in state else "unknown"


def pods_digest(pods: Iterable[Mapping[str, Any]]) -> str:
    """One line per pod: name, phase, node, deletion, and each container's state and restarts."""
    lines = []
    for pod in sorted(pods, key=lambda pod: str(pod["metadata"]["name"])):
        metadata, status = pod["metadata"], pod.get("status") or {}
        deleting = (
            f" deleting since {metadata['deletionTimestamp']}" if metadata.get("deletionTimestamp") else ""
        )
        containers = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
        states = ", ".join(
            f"{entry.get('name')}: {_container_state(entry)}"
            + (f" (restarts {entry['restartCount']})" if entry.get("restartCount") else "")
            for entry in containers
        )
        node = (pod.get("spec") or {}).get("nodeName") or "unscheduled"
        states = states or "no containers yet"
        lines.append(f"{metadata['name']} {status.get('phase', '')} on {node}{deleting}; {states}")
    return "\n".join(lines) or "(no pods)"
