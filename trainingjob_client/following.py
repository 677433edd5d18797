"""Following one TrainingJob with a watch on the API server: every status change, as it happens.

Why a watch and not a polling loop: a poll every second is a request per second per notebook, and
still misses what happens between two polls; a watch costs one open request and delivers every
change. The watch is scoped to the one object (fieldSelector metadata.name), resumed from the last
resourceVersion seen when the server ends it (its timeoutSeconds) and restarted from a fresh read
when that version has expired (410 Gone). A lost connection is retried a few times with backoff,
then reported as ClusterUnreachable. The server-side timeout of each watch is cut to what is left of
the caller's deadline, so a timeout is noticed without any timer of our own.

`JobWatch` is an iterator that another thread may `close()` (for example a watchdog that sees a
process die): the open watch request is shut down and the iteration ends.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Final

from controller.resources import TRAININGJOBS
from controller.runtime.client import KubeClient
from controller.runtime.clock import Clock, RealClock
from controller.runtime.errors import ApiError, Gone, KubeError, NotFound, TransportError
from controller.runtime.watch import WatchStream
from trainingjob_client.errors import JobDeleted, WaitTimeout, translate
from trainingjob_client.views import JsonDict, TrainingJob

# The API server ends a watch after its timeoutSeconds; client-go picks 5-10 minutes.
WATCH_SECONDS: Final = 300
# How much longer than the server's timeout the client waits for a byte before it gives up.
READ_GRACE_SECONDS: Final = 30.0
RECONNECT_ATTEMPTS: Final = 5
RECONNECT_INITIAL: Final = 0.5
RECONNECT_MAX: Final = 5.0


def format_seconds(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class JobWatch:
    """Iterates over `TrainingJob`s: the current one first, then one per change of its status.

    Ends after yielding a finished job (Completed or Failed) when `until_finished`, or when closed.
    Raises `WaitTimeout` once `timeout` seconds passed, `JobDeleted` when the job is deleted, and the
    client's other exceptions for API errors.
    """

    def __init__(
        self,
        kube: KubeClient,
        initial: JsonDict,
        *,
        timeout: float | None = None,
        until_finished: bool = True,
        clock: Clock | None = None,
        watch_seconds: int = WATCH_SECONDS,
        reconnect_initial: float = RECONNECT_INITIAL,
    ) -> None:
        self._kube = kube
        self._initial = initial
        self._clock: Clock = clock or RealClock()
        self._deadline = None if timeout is None else self._clock.monotonic() + timeout
        self.timeout = timeout
        self._until_finished = until_finished
        self._watch_seconds = watch_seconds
        self._reconnect_initial = reconnect_initial
        self._lock = threading.Lock()
        self._stream: WatchStream | None = None
        self._closed = threading.Event()
        self.last: TrainingJob = TrainingJob.from_dict(initial)
        self.namespace = self.last.namespace
        self.name = self.last.name
        self._events = self._follow()

    def __iter__(self) -> Iterator[TrainingJob]:
        return self

    def __next__(self) -> TrainingJob:
        return next(self._events)

    def close(self) -> None:
        """Ends the iteration; safe from any thread, also while it is blocked waiting for a change."""
        self._closed.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    # ---------------------------------------------------------------------------------------------

    def _follow(self) -> Iterator[TrainingJob]:
        job = self._initial
        yield self._seen(job)
        version = _version(job)
        stale = False
        failures = 0
        while not self._done() and not self._closed.is_set():
            if stale:  # the last version expired (410): read the job again and watch from there
                stale = False
                fresh = self._read()
                version = _version(fresh)
                changed, job = _changed(job, fresh), fresh
                if changed:
                    yield self._seen(job)
                continue
            try:
                for event_type, obj in self._watch(version, self._next_watch_seconds()):
                    failures = 0
                    version = _version(obj) or version
                    if event_type == "DELETED":
                        raise JobDeleted(self.namespace, self.name)
                    if event_type == "BOOKMARK":
                        continue
                    changed, job = _changed(job, obj), obj
                    if changed:
                        yield self._seen(job)
                        if self._done():
                            return
            except Gone:
                stale = True
            except TransportError as error:
                failures += 1
                if failures >= RECONNECT_ATTEMPTS:
                    raise self._translated(error) from None
                self._closed.wait(min(RECONNECT_MAX, self._reconnect_initial * 2 ** (failures - 1)))
            except ApiError as error:
                raise self._translated(error) from None

    def _translated(self, error: KubeError) -> Exception:
        return translate(error, namespace=self.namespace, name=self.name, host=self._kube.host)

    def _seen(self, job: JsonDict) -> TrainingJob:
        self.last = TrainingJob.from_dict(job)
        return self.last

    def _done(self) -> bool:
        return self._until_finished and self.last.status.finished

    def _next_watch_seconds(self) -> int:
        if self._deadline is None:
            return self._watch_seconds
        remaining = self._deadline - self._clock.monotonic()
        if remaining <= 0:
            assert self.timeout is not None
            raise WaitTimeout(
                f"TrainingJob {self.namespace}/{self.name} did not finish within "
                f"{format_seconds(self.timeout)}; it is {self.last.summary()}",
                self.last,
            )
        return max(1, min(self._watch_seconds, math.ceil(remaining)))

    def _watch(self, version: str, seconds: int) -> Iterator[tuple[str, JsonDict]]:
        stream = self._kube.watch(
            TRAININGJOBS,
            self.namespace,
            resource_version=version or None,
            field_selector=f"metadata.name={self.name}",
            timeout_seconds=seconds,
            read_timeout=seconds + READ_GRACE_SECONDS,
        )
        with self._lock:
            if self._closed.is_set():
                stream.close()
                return
            self._stream = stream
        try:
            yield from stream
        finally:
            with self._lock:
                self._stream = None
            stream.close()

    def _read(self) -> JsonDict:
        try:
            return self._kube.get(TRAININGJOBS, self.namespace, self.name)
        except NotFound:
            raise JobDeleted(self.namespace, self.name) from None
        except KubeError as error:
            raise self._translated(error) from None


def until_gone(watch: JobWatch) -> None:
    """Follows a job being deleted until it is gone; WaitTimeout if it is still there at the timeout."""
    try:
        for _ in watch:
            pass
    except JobDeleted:
        return
    except WaitTimeout:
        timeout = format_seconds(watch.timeout or 0)
        raise WaitTimeout(
            f"TrainingJob {watch.namespace}/{watch.name} was not gone within {timeout}", watch.last
        ) from None


def _changed(before: JsonDict, after: JsonDict) -> bool:
    """A new object, or another status (what a person watching cares about)."""
    uid = (before.get("metadata") or {}).get("uid")
    if uid != (after.get("metadata") or {}).get("uid"):
        return True
    return bool((before.get("status") or {}) != (after.get("status") or {}))


def _version(job: JsonDict) -> str:
    return str((job.get("metadata") or {}).get("resourceVersion") or "")
