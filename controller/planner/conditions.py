"""Status conditions per Kubernetes API conventions, kept stable so status does not flap.

A condition's lastTransitionTime changes only when its status flips; reason and message may change
without a transition. Setting a condition to what it already says changes nothing, which is what
lets the reconciler skip status writes when nothing happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from crd.contract import Condition

# Conditions are listed in this order (the order of the Condition names).
ORDER: Final = tuple(Condition)


def get(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    for entry in conditions or []:
        if entry.get("type") == type_:
            return entry
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> bool:
    entry = get(conditions, type_)
    return entry is not None and entry.get("status") == "True"


def set_condition(
    conditions: Sequence[Mapping[str, Any]] | None,
    type_: str,
    status: bool,
    *,
    reason: str,
    message: str,
    now: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """Returns a new list with `type_` set; lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
    result: list[dict[str, Any]] = []
    found = False
    for entry in conditions or []:
        if entry.get("type") != type_:
            result.append(dict(entry))
            continue
        found = True
        updated = dict(entry)
        if entry.get("status") != value:
            updated["lastTransitionTime"] = now
        updated.update({"status": value, "reason": reason, "message": message})
        if generation is not None:
            updated["observedGeneration"] = generation
        result.append(updated)
    if not found:
        created: dict[str, Any] = {
            "type": str(type_),
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now,
        }
        if generation is not None:
            created["observedGeneration"] = generation
        result.append(created)
    rank = {str(name): position for position, name in enumerate(ORDER)}
    result.sort(key=lambda entry: rank.get(str(entry.get("type")), len(ORDER)))
    return result


def clear(
    conditions: Sequence[Mapping[str, Any]] | None,
    type_: str,
    *,
    reason: str,
    message: str,
    now: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """Sets `type_` False only if it is present (a condition that never held need not be written)."""
    if get(conditions, type_) is None:
        return [dict(entry) for entry in conditions or []]
    return set_condition(
        conditions, type_, False, reason=reason, message=message, now=now, generation=generation
    )
