"""What the informer caches cannot tell a controller: its own writes they have not shown yet, and the
last states of objects they no longer hold.

Both are fed by informer event handlers and read by reconciles, so they are thread-safe and keyed by
the owning object's key (namespace/name):

* `StatusWrites` remembers the resourceVersion of the last status this process wrote for a key; a
  reconcile acting on a cache older than its own write would undo or repeat it.
* `Tombstones` keeps the final state of deleted objects for a while: a pod marked DisruptionTarget
  and deleted a moment later is gone from the cache before the next reconcile, and only its last
  state says why (client-go hands a delete handler that final state for the same reason).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from controller.runtime.clock import Clock

JsonDict = dict[str, Any]


class StatusWrites:
    """Which status write of ours the job cache has not shown yet (by resourceVersion), per job.

    The informer reports every resourceVersion it delivers (`observed`); a reconcile proceeds only
    when the last version we wrote has been seen, or after `ttl` seconds in case it never is (a
    relist may skip it). A reconcile turned away by `settled` leaves the key to the watch event that
    delivers the write: `observed` says True for that event, so it can be put ahead of other work.
    """

    def __init__(self, clock: Clock, ttl: float = 30.0) -> None:
        self._clock = clock
        self._ttl = ttl
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[str, float]] = {}
        self._awaited: set[str] = set()  # keys whose reconcile was turned away by `settled`
        self._seen: dict[str, collections.deque[str]] = collections.defaultdict(
            lambda: collections.deque(maxlen=16)
        )

    def observed(self, key: str, resource_version: str) -> bool:
        """Records a version of `key` seen on the watch; True if it is our pending write and a reconcile
        was turned away waiting for it."""
        with self._lock:
            self._seen[key].append(resource_version)
            pending = self._pending.get(key)
            if pending is not None and pending[0] == resource_version:
                del self._pending[key]
                if key in self._awaited:
                    self._awaited.discard(key)
                    return True
            return False

    def wrote(self, key: str, resource_version: str) -> None:
        with self._lock:
            if resource_version not in self._seen[key]:
                self._pending[key] = (resource_version, self._clock.monotonic())

    def settled(self, key: str) -> bool:
        with self._lock:
            pending = self._pending.get(key)
            if pending is None:
                return True
            if self._clock.monotonic() - pending[1] > self._ttl:
                del self._pending[key]
                self._awaited.discard(key)
                return True
            self._awaited.add(key)
            return False

    def forget(self, key: str) -> None:
        with self._lock:
            self._pending.pop(key, None)
            self._awaited.discard(key)
            self._seen.pop(key, None)


class Tombstones:
    """The last states of objects deleted recently, per owner key; the delete handler chooses which.

    The controller records pods whose end says why they went (a disruption or a failure): a preempted
    pod is marked DisruptionTarget and deleted within moments, and a reconcile running after the
    delete finds its rank simply missing. These last states let the planner still classify that end.
    They expire after `ttl` seconds; recording sweeps out expired ones of every key now and then, so a
    standby, which records but never reconciles, holds no more than that.

    `__len__` counts what is held, so an empty instance is falsy: never write `tombstones or ...`.
    """

    def __init__(self, clock: Clock, ttl: float = 600.0) -> None:
        self._clock = clock
        self._ttl = ttl
        self._lock = threading.Lock()
        self._objects: dict[str, list[tuple[float, JsonDict]]] = {}
        self._swept_at = clock.monotonic()

    def record(self, key: str, obj: JsonDict) -> None:
        with self._lock:
            now = self._clock.monotonic()
            if now - self._swept_at >= self._ttl / 10:
                self._swept_at = now
                for stale in list(self._objects):
                    self._prune(stale, now)
            self._objects.setdefault(key, []).append((now, obj))

    def recent(self, key: str) -> list[JsonDict]:
        with self._lock:
            return [obj for _, obj in self._prune(key, self._clock.monotonic())]

    def _prune(self, key: str, now: float) -> list[tuple[float, JsonDict]]:
        kept = [(at, obj) for at, obj in self._objects.get(key, []) if at >= now - self._ttl]
        if kept:
            self._objects[key] = kept
        else:
            self._objects.pop(key, None)
        return kept

    def __len__(self) -> int:
        with self._lock:
            return sum(len(objects) for objects in self._objects.values())

    def forget(self, key: str) -> None:
        with self._lock:
            self._objects.pop(key, None)
