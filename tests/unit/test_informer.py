"""The informer against a scripted API server over real HTTP: list, watch, expiry, stalls, recovery, stop."""

from __future__ import annotations

from controller.runtime.client import KubeClient
from controller.runtime.delivery import LAST_APPLIED_ANNOTATION
from controller.runtime.store import Store
from tests.unit import informer_support
from tests.unit.fakeapi import FakeApi, Reply, Stream, event, items_list, status
from tests.unit.informer_support import (
    PODS_PATH,
    Recorder,
    bookmark,
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


def test_a_field_selector_goes_with_every_list_and_watch(
    api: FakeApi, client: KubeClient, store: Store, recorder: Recorder
) -> None:
    """One object followed by name (controller/resources.py NAMED, the guard policies): the API server
    authorizes such a list or watch as a request for that name, so RBAC grants it by resourceNames."""
    api.script("GET", PODS_PATH, Reply(200, items_list([list_item("a", "1")], "10")))
    idle_watches(api)
    informer = make_informer(client, store, recorder, label_selector="x=y", field_selector="metadata.name=a")
    with running_informer(informer):
        recorder.wait_for(1)
        watch = wait_for_watches(api, 1)[0]
    (listed,) = list_requests(api)
    for request in (listed, watch):
        assert request.query["fieldSelector"] == "metadata.name=a"
        assert request.query["labelSelector"] == "x=y"
    assert informer.name == "pods in ns (x=y,metadata.name=a)"


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
