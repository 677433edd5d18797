"""JSON from the API server decoded so that no single object can hurt the process that reads it.

The API server stores whatever a schema lets through. A custom resource with a free-form field
(`x-kubernetes-preserve-unknown-fields`) can hold a value nested thousands of levels deep: Python's
decoder then raises RecursionError, and even a value it can decode makes every recursive walk of the
object (copying, defaulting, interning) exceed the interpreter's recursion limit. Inside an
informer that means one user's object stops the watch of a whole resource, for every tenant.

`loads` therefore bounds what it returns. A payload whose nesting stays within `max_depth` (the
common case: Kubernetes' own objects are about a dozen levels deep) is decoded at C speed
(`fastjson`) after a cheap check that runs at C speed too. A deeper one is decoded by a small iterative
parser that keeps the shallow part intact (metadata, names, UIDs) and replaces each subtree below
`max_depth` with `{TRUNCATED_KEY: "<why>"}`, so the caller can still see whose object it was and
say what is wrong with it. Nothing here recurses, whatever the input.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from controller.runtime import fastjson

# The key of the object that replaces a subtree nested deeper than the limit.
TRUNCATED_KEY: Final = "$truncated"
# Levels of nesting kept (the outermost object or array is level 1). Generous for Kubernetes objects,
# small enough that recursive code walking the result stays far from Python's recursion limit.
DEFAULT_MAX_DEPTH: Final = 100

_BRACKETS: Final = b"[]{}"
_NOT_BRACKETS: Final = bytes(sorted(set(range(256)) - set(_BRACKETS)))
_AS_PARENS: Final = bytes.maketrans(b"[]{}", b"()()")
_TOKEN: Final = re.compile(
    r"""\s*(?:
        (?P<punct>[\[\]{}:,])
      | (?P<string>")
      | (?P<number>-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?)
      | (?P<literal>true|false|null)
    )""",
    re.VERBOSE,
)
_LITERALS: Final[dict[str, Any]] = {"true": True, "false": False, "null": None}


def truncation_marker(max_depth: int) -> dict[str, str]:
    return {TRUNCATED_KEY: f"nested deeper than {max_depth} levels"}


def nesting_exceeds(payload: bytes, max_depth: int) -> bool:
    """Whether the JSON text nests objects and arrays more than `max_depth` levels deep.

    The text outside strings is kept (escaped backslashes, then escaped quotes removed, so every quote
    left delimits a string), reduced to its brackets, and innermost pairs are removed one level per
    pass: the passes needed to empty it are its depth. Every step is a C-level bytes operation, and
    there are at most `max_depth` + 1 passes.
    """
    if payload.count(b"[") + payload.count(b"{") <= max_depth:
        return False
    unescaped = payload.replace(b"\\\\", b"").replace(b'\\"', b"")
    brackets = b"".join(unescaped.split(b'"')[::2]).translate(_AS_PARENS, _NOT_BRACKETS)
    for _ in range(max_depth):
        if not brackets:
            return False
        brackets = brackets.replace(b"()", b"")
    return bool(brackets)


def truncated_paths(value: Any, limit: int = 10) -> list[str]:
    """Where `value` (decoded by `loads`) holds truncation markers, as dotted paths; at most `limit`."""
    found: list[str] = []
    pending: list[tuple[str, Any]] = [("", value)]
    while pending and len(found) < limit:
        path, item = pending.pop()
        if isinstance(item, dict):
            if TRUNCATED_KEY in item:
                found.append(path or ".")
                continue
            pending.extend((f"{path}.{key}" if path else str(key), child) for key, child in item.items())
        elif isinstance(item, list):
            pending.extend((f"{path}[{index}]", child) for index, child in enumerate(item))
    return sorted(found)


def loads(payload: bytes | str, max_depth: int = DEFAULT_MAX_DEPTH, *, check_nesting: bool = True) -> Any:
    """The decoded JSON value, with subtrees below `max_depth` levels replaced by a truncation marker.

    `check_nesting` False skips the up-front check, for payloads whose schema already bounds their
    depth (Kubernetes' built-in kinds): they are decoded by `fastjson.loads` and fall back to
    truncation only if it hits the recursion limit. Raises ValueError for text that is not JSON.
    """
    data = payload.encode() if isinstance(payload, str) else payload
    if not (check_nesting and nesting_exceeds(data, max_depth)):
        try:
            return fastjson.loads(data)
        except RecursionError:
            pass
    return _parse_truncating(data.decode("utf-8"), max_depth)


class _Container:
    """An object or array being built, or skipped (`value` None) below the depth limit."""

    __slots__ = ("key", "value")

    def __init__(self, value: dict[str, Any] | list[Any] | None) -> None:
        self.value = value
        self.key: str | None = None


class _TruncatingParser:
    """An iterative JSON parser (no recursion) that truncates below `max_depth`. It expects well-formed
    JSON (it reads the API server's answers) and checks only what keeps it from building a wrong shape."""

    def __init__(self, text: str, max_depth: int) -> None:
        self.text = text
        self.max_depth = max_depth
        self.stack: list[_Container] = []
        self.result: Any = None
        self.have_result = False

    def parse(self) -> Any:
        position = 0
        while (match := _TOKEN.match(self.text, position)) is not None:
            position = match.end()
            punct = match.group("punct")
            if match.group("string") is not None:
                value, position = json.decoder.scanstring(self.text, position)  # type: ignore[attr-defined]
                self.string(value)
            elif punct in ("{", "["):
                self.open(punct)
            elif punct in ("}", "]"):
                if not self.stack:
                    raise ValueError(f"unbalanced {punct!r} at offset {position}")
                self.stack.pop()
            elif match.group("number") is not None:
                self.scalar(json.loads(match.group("number")))
            elif match.group("literal") is not None:
                self.scalar(_LITERALS[match.group("literal")])
            # "," and ":" carry no information once keys and values are tracked.
        if self.text[position:].strip():
            raise ValueError(f"invalid JSON at offset {position}")
        if self.stack or not self.have_result:
            raise ValueError("truncated JSON text")
        return self.result

    def skipping(self) -> bool:
        return bool(self.stack) and self.stack[-1].value is None

    def attach(self, value: Any) -> None:
        if not self.stack:
            if self.have_result:
                raise ValueError("extra data after the JSON value")
            self.result, self.have_result = value, True
            return
        top = self.stack[-1]
        if isinstance(top.value, list):
            top.value.append(value)
        elif isinstance(top.value, dict):
            if top.key is None:
                raise ValueError("object value without a key")
            top.value[top.key] = value
            top.key = None

    def string(self, value: str) -> None:
        if self.skipping():
            return
        top = self.stack[-1] if self.stack else None
        if top is not None and isinstance(top.value, dict) and top.key is None:
            top.key = value
        else:
            self.attach(value)

    def scalar(self, value: Any) -> None:
        if not self.skipping():
            self.attach(value)

    def open(self, bracket: str) -> None:
        if self.skipping():
            self.stack.append(_Container(None))
        elif len(self.stack) == self.max_depth:
            self.attach(truncation_marker(self.max_depth))
            self.stack.append(_Container(None))
        else:
            container = _Container({} if bracket == "{" else [])
            self.attach(container.value)
            self.stack.append(container)


def _parse_truncating(text: str, max_depth: int) -> Any:
    return _TruncatingParser(text, max_depth).parse()
