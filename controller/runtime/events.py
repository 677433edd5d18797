"""Kubernetes Events for TrainingJobs, written off the reconcile path and aggregated like client-go's.

Why this module exists: `kubectl describe trainingjob` is where users look first, and it shows core/v1
Events. Writing them must never slow down or break a reconcile, and a job that fails the same way
every few seconds must not flood the API server with thousands of Event objects. So:

- `record()` only appends to a bounded in-memory queue: it never blocks and never raises. When the
  queue is full the event is dropped, counted (`dropped`, the `on_drop` hook) and logged once per
  burst (a burst ends when the queue has drained to half).
- `writers` daemon threads write the queue through their own `KubeClient` (whose retries cover
  transient failures). Events are sharded by the object they are about: one object's Events are
  written in order by one thread, which also keeps that object's repeat bookkeeping.
- Repeats are folded the way client-go's EventCorrelator does: the same (object, type, reason, message)
  seen again within `window` seconds of its previous occurrence PATCHes the existing Event's `count`
  and `lastTimestamp` instead of creating another; if that Event is gone (404) it is created again.
  Once `max_similar` different messages with the same (object, type, reason) arrived within the window,
  every further one folds into a single Event whose message starts with "(combined from similar
  events): ", until that kind of event has been quiet for the window.
- Event names are "<object name>.<16 hex digits of the Unix time in nanoseconds>", unique per recorder.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, Protocol

from controller.runtime.client import PatchType
from controller.runtime.clock import Clock, RealClock, rfc3339
from controller.runtime.errors import AlreadyExists, KubeError, NotFound
from controller.runtime.resource import EVENTS, Resource

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
EventType = Literal["Normal", "Warning"]
EVENT_TYPES: Final = ("Normal", "Warning")

MESSAGE_LIMIT_BYTES: Final = 1024
DEFAULT_WINDOW_SECONDS: Final = 600.0
DEFAULT_MAX_SIMILAR: Final = 10
DEFAULT_CACHE_SIZE: Final = 4096
COMBINED_PREFIX: Final = "(combined from similar events): "
# Events about cluster-scoped objects go to this namespace, as client-go does.
CLUSTER_EVENTS_NAMESPACE: Final = "default"


class EventSink(Protocol):
    """What the recorder needs from `KubeClient`."""

    def create(self, res: Resource, ns: str | None, body: JsonObject) -> JsonObject: ...

    def patch(
        self, res: Resource, ns: str | None, name: str, body: JsonObject, *, patch_type: PatchType = "merge"
    ) -> JsonObject: ...


def truncate_message(message: str, limit: int = MESSAGE_LIMIT_BYTES) -> str:
    """Cuts `message` to at most `limit` UTF-8 bytes without splitting a character."""
    encoded = message.encode()
    if len(encoded) <= limit:
        return message
    return encoded[:limit].decode(errors="ignore")


@dataclass(frozen=True)
class _Pending:
    """One `record()` call, captured with the time it happened."""

    involved: dict[str, str]
    namespace: str
    type_: str
    reason: str
    message: str
    at: datetime
    monotonic: float


@dataclass
class _Written:
    """The Event a repeat should update."""

    name: str
    namespace: str
    count: int
    first_timestamp: str
    last_seen: float


@dataclass
class _Similar:
    messages: set[str]
    last_seen: float


def _involved_object(obj: Mapping[str, Any]) -> dict[str, str]:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping) or not metadata.get("name"):
        raise ValueError("the object has no metadata.name")
    involved = {
        "apiVersion": str(obj.get("apiVersion") or ""),
        "kind": str(obj.get("kind") or ""),
        "name": str(metadata["name"]),
        "namespace": str(metadata.get("namespace") or ""),
        "uid": str(metadata.get("uid") or ""),
        "resourceVersion": str(metadata.get("resourceVersion") or ""),
    }
    return {key: value for key, value in involved.items() if value}


class EventRecorder:
    """Records core/v1 Events about objects; thread-safe, one per process."""

    def __init__(
        self,
        client: EventSink,
        component: str,
        host: str | None = None,
        clock: Clock | None = None,
        max_queue: int = 1000,
        *,
        window: float = DEFAULT_WINDOW_SECONDS,
        max_similar: int = DEFAULT_MAX_SIMILAR,
        cache_size: int = DEFAULT_CACHE_SIZE,
        on_drop: Callable[[], None] | None = None,
        start: bool = True,
        writers: int = 1,
    ) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        if writers < 1:
            raise ValueError("writers must be at least 1")
        self._clock: Clock = clock or RealClock()
        self._max_queue = max_queue
        self._on_drop = on_drop

        # One lock; each writer waits on its own condition, so an Event wakes only the thread that
        # writes it (a shared one woke every idle writer for each Event: GIL hand-offs for nothing), and
        # `flush` waits on `_drained`.
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)
        self._shards = [
            _Shard(
                client,
                component,
                host if host is not None else socket.gethostname(),
                window=window,
                max_similar=max(1, max_similar),
                # The repeat bookkeeping is per writer thread; together they remember `cache_size` Events.
                cache_size=max(1, cache_size // writers),
                lock=self._lock,
            )
            for _ in range(writers)
        ]
        self._queued = 0
        self._closed = False
        self._busy = 0
        self._dropping = False
        self._dropped = 0
        self._threads: list[threading.Thread] = []

        if start:
            self.start()

    @property
    def dropped(self) -> int:
        """Events dropped because the queue was full."""
        with self._lock:
            return self._dropped

    @property
    def pending(self) -> int:
        """Events recorded and not yet written: queued, or being written right now."""
        with self._lock:
            return self._queued + self._busy

    def start(self) -> None:
        """Starts the writer thread (done by the constructor unless `start=False`)."""
        with self._lock:
            if self._threads or self._closed:
                return
            for index, shard in enumerate(self._shards):
                thread = threading.Thread(
                    target=self._run, args=(shard,), name=f"event-recorder-{index}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def record(self, obj: Mapping[str, Any], type_: EventType, reason: str, message: str) -> None:
        """Queues an Event about `obj` (a dict with apiVersion, kind and metadata). Never blocks or raises."""
        try:
            if type_ not in EVENT_TYPES:
                logger.error(
                    "not recording an event of unsupported type", extra={"type": type_, "reason": reason}
                )
                return
            involved = _involved_object(obj)
            pending = _Pending(
                involved=involved,
                namespace=involved.get("namespace") or CLUSTER_EVENTS_NAMESPACE,
                type_=type_,
                reason=reason,
                message=truncate_message(message),
                at=self._clock.now(),
                monotonic=self._clock.monotonic(),
            )
        except Exception:
            logger.exception("not recording an event about a malformed object", extra={"reason": reason})
            return
        dropped_now = False
        with self._lock:
            if self._closed:
                logger.debug("event recorder stopped; dropping event", extra={"reason": reason})
                return
            if self._queued >= self._max_queue:
                self._dropped += 1
                dropped_now = True
                first_of_burst = not self._dropping
                self._dropping = True
            else:
                if self._queued <= self._max_queue // 2:
                    self._dropping = False
                shard = self._shards[hash((pending.namespace, involved.get("name"))) % len(self._shards)]
                shard.queue.append(pending)
                self._queued += 1
                shard.arrived.notify()
        if dropped_now:
            if first_of_burst:
                logger.warning(
                    "event queue is full; dropping events until it drains",
                    extra={"reason": reason, "object": involved.get("name"), "max_queue": self._max_queue},
                )
            if self._on_drop is not None:
                try:
                    self._on_drop()
                except Exception:
                    logger.exception("event drop hook failed")

    def flush(self, timeout: float) -> bool:
        """Waits until every queued event has been written (or given up on); False on timeout."""
        with self._lock:
            return self._drained.wait_for(lambda: not self._queued and not self._busy, timeout)

    def stop(self, timeout: float = 10.0) -> bool:
        """Refuses new events, writes those already queued, and stops the writer thread.

        Returns True when everything queued was handled within `timeout` seconds.
        """
        with self._lock:
            self._closed = True
            for shard in self._shards:
                shard.arrived.notify()
            threads = list(self._threads)
        deadline = self._clock.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - self._clock.monotonic()))
            if thread.is_alive():
                return False
        with self._lock:
            return not self._queued

    # ---- writer thread ----------------------------------------------------------------------------

    def _run(self, shard: _Shard) -> None:
        while True:
            with self._lock:
                while not shard.queue and not self._closed:
                    shard.arrived.wait()
                if not shard.queue:
                    return
                pending = shard.queue.popleft()
                self._queued -= 1
                self._busy += 1
            try:
                shard.write(pending)
            except Exception:
                logger.exception(
                    "writing an event failed",
                    extra={"reason": pending.reason, "object": pending.involved["name"]},
                )
            finally:
                with self._lock:
                    self._busy -= 1
                    if not self._queued and not self._busy:
                        self._drained.notify_all()


class _Shard:
    """One writer thread's queue, and the repeat bookkeeping and API writes for the objects it owns
    (only that thread touches them)."""

    def __init__(
        self,
        client: EventSink,
        component: str,
        host: str,
        *,
        window: float,
        max_similar: int,
        cache_size: int,
        lock: threading.Lock,
    ) -> None:
        self._client = client
        self._component = component
        self._host = host
        self._window = window
        self._max_similar = max_similar
        self._cache_size = cache_size
        self.queue: deque[_Pending] = deque()
        # Signalled (under the recorder's lock) when this writer has an Event to write, or must stop.
        self.arrived = threading.Condition(lock)
        self.written: OrderedDict[tuple[str, ...], _Written] = OrderedDict()
        self.similar: OrderedDict[tuple[str, ...], _Similar] = OrderedDict()
        self.last_nanos = 0

    def _object_key(self, pending: _Pending) -> tuple[str, ...]:
        involved = pending.involved
        return (
            involved.get("uid", ""),
            involved.get("apiVersion", ""),
            involved.get("kind", ""),
            pending.namespace,
            involved["name"],
            pending.type_,
            pending.reason,
        )

    def _correlate(self, pending: _Pending) -> tuple[tuple[str, ...], str]:
        """Returns the repeat key and the message to write.

        Once `max_similar` different messages of one (object, type, reason) arrived within the window,
        every further one goes to a single combined Event, until that kind stays quiet for the window.
        """
        similar_key = self._object_key(pending)
        similar = self.similar.get(similar_key)
        if similar is None or pending.monotonic - similar.last_seen > self._window:
            similar = _Similar(set(), pending.monotonic)
        similar.last_seen = pending.monotonic
        if len(similar.messages) < self._max_similar:
            similar.messages.add(pending.message)
        self._remember(self.similar, similar_key, similar)
        if len(similar.messages) >= self._max_similar:
            # A longer key than any single message's, so the two can never collide.
            return (*similar_key, "", "combined"), truncate_message(COMBINED_PREFIX + pending.message)
        return (*similar_key, pending.message), pending.message

    def _remember(
        self, cache: OrderedDict[tuple[str, ...], Any], key: tuple[str, ...], value: object
    ) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > self._cache_size:
            cache.popitem(last=False)

    def _new_name(self, pending: _Pending) -> str:
        nanos = max(int(pending.at.timestamp() * 1_000_000_000), self.last_nanos + 1)
        self.last_nanos = nanos
        return f"{pending.involved['name']}.{nanos:016x}"

    def write(self, pending: _Pending) -> None:
        key, message = self._correlate(pending)
        timestamp = rfc3339(pending.at)
        previous = self.written.get(key)
        if previous is not None and pending.monotonic - previous.last_seen <= self._window:
            count = previous.count + 1
            patch = {"count": count, "lastTimestamp": timestamp, "message": message}
            try:
                answer = self._client.patch(EVENTS, previous.namespace, previous.name, patch)
            except NotFound:
                # Deleted meanwhile (expired or removed): write it again under the same name.
                body = self._event(
                    pending,
                    name=previous.name,
                    message=message,
                    count=count,
                    first=previous.first_timestamp,
                    last=timestamp,
                )
                self._create(key, pending, body)
                return
            except KubeError as error:
                self._log_failure("patching", pending, error)
                return
            self._remember_written(
                key, pending, answer, name=previous.name, count=count, first=previous.first_timestamp
            )
            return
        body = self._event(
            pending,
            name=self._new_name(pending),
            message=message,
            count=1,
            first=timestamp,
            last=timestamp,
        )
        self._create(key, pending, body)

    def _create(self, key: tuple[str, ...], pending: _Pending, body: JsonObject) -> None:
        try:
            answer = self._client.create(EVENTS, pending.namespace, body)
        except AlreadyExists:
            logger.debug("event already exists", extra={"event": body["metadata"]["name"]})
            return
        except KubeError as error:
            self._log_failure("creating", pending, error)
            return
        self._remember_written(
            key,
            pending,
            answer,
            name=body["metadata"]["name"],
            count=body["count"],
            first=body["firstTimestamp"],
        )

    def _remember_written(
        self,
        key: tuple[str, ...],
        pending: _Pending,
        answer: JsonObject,
        *,
        name: str,
        count: int,
        first: str,
    ) -> None:
        metadata = answer.get("metadata") if isinstance(answer, dict) else None
        if isinstance(metadata, dict) and isinstance(metadata.get("name"), str) and metadata["name"]:
            name = metadata["name"]
        self._remember(self.written, key, _Written(name, pending.namespace, count, first, pending.monotonic))

    def _event(
        self, pending: _Pending, *, name: str, message: str, count: int, first: str, last: str
    ) -> JsonObject:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": pending.namespace},
            "involvedObject": dict(pending.involved),
            "reason": pending.reason,
            "message": message,
            "type": pending.type_,
            "source": {"component": self._component, "host": self._host},
            "reportingComponent": self._component,
            "reportingInstance": self._host,
            "firstTimestamp": first,
            "lastTimestamp": last,
            "count": count,
        }

    def _log_failure(self, action: str, pending: _Pending, error: KubeError) -> None:
        logger.warning(
            "%s an event failed; dropping it",
            action,
            extra={
                "reason": pending.reason,
                "object": pending.involved["name"],
                "namespace": pending.namespace,
                "error": str(error),
            },
        )
