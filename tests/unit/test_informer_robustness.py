"""An informer that keeps going and stops when told: handler exceptions and malformed objects skipped,
paginated lists and an expired continue token, a failed list retried, a prompt stop while blocked in
a read, and the options it refuses.

Split out of tests/unit/test_informer.py (list + watch, relists, bookmarks, recreations).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from controller import resources as kube
from controller.runtime.client import KubeClient
from controller.runtime.clock import RealClock
from controller.runtime.errors import Forbidden
from controller.runtime.informer import Informer
from controller.runtime.store import Store
from tests.unit import informer_support
from tests.unit.fakeapi import FakeApi, Reply, Stream, event, items_list, status
from tests.unit.informer_support import (
    DEADLINE_SECONDS,
    PODS_PATH,
    Recorder,
    idle_watches,
    list_item,
    list_requests,
    make_informer,
    pod,
    running_informer,
    wait_for_watches,
)

# The shared fixtures, bound here so that pytest finds them for this module's tests.
api = informer_support.api
client = informer_support.client
store = informer_support.store
recorder = informer_support.recorder


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
