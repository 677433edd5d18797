"""The cache: keys, relist semantics, and index entries that follow owner and label changes."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from controller.runtime.store import BY_OWNER_UID, Store, by_owner_uid, object_key, split_key
from controller.watches import BY_JOB, STANDARD_INDEXERS, by_job
from crd.contract import JOB_NAME_LABEL


def pod(
    name: str,
    namespace: str | None = "ml",
    *,
    job: str | None = None,
    owner_uid: str | None = None,
    owner_is_controller: bool = True,
    uid: str = "",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "uid": uid or f"uid-{name}"}
    if namespace is not None:
        metadata["namespace"] = namespace
    if job is not None:
        metadata["labels"] = {JOB_NAME_LABEL: job, "other": "x"}
    if owner_uid is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "unrelated", "uid": "not-the-controller"},
            {
                "apiVersion": "ml.example.com/v1",
                "kind": "TrainingJob",
                "name": job or "job",
                "uid": owner_uid,
                "controller": owner_is_controller,
            },
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata}


@pytest.fixture
def store() -> Store:
    return Store(STANDARD_INDEXERS)


def names(objs: list[dict[str, Any]]) -> list[str]:
    return [obj["metadata"]["name"] for obj in objs]


def test_object_keys() -> None:
    assert object_key(pod("a")) == "ml/a"
    assert object_key(pod("node-1", namespace=None)) == "node-1"
    with pytest.raises(ValueError, match=r"metadata\.name"):
        object_key({"metadata": {"namespace": "ml"}})


def test_split_key() -> None:
    assert split_key("ml/a") == ("ml", "a")
    assert split_key("node-1") == (None, "node-1")
    for malformed in ["/a", "ml/", "a/b/c"]:
        with pytest.raises(ValueError, match="malformed"):
            split_key(malformed)


def test_owner_uid_indexer_uses_only_the_controller_reference() -> None:
    assert by_owner_uid(pod("a", owner_uid="job-uid")) == ["job-uid"]
    assert by_owner_uid(pod("a", owner_uid="job-uid", owner_is_controller=False)) == []
    assert by_owner_uid(pod("a")) == []
    assert by_owner_uid({"metadata": {"name": "a", "ownerReferences": None}}) == []


def test_job_indexer_uses_the_label_and_namespace() -> None:
    assert by_job(pod("a", job="mnist")) == ["ml/mnist"]
    assert by_job(pod("a")) == []
    assert by_job({"metadata": {"name": "a", "labels": {JOB_NAME_LABEL: ""}}}) == []


def test_add_get_list_keys(store: Store) -> None:
    first, second = pod("a"), pod("b", namespace="other")
    assert store.add(first) is None
    store.add(second)
    assert store.get("ml/a") is first
    assert store.get("ml/b") is None
    assert sorted(store.keys()) == ["ml/a", "other/b"]
    assert sorted(names(store.list())) == ["a", "b"]
    assert len(store) == 2


def test_update_replaces_and_returns_the_previous_object(store: Store) -> None:
    old = pod("a", uid="1")
    new = pod("a", uid="2")
    store.add(old)
    assert store.update(new) is old
    assert store.get("ml/a") is new
    assert len(store) == 1


def test_delete(store: Store) -> None:
    stored = pod("a", job="mnist", owner_uid="u1")
    store.add(stored)
    # The informer may only have a stale copy of the deleted object; the key is what counts.
    assert store.delete(pod("a")) is stored
    assert store.get("ml/a") is None
    assert store.by_index(BY_JOB, "ml/mnist") == []
    assert store.by_index(BY_OWNER_UID, "u1") == []
    assert store.delete(pod("a")) is None


def test_by_index(store: Store) -> None:
    store.add(pod("mnist-master", job="mnist", owner_uid="u1"))
    store.add(pod("mnist-worker-0", job="mnist", owner_uid="u1"))
    store.add(pod("bert-master", job="bert", owner_uid="u2"))
    store.add(pod("mnist-master", namespace="other", job="mnist", owner_uid="u3"))
    assert names(store.by_index(BY_JOB, "ml/mnist")) == ["mnist-master", "mnist-worker-0"]
    assert names(store.by_index(BY_OWNER_UID, "u2")) == ["bert-master"]
    assert store.index_keys(BY_JOB, "other/mnist") == ["other/mnist-master"]
    assert store.by_index(BY_JOB, "ml/absent") == []


def test_unknown_index_is_an_error(store: Store) -> None:
    with pytest.raises(KeyError, match="no index named"):
        store.by_index("by-colour", "red")


def test_update_removes_stale_index_entries(store: Store) -> None:
    store.add(pod("a", job="mnist", owner_uid="u1"))
    store.update(pod("a", job="bert", owner_uid="u2"))
    assert store.by_index(BY_JOB, "ml/mnist") == []
    assert store.by_index(BY_OWNER_UID, "u1") == []
    assert names(store.by_index(BY_JOB, "ml/bert")) == ["a"]
    assert names(store.by_index(BY_OWNER_UID, "u2")) == ["a"]

    store.update(pod("a"))  # orphaned and unlabelled
    assert store.by_index(BY_JOB, "ml/bert") == []
    assert store.by_index(BY_OWNER_UID, "u2") == []


def test_update_keeps_entries_that_did_not_change(store: Store) -> None:
    store.add(pod("a", job="mnist", owner_uid="u1"))
    store.add(pod("b", job="mnist", owner_uid="u1"))
    store.update(pod("a", job="mnist", owner_uid="u1", uid="new"))
    assert names(store.by_index(BY_JOB, "ml/mnist")) == ["a", "b"]
    assert store.by_index(BY_OWNER_UID, "u1")[0]["metadata"]["uid"] == "new"


def test_replace_returns_what_vanished_and_rebuilds_indexes(store: Store) -> None:
    store.add(pod("keep", job="mnist"))
    gone = pod("gone", job="mnist")
    store.add(gone)
    changed = pod("keep", job="bert")
    fresh = pod("fresh", job="mnist")

    vanished = store.replace([changed, fresh])

    assert vanished == [gone]
    assert sorted(store.keys()) == ["ml/fresh", "ml/keep"]
    assert store.get("ml/keep") is changed
    assert names(store.by_index(BY_JOB, "ml/mnist")) == ["fresh"]
    assert names(store.by_index(BY_JOB, "ml/bert")) == ["keep"]


def test_replace_with_nothing_empties_the_store(store: Store) -> None:
    store.add(pod("a", job="mnist"))
    assert names(store.replace([])) == ["a"]
    assert len(store) == 0
    assert store.by_index(BY_JOB, "ml/mnist") == []


def test_store_without_indexers() -> None:
    store = Store()
    store.add(pod("a"))
    assert store.keys() == ["ml/a"]
    with pytest.raises(KeyError):
        store.by_index(BY_JOB, "ml/a")


def test_index_functions_may_return_several_values() -> None:
    store = Store({"by-container-image": lambda obj: obj["spec"]["images"]})
    store.add({"metadata": {"name": "a", "namespace": "ml"}, "spec": {"images": ["x", "y", "x"]}})
    store.add({"metadata": {"name": "b", "namespace": "ml"}, "spec": {"images": ["y"]}})
    assert store.index_keys("by-container-image", "x") == ["ml/a"]
    assert store.index_keys("by-container-image", "y") == ["ml/a", "ml/b"]
    store.update({"metadata": {"name": "a", "namespace": "ml"}, "spec": {"images": ["z"]}})
    assert store.index_keys("by-container-image", "x") == []
    assert store.index_keys("by-container-image", "y") == ["ml/b"]


def test_concurrent_writers_leave_indexes_consistent(store: Store) -> None:
    def churn(worker: int) -> None:
        for round_number in range(200):
            job = "mnist" if round_number % 2 else "bert"
            store.update(pod(f"p{worker}", job=job, owner_uid=f"u-{job}"))
        store.update(pod(f"p{worker}", job="final", owner_uid="u-final"))

    threads = [threading.Thread(target=churn, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    assert len(store.by_index(BY_JOB, "ml/final")) == 8
    assert store.by_index(BY_JOB, "ml/mnist") == []
    assert store.by_index(BY_JOB, "ml/bert") == []
    assert store.by_index(BY_OWNER_UID, "u-mnist") == []
