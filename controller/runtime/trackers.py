"""What the informer caches cannot tell a controller: its own writes they have not shown yet.

`StatusWrites` remembers the resourceVersion of the last status this process wrote for a key
(namespace/name); a reconcile acting on a cache older than its own write would undo or repeat it. It
is fed by the job informer's handler and read by reconciles, so it is thread-safe. (The last states of
deleted pods need no tracker: the tracking finalizer keeps them in the cache, planner/tracking.py.)
"""

from __future__ import annotations

import collections
import threading

from controller.runtime.clock import Clock


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
