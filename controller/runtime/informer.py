"""Keeps a local cache of one resource in step with the API server (client-go's reflector + informer).

Reconcilers must read from a cache, not the API server, and must hear about every change. This module
lists the resource once, then watches from the list's resourceVersion, applying each event to a
`Store` and telling registered handlers about adds, updates and deletes (delivery.py). It survives
everything a long-lived watch meets: server-side watch timeouts (re-watch from the last resourceVersion),
bookmarks (only advance the resourceVersion), expired resourceVersions (410 Gone: relist and
synthesise deletes for objects that vanished meanwhile), half-open connections (client read
timeout), API outages (capped, jittered exponential backoff) and malformed objects or failing
handlers (logged and skipped). It never dies while running; `stop()` ends it promptly even when it
is blocked reading a silent watch.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Final

from controller.runtime.client import KubeClient
from controller.runtime.clock import Clock, RealClock
from controller.runtime.delivery import (
    Delivery,
    KubeObject,
    OnAdd,
    OnDelete,
    OnUpdate,
    metadata_of,
    resource_version_of,
)
from controller.runtime.errors import Gone, KubeError
from controller.runtime.resource import Resource
from controller.runtime.store import Store
from controller.runtime.watch import WatchStream

logger = logging.getLogger(__name__)

# client-go treats a watch that ends within a second without delivering anything as a failure
# ("very short watch"), so a server or proxy that closes watches at once cannot cause a hot loop.
MIN_WATCH_SECONDS: Final = 1.0
_OBJECT_EVENTS: Final = frozenset({"ADDED", "MODIFIED", "DELETED"})


class _Backoff:
    """Doubling delays from `initial` up to `cap`, each stretched by a random factor in [1, 2)."""

    def __init__(self, initial: float, cap: float) -> None:
        self._initial = initial
        self._cap = cap
        self._current = initial

    def next(self) -> float:
        delay = self._current
        self._current = min(self._cap, self._current * 2)
        return delay * (1.0 + random.random())  # noqa: S311 - jitter, not crypto

    def reset(self) -> None:
        self._current = self._initial


class _Progress:
    """What one watch delivered, for deciding whether it counted as a success."""

    def __init__(self) -> None:
        self.events = 0


def _describe(
    resource: Resource, namespace: str | None, label_selector: str | None, field_selector: str | None = None
) -> str:
    """How log lines name an informer: its resource, namespace and selectors."""
    in_namespace = f" in {namespace}" if namespace else ""
    selectors = ",".join(selector for selector in (label_selector, field_selector) if selector)
    return resource.plural + in_namespace + (f" ({selectors})" if selectors else "")


class _Source:
    """Where an informer reads from: paginated lists and watches of one resource (and selectors: a field
    selector "metadata.name=<name>" follows one object, which RBAC can grant list and watch on by name)."""

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        namespace: str | None,
        selectors: tuple[str | None, str | None],
        *,
        name: str,
        page_size: int,
        watch_timeout: tuple[float, float],
        read_timeout: float,
    ) -> None:
        self._client = client
        self._resource = resource
        self._namespace = namespace
        self._label_selector, self._field_selector = selectors  # label, field
        self._name = name
        self._page_size = page_size
        self._watch_timeout = watch_timeout
        self._read_timeout = read_timeout

    def list_all(
        self, stop: threading.Event, prepare: Callable[[object], KubeObject | None]
    ) -> tuple[list[KubeObject], str] | None:
        """All pages of one consistent list (each object through `prepare`) and its resourceVersion, or
        None when stopped midway."""
        objs: list[KubeObject] = []
        limit: int | None = self._page_size if self._page_size > 0 else None
        continue_: str | None = None
        while True:
            try:
                page = self._client.list(
                    self._resource,
                    self._namespace,
                    label_selector=self._label_selector,
                    field_selector=self._field_selector,
                    limit=limit,
                    continue_=continue_,
                )
            except Gone:
                if continue_ is None:
                    raise
                # The continue token outlived etcd's compaction window: take the list in one go.
                logger.info("continue token for %s expired; listing without pages", self._name)
                objs.clear()
                limit = continue_ = None
                continue
            items = page.get("items")
            for raw in items if isinstance(items, list) else []:
                obj = prepare(raw)
                if obj is not None:
                    objs.append(obj)
            metadata = metadata_of(page)
            next_token = metadata.get("continue")
            if not next_token:
                return objs, str(metadata.get("resourceVersion") or "")
            if stop.is_set():
                return None
            continue_ = str(next_token)

    def watch(self, resource_version: str) -> WatchStream:
        """One watch from `resource_version`, with a server timeout spread over `watch_timeout` so that
        informers started together do not all reconnect together."""
        low, high = self._watch_timeout
        return self._client.watch(
            self._resource,
            self._namespace,
            resource_version=resource_version,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
            timeout_seconds=int(random.uniform(low, high)),  # noqa: S311 - spreading load, not crypto
            read_timeout=self._read_timeout,
        )


class Informer:
    """List + watch one resource into a `Store`, calling handlers for every change.

    Handlers run on the informer's thread, in event order; they should only enqueue keys. The
    objects they receive are the stored ones: treat them as read-only.
    """

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        store: Store,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        clock: Clock | None = None,
        watch_timeout: tuple[float, float] = (300.0, 600.0),
        read_timeout: float = 90.0,
        page_size: int = 500,
        backoff_initial: float = 0.8,
        backoff_max: float = 30.0,
        transform: Callable[[KubeObject], KubeObject] | None = None,
    ) -> None:
        """`transform`, when given, reduces each object before it is stored (like client-go's
        SetTransform), so caches of big objects such as Nodes hold only what the controller reads."""
        if not 0 < watch_timeout[0] <= watch_timeout[1]:
            raise ValueError(f"watch_timeout must be an increasing pair of positive seconds: {watch_timeout}")
        if read_timeout <= 0:
            raise ValueError("read_timeout must be positive")
        self._resource = resource
        self._clock: Clock = clock or RealClock()
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._name = _describe(resource, namespace, label_selector, field_selector)
        self._source = _Source(
            client,
            resource,
            namespace,
            (label_selector, field_selector),
            name=self._name,
            page_size=page_size,
            watch_timeout=watch_timeout,
            read_timeout=read_timeout,
        )
        self._delivery = Delivery(store, resource, self._name, transform)
        self._synced = threading.Event()
        self._lock = threading.Lock()
        self._started = False
        self._stop_requested = False
        self._stop_event: threading.Event | None = None
        self._active: WatchStream | None = None
        self._last_error: Exception | None = None
        self._last_resource_version = ""

    # ---- public surface ---------------------------------------------------------------------------------

    @property
    def resource(self) -> Resource:
        return self._resource

    @property
    def store(self) -> Store:
        return self._delivery.store

    @property
    def name(self) -> str:
        return self._name

    @property
    def last_sync_error(self) -> Exception | None:
        """The last list/watch failure, cleared by the next successful list or watch; for /readyz."""
        with self._lock:
            return self._last_error

    @property
    def last_sync_resource_version(self) -> str:
        """The resourceVersion the next watch resumes from."""
        with self._lock:
            return self._last_resource_version

    def add_handler(
        self,
        on_add: OnAdd | None = None,
        on_update: OnUpdate | None = None,
        on_delete: OnDelete | None = None,
    ) -> None:
        """Registers handlers; only before `run`, so no handler misses the initial list."""
        with self._lock:
            if self._started:
                raise RuntimeError(f"informer for {self._name} is already running")
            self._delivery.add_handler(on_add, on_update, on_delete)

    def has_synced(self) -> bool:
        """True once the first full list is in the store and its handlers have been called."""
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def stop(self) -> None:
        """Sets the stop event and closes the open watch, so `run` returns promptly."""
        with self._lock:
            self._stop_requested = True
            event = self._stop_event
            stream = self._active
        if event is not None:
            event.set()
        if stream is not None:
            stream.close()

    def run(self, stop: threading.Event) -> None:
        """Thread body: lists, watches and recovers until `stop` is set (or `stop()` is called)."""
        with self._lock:
            if self._started:
                raise RuntimeError(f"informer for {self._name} was already run")
            self._started = True
            self._stop_event = stop
            stop_requested = self._stop_requested
        if stop_requested:
            stop.set()
        # Setting `stop` from anywhere must unblock a read on a silent watch: this helper turns the
        # event into a close of the open stream. run() only returns once `stop` is set, so it ends too.
        threading.Thread(
            target=self._close_on_stop, args=(stop,), name=f"informer-stop-{self._name}", daemon=True
        ).start()
        logger.info("starting informer for %s", self._name)
        try:
            self._loop(stop)
        finally:
            logger.info("informer for %s stopped", self._name)

    # ---- the list/watch loop ----------------------------------------------------------------------------

    def _loop(self, stop: threading.Event) -> None:
        backoff = _Backoff(self._backoff_initial, self._backoff_max)
        need_list = True
        while not stop.is_set():
            need_list = self._relist(stop, backoff) if need_list else self._rewatch(stop, backoff)

    def _relist(self, stop: threading.Event, backoff: _Backoff) -> bool:
        """One full list into the store; returns whether the next step must list again."""
        try:
            self._list_and_sync(stop)
        except Exception as exc:  # the loop must outlive any failure, including bugs
            if not stop.is_set():
                self._failed("list", exc, backoff.next(), stop)
            return True
        return False

    def _rewatch(self, stop: threading.Event, backoff: _Backoff) -> bool:
        """One watch from the last resourceVersion; returns whether the next step must relist."""
        progress = _Progress()
        started = self._clock.monotonic()
        try:
            self._watch_once(stop, progress)
        except Gone as exc:
            if not stop.is_set():
                logger.info("watch of %s expired (%s); relisting", self._name, exc.message)
                if progress.events == 0:
                    # Expired before delivering anything: pace relists in case it keeps happening.
                    stop.wait(backoff.next())
            return True
        except Exception as exc:  # the loop must outlive any failure, including bugs
            if not stop.is_set():
                if progress.events > 0:
                    backoff.reset()
                self._failed("watch", exc, backoff.next(), stop)
            return False
        if stop.is_set():
            return False
        if progress.events == 0 and self._clock.monotonic() - started < MIN_WATCH_SECONDS:
            short = KubeError("very short watch: the server ended it at once without any event")
            self._failed("watch", short, backoff.next(), stop)
        else:
            backoff.reset()
        return False

    def _failed(self, what: str, exc: Exception, delay: float, stop: threading.Event) -> None:
        with self._lock:
            self._last_error = exc
        if isinstance(exc, KubeError):
            logger.warning("%s of %s failed: %s; retrying in %.2fs", what, self._name, exc, delay)
        else:
            logger.error(
                "%s of %s failed unexpectedly; retrying in %.2fs", what, self._name, delay, exc_info=exc
            )
        stop.wait(delay)

    def _close_on_stop(self, stop: threading.Event) -> None:
        stop.wait()
        with self._lock:
            stream = self._active
        if stream is not None:
            stream.close()

    # ---- list -------------------------------------------------------------------------------------------

    def _list_and_sync(self, stop: threading.Event) -> None:
        listed = self._source.list_all(stop, self._delivery.prepare)
        if listed is None:
            return
        objs, resource_version = listed
        if not resource_version:
            logger.warning("list of %s returned no resourceVersion; watching from now", self._name)
        self._delivery.replace_all(objs)
        with self._lock:
            self._last_resource_version = resource_version
            self._last_error = None
        self._synced.set()
        logger.debug("listed %d %s at resourceVersion %s", len(objs), self._name, resource_version)

    # ---- watch ------------------------------------------------------------------------------------------

    def _watch_once(self, stop: threading.Event, progress: _Progress) -> None:
        stream = self._source.watch(self.last_sync_resource_version)
        with stream:
            with self._lock:
                self._active = stream
                self._last_error = None
            try:
                if stop.is_set():
                    return
                for event_type, obj in stream:
                    progress.events += 1
                    self._apply(event_type, obj)
                    if stop.is_set():
                        return
            finally:
                with self._lock:
                    self._active = None

    def _apply(self, event_type: str, raw: KubeObject) -> None:
        resource_version = resource_version_of(raw)
        if event_type == "BOOKMARK":
            self._advance(resource_version)
            return
        if event_type not in _OBJECT_EVENTS:
            logger.warning("watch of %s: ignoring event of unknown type %r", self._name, event_type)
            self._advance(resource_version)
            return
        obj = self._delivery.prepare(raw)
        if obj is not None:
            self._delivery.apply(event_type, obj)
        self._advance(resource_version)

    def _advance(self, resource_version: str | None) -> None:
        if resource_version:
            with self._lock:
                self._last_resource_version = resource_version
