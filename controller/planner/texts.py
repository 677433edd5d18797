"""The texts the planner writes: durations, and messages and reasons cut to what the API accepts.

Status fields have maximum lengths (crd/schema_status.py) and an Event message a maximum size (1 KiB,
controller.runtime.events). A text built from something outside the operator (an API server's error,
a container's termination message, a key of a free-form field) can be any length, and a status PATCH
with one field too long is refused whole, leaving the job with no state at all. So every text the
planner writes goes through `message`, `reason` or `event_message`, which cut it with a visible
marker.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final

from controller.runtime.events import MESSAGE_LIMIT_BYTES
from crd.schema_status import MESSAGE_LENGTH, REASON_LENGTH

MARKER: Final = "..."
# status.message and condition messages: long enough for a termination message (the kubelet keeps
# 4 KiB of it) and the description around it, well within the schema's maximum.
MESSAGE_LIMIT: Final = min(8192, MESSAGE_LENGTH)
REASON_LIMIT: Final = REASON_LENGTH

# Create failures named in a status message; the rest are counted. Every pod of a job fails the same
# way (a missing PriorityClass, an invalid affinity), and a 100-worker job must not write 100 copies.
MAX_LISTED_PROBLEMS: Final = 3
MAX_PROBLEM_TEXT: Final = 4096

# Objects named in one Event about the objects a reconcile wrote, per kind; the rest are counted.
MAX_LISTED_OBJECTS: Final = 8

# Longer durations are written as this many hours (a limit no real job reaches, far below overflow).
_MAX_DURATION_SECONDS: Final = 10**15


def bounded(text: str, limit: int) -> str:
    """`text` when it has at most `limit` characters, else its start and MARKER, `limit` in all."""
    if len(text) <= limit:
        return text
    return text[: limit - len(MARKER)] + MARKER


def message(text: str) -> str:
    return bounded(text, MESSAGE_LIMIT)


def reason(text: str) -> str:
    return bounded(text, REASON_LIMIT)


def event_message(text: str) -> str:
    """`text` cut to an Event's size in UTF-8 bytes (never splitting a character), with MARKER."""
    encoded = text.encode()
    if len(encoded) <= MESSAGE_LIMIT_BYTES:
        return text
    kept = encoded[: MESSAGE_LIMIT_BYTES - len(MARKER)].decode(errors="ignore")
    return kept + MARKER


def summary(problems: Iterable[str]) -> str:
    """The problems sorted (pods are created concurrently: an unchanged problem must read the same),
    the first few in full, the others counted."""
    ordered = sorted(set(problems))
    text = "; ".join(ordered[:MAX_LISTED_PROBLEMS])
    if len(ordered) > MAX_LISTED_PROBLEMS:
        text += f"; and {len(ordered) - MAX_LISTED_PROBLEMS} more"
    return bounded(text, MAX_PROBLEM_TEXT)


def format_duration(seconds: float) -> str:
    """1h2m3s, 4m5s or 6s; negative durations are 0s, endless ones the longest writable."""
    if math.isnan(seconds):
        seconds = 0.0
    remaining = int(min(max(0.0, seconds), _MAX_DURATION_SECONDS))
    hours, remaining = divmod(remaining, 3600)
    minutes, secs = divmod(remaining, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def objects_listed(objects: Sequence[tuple[str, str]]) -> str:
    """(kind, name) pairs as one sentence, kinds in alphabetical order and pods last, names sorted the
    way ranks count (worker-2 before worker-10): "configmap: a-config; services: a-headless, a-master;
    pods: a-worker-0, a-worker-1". Objects are written in parallel, so the order they were written in
    must not show. Beyond MAX_LISTED_OBJECTS of a kind, the first ones and the last are named and the
    rest counted, so a 100-worker gang stays one readable Event."""
    by_kind: dict[str, list[str]] = {}
    for kind, name in objects:
        by_kind.setdefault(kind.lower(), []).append(name)
    parts = []
    for kind, names in sorted(by_kind.items(), key=lambda item: (item[0] == "pod", item[0])):
        ordered = sorted(set(names), key=_natural)
        label = kind if len(ordered) == 1 else f"{kind}s"
        if len(ordered) > MAX_LISTED_OBJECTS:
            shown = f"{', '.join(ordered[: MAX_LISTED_OBJECTS - 1])}, ... {ordered[-1]} ({len(ordered)})"
        else:
            shown = ", ".join(ordered)
        parts.append(f"{label}: {shown}")
    return event_message("; ".join(parts))


def _natural(name: str) -> tuple[str, int]:
    stem, _, number = name.rpartition("-")
    return (stem, int(number)) if number.isdigit() else (name, -1)
