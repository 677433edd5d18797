"""JSON merge patches (RFC 7386) computed from two versions of an object.

Status is written with a merge patch carrying only what changed: removed fields become explicit
nulls, nested objects are diffed key by key and lists are replaced whole (merge patch has no list
semantics, so `conditions` always travels complete). An empty diff means no write at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `old` into `new` (empty when they are equal)."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if key in old and before == value:
            continue
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = diff(before, value)
            if nested:
                patch[key] = nested
        else:
            patch[key] = value
    return patch


def apply(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Applies a merge patch (what the API server does), for tests and for predicting results."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping):
            current = result.get(key)
            result[key] = apply(current if isinstance(current, Mapping) else {}, value)
        else:
            result[key] = value
    return result
