"""How an informer's objects reach its store and its handlers (client-go's cache and processor).

Objects from a list or a watch are checked (a name, metadata), reduced (managedFields and kubectl's
last-applied annotation are never read; a transform may drop more) and compacted (short strings
interned, shared across thousands of cached objects), then stored. Handlers hear every
change: an add, an update (only when the resourceVersion moved, so a relist repeating an object is
silent), a delete, and a delete followed by an add when a name now holds another object (its UID
changed). A handler that raises is logged; the others still run.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from controller.runtime.resource import Resource
from controller.runtime.store import Store, object_key

logger = logging.getLogger(__name__)

KubeObject = dict[str, Any]
OnAdd = Callable[[KubeObject], None]
OnUpdate = Callable[[KubeObject, KubeObject], None]
OnDelete = Callable[[KubeObject], None]

LAST_APPLIED_ANNOTATION: Final = "kubectl.kubernetes.io/last-applied-configuration"
# Strings up to this length are interned: label values, phases, condition types and statuses repeat
# across thousands of cached objects; longer ones (messages, env values) rarely do.
INTERN_MAX_LENGTH: Final = 64


def compact(value: Any) -> Any:
    """The same JSON value with every short string interned, so thousands of cached objects share one
    copy of "True", "Running" or a job's label value. The keys are shared already: the decoder
    (`fastjson`, orjson) hands out each key it has seen before as the same string.

    Changes `value` in place and returns it (a decoded object is the informer's own). Rebuilding every
    dict with interned keys, as this did before the decoder shared them, cost 1.6 times as much per
    pod with thousands of pods held, much of it in the garbage collector that the new containers woke.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str | dict | list):
                value[key] = compact(item)
        return value
    if isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, str | dict | list):
                value[index] = compact(item)
        return value
    if isinstance(value, str) and len(value) <= INTERN_MAX_LENGTH:
        return sys.intern(value)
    return value


def metadata_of(obj: KubeObject) -> dict[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def resource_version_of(obj: KubeObject) -> str | None:
    version = metadata_of(obj).get("resourceVersion")
    return version if isinstance(version, str) and version else None


def _uid(obj: KubeObject) -> str | None:
    uid = metadata_of(obj).get("uid")
    return str(uid) if uid else None


def _replaced(old: KubeObject, new: KubeObject) -> bool:
    """True when `new` is a different object that reuses `old`'s name (deleted and re-created)."""
    old_uid, new_uid = _uid(old), _uid(new)
    return old_uid is not None and new_uid is not None and old_uid != new_uid


@dataclass(frozen=True)
class _Handler:
    on_add: OnAdd | None
    on_update: OnUpdate | None
    on_delete: OnDelete | None


class Delivery:
    """Puts objects of one resource into `store` and tells the registered handlers what changed.

    Used by one informer thread only; `name` is how log lines name the informer.
    """

    def __init__(
        self,
        store: Store,
        resource: Resource,
        name: str,
        transform: Callable[[KubeObject], KubeObject] | None = None,
    ) -> None:
        self.store = store
        self._resource = resource
        self._name = name
        self._transform = transform
        self._handlers: list[_Handler] = []

    def add_handler(
        self, on_add: OnAdd | None, on_update: OnUpdate | None, on_delete: OnDelete | None
    ) -> None:
        self._handlers.append(_Handler(on_add, on_update, on_delete))

    def prepare(self, raw: object) -> KubeObject | None:
        """Validates an object from the server and drops the fields the controller never reads."""
        if not isinstance(raw, dict) or not isinstance(raw.get("metadata"), dict):
            logger.warning("%s: skipping an object without metadata: %.200r", self._name, raw)
            return None
        try:
            object_key(raw)
        except ValueError:
            logger.warning("%s: skipping an object without a name: %.200r", self._name, raw)
            return None
        metadata: dict[str, Any] = raw["metadata"]
        metadata.pop("managedFields", None)
        annotations = metadata.get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED_ANNOTATION in annotations:
            del annotations[LAST_APPLIED_ANNOTATION]
            if not annotations:
                del metadata["annotations"]
        # Items of a list carry no apiVersion/kind; set them so handlers see the same shape as a watch.
        raw.setdefault("apiVersion", self._resource.api_version)
        raw.setdefault("kind", self._resource.kind)
        prepared: KubeObject = compact(self._transform(raw) if self._transform is not None else raw)
        return prepared

    def replace_all(self, objs: list[KubeObject]) -> None:
        """Replaces the store's content (a relist); handlers hear what changed, and deletes for what
        vanished."""
        previous = {object_key(obj): self.store.get(object_key(obj)) for obj in objs}
        vanished = self.store.replace(objs)
        for obj in objs:
            self._changed(previous[object_key(obj)], obj)
        for old in vanished:
            self._notify_delete(old)

    def apply(self, event_type: str, obj: KubeObject) -> None:
        """One watch event (ADDED, MODIFIED or DELETED) of a prepared object."""
        if event_type == "DELETED":
            self.store.delete(obj)
            self._notify_delete(obj)
            return
        self._changed(self.store.update(obj), obj)

    def _changed(self, old: KubeObject | None, obj: KubeObject) -> None:
        """Add for a new object; delete + add when the name now holds another object (the UID changed);
        update when it changed; nothing when the resourceVersion is the same (a relist repeating it)."""
        if old is None:
            self._notify_add(obj)
        elif _replaced(old, obj):
            self._notify_delete(old)
            self._notify_add(obj)
        elif resource_version_of(old) != resource_version_of(obj):
            self._notify_update(old, obj)

    def _notify_add(self, obj: KubeObject) -> None:
        for handler in self._handlers:
            if handler.on_add is not None:
                self._call("add", handler.on_add, obj)

    def _notify_update(self, old: KubeObject, new: KubeObject) -> None:
        for handler in self._handlers:
            if handler.on_update is not None:
                self._call("update", handler.on_update, old, new)

    def _notify_delete(self, obj: KubeObject) -> None:
        for handler in self._handlers:
            if handler.on_delete is not None:
                self._call("delete", handler.on_delete, obj)

    def _call(self, what: str, handler: Callable[..., None], *objs: KubeObject) -> None:
        try:
            handler(*objs)
        except Exception:
            logger.exception("%s handler of %s failed for %s", what, self._name, object_key(objs[-1]))
