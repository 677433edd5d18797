"""The informer's local cache: the objects last seen from the API server, keyed and indexed.

Reconcilers read from here instead of calling the API server, so a reconcile costs no requests and
sees one consistent snapshot per object. Indexes answer a controller's questions without scanning
every object, e.g. "which objects does this owner control?" (`by_owner_uid`, the controller
ownerReference UID); a controller adds its own (controller/watches.py). Like client-go's thread-safe
store, index entries are kept exact on update and delete, so a Pod whose owner or label changed stops
showing up under its old value.

Objects are returned as stored, not copied: callers must treat them as read-only (copy before
changing anything) or they would corrupt the cache for every other reader.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterable
from typing import Any, Final

KubeObject = dict[str, Any]
IndexFunc = Callable[[KubeObject], list[str]]

BY_OWNER_UID: Final = "by-owner-uid"


def object_key(obj: KubeObject) -> str:
    """`namespace/name`, or `name` for a cluster-scoped object (client-go's MetaNamespaceKeyFunc)."""
    metadata = obj.get("metadata") or {}
    name = metadata.get("name")
    if not name:
        raise ValueError("object has no metadata.name")
    namespace = metadata.get("namespace")
    return f"{namespace}/{name}" if namespace else str(name)


def split_key(key: str) -> tuple[str | None, str]:
    """The inverse of `object_key`: `(namespace, name)`, namespace None for cluster-scoped keys."""
    namespace, separator, name = key.partition("/")
    if not separator:
        return None, key
    if not namespace or not name or "/" in name:
        raise ValueError(f"malformed object key {key!r}")
    return namespace, name


def by_owner_uid(obj: KubeObject) -> list[str]:
    """The UID of the object's controller ownerReference (the one with `controller: true`), if any."""
    for reference in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if reference.get("controller") is True and reference.get("uid"):
            return [str(reference["uid"])]
    return []


# The indexes every cache of owned objects needs.
OWNER_INDEXERS: Final[dict[str, IndexFunc]] = {BY_OWNER_UID: by_owner_uid}


class Store:
    """A thread-safe map from object key to object, with secondary indexes.

    Every method takes one lock, so each call sees and leaves a consistent cache; the informer is
    expected to be the only writer. (`builtins.list` in annotations: the `list` method shadows it here.)
    """

    def __init__(self, indexers: dict[str, IndexFunc] | None = None) -> None:
        self._lock = threading.Lock()
        self._indexers: dict[str, IndexFunc] = dict(indexers or {})
        self._objects: dict[str, KubeObject] = {}
        # index name -> index value -> keys of the objects that produce that value
        self._indices: dict[str, dict[str, set[str]]] = {name: {} for name in self._indexers}

    def add(self, obj: KubeObject) -> KubeObject | None:
        """Stores `obj` (replacing any object with the same key); returns the object it replaced."""
        return self.update(obj)

    def update(self, obj: KubeObject) -> KubeObject | None:
        """Same as `add`: stores `obj` and returns the object previously stored under its key."""
        key = object_key(obj)
        with self._lock:
            previous = self._objects.get(key)
            self._objects[key] = obj
            self._reindex_locked(key, previous, obj)
            return previous

    def delete(self, obj: KubeObject) -> KubeObject | None:
        """Removes the object with `obj`'s key; returns what was stored (None if nothing was)."""
        key = object_key(obj)
        with self._lock:
            previous = self._objects.pop(key, None)
            if previous is not None:
                self._reindex_locked(key, previous, None)
            return previous

    def replace(self, objs: Iterable[KubeObject]) -> list[KubeObject]:
        """Makes the store hold exactly `objs` (a relist); returns the stored objects that vanished."""
        fresh = {object_key(obj): obj for obj in objs}
        with self._lock:
            vanished = [obj for key, obj in self._objects.items() if key not in fresh]
            self._objects = fresh
            self._indices = {name: {} for name in self._indexers}
            for key, obj in fresh.items():
                self._reindex_locked(key, None, obj)
            return vanished

    def get(self, key: str) -> KubeObject | None:
        with self._lock:
            return self._objects.get(key)

    def list(self) -> list[KubeObject]:
        with self._lock:
            return list(self._objects.values())

    def keys(self) -> builtins.list[str]:
        with self._lock:
            return list(self._objects)

    def by_index(self, index: str, value: str) -> builtins.list[KubeObject]:
        """The objects whose indexer `index` produced `value`, in key order. KeyError for an unknown index."""
        with self._lock:
            return [self._objects[key] for key in sorted(self._index_locked(index).get(value, ()))]

    def index_keys(self, index: str, value: str) -> builtins.list[str]:
        """The keys of the objects `by_index` would return."""
        with self._lock:
            return sorted(self._index_locked(index).get(value, ()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def _index_locked(self, index: str) -> dict[str, set[str]]:
        try:
            return self._indices[index]
        except KeyError:
            raise KeyError(f"no index named {index!r}") from None

    def _reindex_locked(self, key: str, old: KubeObject | None, new: KubeObject | None) -> None:
        for name, index_func in self._indexers.items():
            old_values = set(index_func(old)) if old is not None else set()
            new_values = set(index_func(new)) if new is not None else set()
            index = self._indices[name]
            for value in old_values - new_values:
                keys = index.get(value)
                if keys is None:
                    continue
                keys.discard(key)
                if not keys:
                    del index[value]
            for value in new_values - old_values:
                index.setdefault(value, set()).add(key)
