"""The informer against a scripted API server over real HTTP: list, watch, expiry, stalls, recovery, stop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from controller import resources as kube
from controller.runtime.client import KubeClient
from controller.runtime.clock import RealClock
from controller.runtime.delivery import LAST_APPLIED_ANNOTATION
from controller.runtime.errors import Forbidden
from controller.runtime.informer import Informer
from controller.runtime.store import Store
from controller.watches import STANDARD_INDEXERS
from tests.unit.fakeapi import FakeApi, Recorded, Reply, Stream, event, items_list, running, status

DEADLINE_SECONDS = 10.0
PODS_PATH = "/api/v1/namespaces/ns/pods"

Seen = tuple[str, str, str, str]  # (handler, name, uid, resourceVersion)


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


# ---- list + watch -------------------------------------------------------------------------------------


def test_list_then_watch_applies_add_modify_delete(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    managed = [{"manager": "kubectl", "operation": "Update"}]
    api.script(
        "GET",
        PODS_PATH,
        Reply(
            200,
            items_list(
                [
                    list_item(
                        "a",
                        "1",
                        managedFields=managed,
                        annotations={LAST_APPLIED_ANNOTATION: "{}", "keep": "me"},
                    ),
                    list_item("b", "2"),
                ],
                "10",
            ),
        ),
    )
    api.script(
        "GET",
        PODS_PATH,
        Stream(
            (
                event(
                    "ADDED",
                    pod("c", "11", managedFields=managed, annotations={LAST_APPLIED_ANNOTATION: "{}"}),
                ),
                event("MODIFIED", pod("a", "12")),
                event("DELETED", pod("b", "13")),
            ),
            stall=True,
        ),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder)
    assert not informer.has_synced()
    with running_informer(informer):
        seen = recorder.wait_for(5)
        assert informer.has_synced()
    assert seen == [
        ("add", "a", "uid-a", "1"),
        ("add", "b", "uid-b", "2"),
        ("add", "c", "uid-c", "11"),
        ("update", "a", "uid-a", "12"),
        ("delete", "b", "uid-b", "13"),
    ]
    assert sorted(store.keys()) == ["ns/a", "ns/c"]
    stored_c = store.get("ns/c")
    assert stored_c is not None
    assert "managedFields" not in stored_c["metadata"]
    assert "annotations" not in stored_c["metadata"]
    watch = wait_for_watches(api, 1)[0]
    assert watch.query["resourceVersion"] == "10"
    assert watch.query["allowWatchBookmarks"] == "true"
    assert 300 <= int(watch.query["timeoutSeconds"]) <= 600
    assert informer.last_sync_resource_version == "13"
    assert informer.last_sync_error is None


def test_list_items_are_stripped_and_typed(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(
            200,
            items_list(
                [
                    list_item(
                        "a",
                        "1",
                        managedFields=[{"manager": "x"}],
                        annotations={LAST_APPLIED_ANNOTATION: "{}", "k": "v"},
                    ),
                ],
                "10",
            ),
        ),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder)
    with running_informer(informer):
        recorder.wait_for(1)
    stored = store.get("ns/a")
    assert stored is not None
    assert stored["apiVersion"] == "v1"
    assert stored["kind"] == "Pod"
    assert stored["metadata"]["annotations"] == {"k": "v"}
    assert "managedFields" not in stored["metadata"]


def test_gone_relists_and_synthesises_deletes(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([list_item("a", "1"), list_item("b", "2")], "10")),
        Stream(
            (
                event("MODIFIED", pod("a", "11")),
                event("ERROR", status(410, "Expired", "too old resource version")),
            )
        ),
        # While the watch was down b was deleted and c created; the relist is the only way to learn it.
        Reply(200, items_list([list_item("a", "11"), list_item("c", "15")], "20")),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder)
    with running_informer(informer):
        seen = recorder.wait_for(5)
        watches = wait_for_watches(api, 2)
    assert seen == [
        ("add", "a", "uid-a", "1"),
        ("add", "b", "uid-b", "2"),
        ("update", "a", "uid-a", "11"),
        ("add", "c", "uid-c", "15"),
        ("delete", "b", "uid-b", "2"),
    ]
    assert sorted(store.keys()) == ["ns/a", "ns/c"]
    assert len(list_requests(api)) == 2
    assert [w.query["resourceVersion"] for w in watches[:2]] == ["10", "20"]


def test_gone_when_opening_the_watch_relists(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([list_item("a", "1")], "10")),
        Reply(410, status(410, "Expired")),
        Reply(200, items_list([list_item("a", "1")], "30")),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder)
    with running_informer(informer):
        watches = wait_for_watches(api, 2)
    assert [w.query["resourceVersion"] for w in watches[:2]] == ["10", "30"]
    assert recorder.seen == [("add", "a", "uid-a", "1")]  # the relist found nothing new


def test_stalled_watch_times_out_and_rewatches_from_last_resource_version(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([list_item("a", "1")], "10")),
        Stream((event("ADDED", pod("c", "11")),), stall=True),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder, read_timeout=0.3)
    with running_informer(informer):
        watches = wait_for_watches(api, 2)
    assert [w.query["resourceVersion"] for w in watches[:2]] == ["10", "11"]
    assert len(list_requests(api)) == 1  # a read timeout re-watches; it does not relist
    assert recorder.seen == [("add", "a", "uid-a", "1"), ("add", "c", "uid-c", "11")]


def test_other_watch_errors_rewatch_without_relisting(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([list_item("a", "1")], "10")),
        Stream((event("MODIFIED", pod("a", "12")), event("ERROR", status(500, "InternalError")))),
        Reply(503, status(503, "ServiceUnavailable")),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder)
    with running_informer(informer):
        watches = wait_for_watches(api, 3)
    assert [w.query["resourceVersion"] for w in watches[:3]] == ["10", "12", "12"]
    assert len(list_requests(api)) == 1


def test_bookmarks_advance_the_resource_version_without_handlers(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([list_item("a", "1")], "10")),
        Stream((bookmark("50"),)),  # then the server ends the watch (its timeout)
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder)
    with running_informer(informer):
        watches = wait_for_watches(api, 2)
    assert [w.query["resourceVersion"] for w in watches[:2]] == ["10", "50"]
    assert recorder.seen == [("add", "a", "uid-a", "1")]
    assert len(list_requests(api)) == 1


def test_recreate_seen_as_update_is_delivered_as_delete_then_add(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([list_item("a", "1", uid="old")], "10")),
        Stream((event("MODIFIED", pod("a", "20", uid="new")),), stall=True),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder)
    with running_informer(informer):
        seen = recorder.wait_for(3)
    assert seen == [("add", "a", "old", "1"), ("delete", "a", "old", "1"), ("add", "a", "new", "20")]
    stored = store.get("ns/a")
    assert stored is not None
    assert stored["metadata"]["uid"] == "new"


def test_recreate_found_by_relist_is_delivered_as_delete_then_add(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([list_item("a", "1", uid="old")], "10")),
        Stream((event("ERROR", status(410, "Expired")),)),
        Reply(200, items_list([list_item("a", "30", uid="new")], "30")),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder)
    with running_informer(informer):
        seen = recorder.wait_for(3)
    assert seen == [("add", "a", "old", "1"), ("delete", "a", "old", "1"), ("add", "a", "new", "30")]


def test_handler_exception_does_not_stop_the_informer(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([list_item("a", "1")], "10")),
        Stream((event("ADDED", pod("b", "11")), event("MODIFIED", pod("b", "12"))), stall=True),
    )
    idle_watches(api)

    def explode(*_: dict[str, Any]) -> None:
        raise RuntimeError("handler bug")

    informer = Informer(client, kube.PODS, store, namespace="ns", backoff_initial=0.01)
    informer.add_handler(explode, explode, explode)
    informer.add_handler(recorder.on_add, recorder.on_update, recorder.on_delete)
    with running_informer(informer):
        seen = recorder.wait_for(3)
    assert seen == [("add", "a", "uid-a", "1"), ("add", "b", "uid-b", "11"), ("update", "b", "uid-b", "12")]
    assert len(wait_for_watches(api, 1)) == 1  # the same watch carried on


def test_malformed_objects_are_skipped(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([{"spec": {}}, list_item("a", "1"), {"metadata": {"namespace": "ns"}}], "10")),
        Stream(
            (
                event("ADDED", {"metadata": {"namespace": "ns", "resourceVersion": "11"}}),
                event("ADDED", pod("b", "12")),
            )
        ),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder)
    with running_informer(informer):
        seen = recorder.wait_for(2)
        watches = wait_for_watches(api, 2)
    assert seen == [("add", "a", "uid-a", "1"), ("add", "b", "uid-b", "12")]
    assert sorted(store.keys()) == ["ns/a", "ns/b"]
    assert watches[1].query["resourceVersion"] == "12"


def test_paginated_list(api: FakeApi, client: KubeClient, store: Store, recorder: Recorder) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([list_item("a", "1"), list_item("b", "2")], "10", continue_="t1")),
        Reply(200, items_list([list_item("c", "3"), list_item("d", "4")], "10", continue_="t2")),
        Reply(200, items_list([list_item("e", "5")], "10")),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder, page_size=2)
    with running_informer(informer):
        seen = recorder.wait_for(5)
        assert informer.wait_for_sync(DEADLINE_SECONDS)
        watch = wait_for_watches(api, 1)[0]
    assert [name for _, name, _, _ in seen] == ["a", "b", "c", "d", "e"]
    pages = list_requests(api)
    assert [(r.query.get("limit"), r.query.get("continue")) for r in pages] == [
        ("2", None),
        ("2", "t1"),
        ("2", "t2"),
    ]
    assert watch.query["resourceVersion"] == "10"


def test_expired_continue_token_falls_back_to_one_full_list(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script(
        "GET",
        PODS_PATH,
        Reply(200, items_list([list_item("a", "1")], "10", continue_="t1")),
        Reply(410, status(410, "Expired", "The provided continue parameter is too old")),
        Reply(200, items_list([list_item("a", "1"), list_item("b", "21")], "21")),
    )
    idle_watches(api)
    informer = make_informer(client, store, recorder, page_size=1)
    with running_informer(informer):
        seen = recorder.wait_for(2)
        watch = wait_for_watches(api, 1)[0]
    assert seen == [("add", "a", "uid-a", "1"), ("add", "b", "uid-b", "21")]
    pages = list_requests(api)
    assert [(r.query.get("limit"), r.query.get("continue")) for r in pages] == [
        ("1", None),
        ("1", "t1"),
        (None, None),
    ]
    assert watch.query["resourceVersion"] == "21"


def test_list_failure_is_recorded_and_retried(api: FakeApi, client: KubeClient, store: Store) -> None:
    api.default("GET", PODS_PATH, Reply(403, status(403, "Forbidden", "pods is forbidden")))
    informer = Informer(client, kube.PODS, store, namespace="ns", backoff_initial=0.01, backoff_max=0.02)
    with running_informer(informer):
        api.wait_for_requests(3, "GET", PODS_PATH)
        assert isinstance(informer.last_sync_error, Forbidden)
        assert not informer.has_synced()


@pytest.mark.parametrize("how", ["event", "method"])
def test_stop_ends_run_promptly_while_blocked_in_a_read(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder, how: str
) -> None:
    api.script("GET", PODS_PATH, Reply(200, items_list([], "10")))
    idle_watches(api)
    informer = make_informer(client, store, recorder, read_timeout=60.0)
    stop = threading.Event()
    thread = threading.Thread(target=informer.run, args=(stop,), daemon=True)
    thread.start()
    wait_for_watches(api, 1)
    clock = RealClock()
    started = clock.monotonic()
    if how == "event":
        stop.set()
    else:
        informer.stop()
        assert stop.is_set()
    thread.join(DEADLINE_SECONDS)
    assert not thread.is_alive()
    assert clock.monotonic() - started < 5.0


def test_stop_before_run_returns_at_once(client: KubeClient, store: Store) -> None:
    informer = Informer(client, kube.PODS, store)
    informer.stop()
    stop = threading.Event()
    informer.run(stop)
    assert stop.is_set()
    assert not informer.has_synced()


def test_handlers_cannot_be_added_while_running(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    api.script("GET", PODS_PATH, Reply(200, items_list([], "10")))
    idle_watches(api)
    informer = make_informer(client, store, recorder)
    with running_informer(informer):
        assert informer.wait_for_sync(DEADLINE_SECONDS)
        with pytest.raises(RuntimeError, match="already running"):
            informer.add_handler(recorder.on_add)


def test_rejects_bad_timeouts(client: KubeClient, store: Store) -> None:
    with pytest.raises(ValueError, match="watch_timeout"):
        Informer(client, kube.PODS, store, watch_timeout=(600, 300))
    with pytest.raises(ValueError, match="read_timeout"):
        Informer(client, kube.PODS, store, read_timeout=0)
