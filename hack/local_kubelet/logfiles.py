"""Container logs on disk the way a kubelet keeps them, and read back the way the kubelet API serves them.

Why: `kubectl logs` asks the API server, which asks the kubelet of the pod's node for one container's
log (`/containerLogs/<ns>/<pod>/<container>`) with options (follow, tailLines, sinceSeconds,
timestamps, limitBytes, previous). To answer like a kubelet, the output of every container instance
is kept apart, each line with the time it was written and its stream, in the CRI log format
container runtimes write (`<RFC 3339 time> stdout|stderr F|P <text>`; P marks a partial line):

    <log-dir>/<ns>_<pod>_<uid>/pod.json                 which pod this was, when it started
    <log-dir>/<ns>_<pod>_<uid>/<container>/<n>.log      instance n (its restart count), CRI format
    <log-dir>/<ns>_<pod>_<uid>/<container>/<n>.exit     its exit code, once it has ended

Beside them stays each pod's journal, `<log-dir>/<ns>_<pod>.log`: every container's plain output and
the local kubelet's own lines about it, appended across attempts, for people reading files.

Standard library only: the log writer (hack/local_kubelet/shim.py) imports it too.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

LINE_MAX: Final = 16 * 1024  # longer lines are split into partial records, as container runtimes do
FOLLOW_POLL_SECONDS: Final = 0.2
STREAMS: Final = {"All": ("stdout", "stderr"), "Stdout": ("stdout",), "Stderr": ("stderr",)}
_TRUE: Final = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE: Final = {"0", "f", "F", "false", "FALSE", "False"}
_RECORD: Final = re.compile(rb"^(\S+) (stdout|stderr) (F|P) (.*)$", re.DOTALL)


def timestamp(nanoseconds: int) -> str:
    """RFC 3339 in UTC with nine fractional digits, as kubelets print it (fixed width, so these
    strings sort like the times they name)."""
    seconds, fraction = divmod(nanoseconds, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{fraction:09d}Z"


def format_record(nanoseconds: int, stream: str, chunk: bytes) -> bytes:
    """One CRI log line for `chunk` (a line with its newline, or a partial line without one)."""
    full = chunk.endswith(b"\n")
    content = chunk[:-1] if full else chunk
    return f"{timestamp(nanoseconds)} {stream} {'F' if full else 'P'} ".encode() + content + b"\n"


@dataclass(frozen=True)
class Record:
    time: str
    stream: str
    partial: bool
    content: bytes

    def output(self, timestamps: bool) -> bytes:
        prefix = f"{self.time} ".encode() if timestamps else b""
        return prefix + self.content + (b"" if self.partial else b"\n")


def parse_record(line: bytes) -> Record | None:
    """A CRI log line (without its newline), or None when it is not one."""
    match = _RECORD.match(line)
    if match is None:
        return None
    stamp, stream, tag, content = match.groups()
    return Record(stamp.decode(), stream.decode(), tag == b"P", content)


# ------------------------------------------------------------------------------------------ options


class BadOptions(ValueError):
    """Query parameters the kubelet API refuses; the message says which."""


@dataclass(frozen=True)
class LogOptions:
    """PodLogOptions as the API server passes them to a kubelet."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    since: str | None = None  # records at or after this time (timestamp() format)
    tail_lines: int | None = None
    limit_bytes: int | None = None
    streams: tuple[str, ...] = STREAMS["All"]


def _flag(query: Mapping[str, Sequence[str]], name: str) -> bool:
    values = query.get(name) or []
    if not values:
        return False
    value = values[-1]
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise BadOptions(f"{name}: invalid boolean {value!r}")


def _number(query: Mapping[str, Sequence[str]], name: str, minimum: int) -> int | None:
    values = query.get(name) or []
    if not values:
        return None
    try:
        number = int(values[-1])
    except ValueError:
        raise BadOptions(f"{name}: not an integer: {values[-1]!r}") from None
    if number < minimum:
        raise BadOptions(f"{name}: must be at least {minimum}")
    return number


def parse_options(query: Mapping[str, Sequence[str]], now_ns: int) -> LogOptions:
    """The options of a /containerLogs request (BadOptions for values a kubelet refuses)."""
    tail = query.get("tail")
    if tail:  # the kubelet's older name for tailLines; "all" means no limit
        query = {**query, "tailLines": [] if tail[-1] == "all" else list(tail)}
    since_seconds = _number(query, "sinceSeconds", 1)
    since_time = (query.get("sinceTime") or [""])[-1]
    if since_seconds is not None and since_time:
        raise BadOptions("at most one of sinceTime or sinceSeconds may be specified")
    since = None
    if since_seconds is not None:
        since = timestamp(now_ns - since_seconds * 1_000_000_000)
    elif since_time:
        try:
            moment = datetime.fromisoformat(since_time.replace("Z", "+00:00"))
        except ValueError:
            raise BadOptions(f"sinceTime: not an RFC 3339 time: {since_time!r}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        since = timestamp(int(moment.timestamp()) * 1_000_000_000)
    stream = (query.get("stream") or ["All"])[-1]
    if stream not in STREAMS:
        raise BadOptions(f"invalid stream type {stream!r}")
    return LogOptions(
        follow=_flag(query, "follow"),
        previous=_flag(query, "previous"),
        timestamps=_flag(query, "timestamps"),
        since=since,
        tail_lines=_number(query, "tailLines", 0),
        limit_bytes=_number(query, "limitBytes", 1),
        streams=STREAMS[stream],
    )


# ------------------------------------------------------------------------------------------ layout


@dataclass(frozen=True)
class PodLogs:
    """Where the container logs of the pods run with this log directory are."""

    root: Path

    def journal(self, namespace: str, pod: str) -> Path:
        return self.root / f"{namespace}_{pod}.log"

    def pod_dir(self, namespace: str, pod: str, uid: str) -> Path:
        return self.root / f"{namespace}_{pod}_{uid}"

    def instance(self, namespace: str, pod: str, uid: str, container: str, restart: int) -> Path:
        return self.pod_dir(namespace, pod, uid) / container / f"{restart}.log"

    def register(self, namespace: str, pod: str, uid: str, attempt: str) -> None:
        """Records which pod a log directory belongs to and when it started (orders attempts)."""
        directory = self.pod_dir(namespace, pod, uid)
        directory.mkdir(parents=True, exist_ok=True)
        meta = directory / "pod.json"
        if not meta.exists():
            record = {
                "namespace": namespace,
                "name": pod,
                "uid": uid,
                "attempt": attempt,
                "started": time.time_ns(),
            }
            meta.write_text(json.dumps(record))

    def instances(self, namespace: str, pod: str, uid: str, container: str) -> list[Path]:
        """The logs of `container` in that pod, oldest first."""
        directory = self.pod_dir(namespace, pod, uid) / container
        found = [p for p in directory.glob("*.log") if p.stem.isdigit()] if directory.is_dir() else []
        return sorted(found, key=lambda p: int(p.stem))

    def earlier_pods(self, namespace: str, pod: str, uid: str) -> list[str]:
        """The uids of the pods of the same name that started before this one (earlier attempts of a
        job), newest first."""
        started: dict[str, int] = {}
        for directory in self.root.glob(f"{namespace}_{pod}_*"):
            try:
                meta = json.loads((directory / "pod.json").read_text())
            except (OSError, ValueError):
                continue
            if isinstance(meta, dict) and meta.get("name") == pod:
                started[str(meta.get("uid"))] = int(meta.get("started", 0))
        if uid not in started:
            return []
        earlier = [(when, other) for other, when in started.items() if when < started[uid]]
        return [other for _when, other in sorted(earlier, reverse=True)]

    def choose(self, namespace: str, pod: str, uid: str, container: str, previous: bool) -> Path | None:
        """The log to serve: the newest instance, or with `previous` the one before it (an earlier
        restart of the container in this pod, else its last run in the earlier pod of that name)."""
        current = self.instances(namespace, pod, uid, container)
        if not previous:
            return current[-1] if current else None
        if len(current) >= 2:
            return current[-2]
        for earlier in self.earlier_pods(namespace, pod, uid):
            logs = self.instances(namespace, pod, earlier, container)
            if logs:
                return logs[-1]
        return None


def exit_marker(log: Path) -> Path:
    return log.with_suffix(".exit")


def mark_exit(log: Path, code: int) -> None:
    """Says that the instance writing `log` has ended (a follower stops at the end of the log); the
    first word stays."""
    marker = exit_marker(log)
    if log.parent.is_dir() and not marker.exists():
        marker.write_text(f"{code}\n")


# ------------------------------------------------------------------------------------------ reading


def _records(data: bytes) -> tuple[list[Record], int]:
    """The records in `data` and how many bytes they took (a line being written is left for later)."""
    end = data.rfind(b"\n") + 1
    records = [r for line in data[:end].split(b"\n")[:-1] if (r := parse_record(line)) is not None]
    return records, end


def _selected(records: list[Record], options: LogOptions) -> list[Record]:
    chosen = [r for r in records if r.stream in options.streams]
    if options.since is not None:
        chosen = [r for r in chosen if r.time >= options.since]
    return chosen


class _Limit:
    def __init__(self, limit: int | None) -> None:
        self.left = limit

    def cut(self, data: bytes) -> bytes:
        if self.left is None:
            return data
        data = data[: self.left]
        self.left -= len(data)
        return data

    @property
    def reached(self) -> bool:
        return self.left is not None and self.left <= 0


def read_log(log: Path, options: LogOptions, stopped: Callable[[], bool] = lambda: False) -> Iterator[bytes]:
    """The log's output as the kubelet API serves it; with `follow`, new output as it is written until
    the instance has ended (its exit marker) or `stopped()` says the reader went away."""
    limit = _Limit(options.limit_bytes)
    with log.open("rb") as handle:
        records, used = _records(handle.read())
        handle.seek(used)
        chosen = _selected(records, options)
        if options.tail_lines is not None:
            chosen = chosen[len(chosen) - options.tail_lines :] if options.tail_lines else []
        for record in chosen:
            yield limit.cut(record.output(options.timestamps))
            if limit.reached:
                return
        if not options.follow:
            return
        pending = b""
        while not stopped():
            ended = exit_marker(log).exists()  # before reading: what was written until the end is read
            pending += handle.read()
            records, used = _records(pending)
            pending = pending[used:]
            for record in _selected(records, options):
                yield limit.cut(record.output(options.timestamps))
                if limit.reached:
                    return
            if ended and not records:
                return
            if not records:
                time.sleep(FOLLOW_POLL_SECONDS)
