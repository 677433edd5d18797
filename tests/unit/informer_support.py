"""What the informer tests share (tests/unit/test_informer.py, tests/unit/test_informer_robustness.py):
pods as list items and watch events, a recorder of handler calls, an informer started on a thread,
the requests the fake API server saw, and the fixtures of that server, a client, a store and a
recorder, which each test module binds to its own names.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from controller import resources as kube
from controller.runtime.client import KubeClient
from controller.runtime.clock import RealClock
from controller.runtime.informer import Informer
from controller.runtime.store import Store
from controller.watches import STANDARD_INDEXERS
from tests.unit.fakeapi import FakeApi, Recorded, Stream, event, running

Seen = tuple[str, str, str, str]  # (handler, name, uid, resourceVersion)
DEADLINE_SECONDS = 10.0


PODS_PATH = "/api/v1/namespaces/ns/pods"


def pod(name: str, rv: str, uid: str | None = None, **metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": uid or f"uid-{name}",
            "resourceVersion": rv,
            **metadata,
        },
    }


def list_item(name: str, rv: str, uid: str | None = None, **metadata: Any) -> dict[str, Any]:
    """Items of a list come without apiVersion/kind, as the API server sends them."""
    item = pod(name, rv, uid, **metadata)
    del item["apiVersion"], item["kind"]
    return item


def bookmark(rv: str) -> dict[str, Any]:
    return event("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}})


class Recorder:
    """Handlers that record what they were told, with a condition to wait on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.seen: list[Seen] = []

    def _record(self, what: str, obj: dict[str, Any]) -> None:
        metadata = obj["metadata"]
        with self._cond:
            self.seen.append(
                (what, metadata["name"], metadata.get("uid", ""), metadata.get("resourceVersion", ""))
            )
            self._cond.notify_all()

    def on_add(self, obj: dict[str, Any]) -> None:
        self._record("add", obj)

    def on_update(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        assert old["metadata"]["name"] == new["metadata"]["name"]
        self._record("update", new)

    def on_delete(self, obj: dict[str, Any]) -> None:
        self._record("delete", obj)

    def wait_for(self, count: int) -> list[Seen]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.seen) >= count, DEADLINE_SECONDS):
                pytest.fail(f"expected {count} handler calls, got {self.seen}")
            return list(self.seen)


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as server:
        yield server


@pytest.fixture
def client(api: FakeApi) -> KubeClient:
    return KubeClient(api.api_client(), qps=0, burst=0, backoff_initial=0.01)


@pytest.fixture
def store() -> Store:
    return Store(STANDARD_INDEXERS)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def make_informer(client: KubeClient, store: Store, recorder: Recorder, **options: Any) -> Informer:
    options.setdefault("read_timeout", 30.0)
    informer = Informer(
        client,
        kube.PODS,
        store,
        namespace="ns",
        clock=RealClock(),
        backoff_initial=0.01,
        backoff_max=0.05,
        **options,
    )
    informer.add_handler(recorder.on_add, recorder.on_update, recorder.on_delete)
    return informer


@contextmanager
def running_informer(informer: Informer) -> Iterator[threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        informer.stop()
        thread.join(DEADLINE_SECONDS)
        assert not thread.is_alive(), "informer did not stop"


def idle_watches(api: FakeApi) -> None:
    """Once the scripted watches are used up, further watches stay open and silent."""
    api.default("GET", PODS_PATH, Stream(stall=True))


def wait_for_watches(api: FakeApi, count: int) -> list[Recorded]:
    """Blocks until `count` watch requests arrived (list requests go to the same path)."""
    return api.wait_for_requests(count, "GET", PODS_PATH, where=lambda r: r.is_watch)


def list_requests(api: FakeApi) -> list[Recorded]:
    return api.requests("GET", PODS_PATH, where=lambda r: not r.is_watch)
