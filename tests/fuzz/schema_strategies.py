"""Hypothesis strategies that generate values from an OpenAPI (structural CRD) schema.

Why: the fuzzer must cover every field the TrainingJob schema has, including fields added after it was
written (a generated pod template, generated affinity schemas), without anyone editing it. So values
are derived from the schema node itself: its type, enum, bounds, pattern, required properties,
list type and map keys, int-or-string, free-form objects. Most generated values are well formed, so a
good share of manifests pass admission: the accepted ones are those that reach the operator.

Two things keep generation cheap on a large schema (a whole pod template inline):
- optional properties are drawn sparsely, and more sparsely the deeper they sit (below
  `FULL_DEPTH` only required properties are filled in), so a manifest stays small;
- a strategy is built once per schema node and cached by the node's identity.

String rules written in CEL that a generator can read (`self.matches('re')`, `self.size() <= n`) are
honoured like a schema pattern and maxLength, so, for example, metadata.name is mostly a DNS label.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hypothesis import strategies as st

Schema = Mapping[str, Any]
JsonValue = Any

# Beyond this many object levels, only required properties are generated.
FULL_DEPTH = 6
# Most strings, lists and maps are short; the mutations make long ones on purpose.
SHORT = 12
FEW = 3
INT_OR_STRING = "x-kubernetes-int-or-string"
PRESERVE = "x-kubernetes-preserve-unknown-fields"
MATCHES = re.compile(r"^self\.matches\('((?:[^'\\]|\\.)*)'\)$")
SIZE_AT_MOST = re.compile(r"^self\.size\(\) <= (\d+)$")
# What a few common int-or-string values look like, when the schema gives no pattern.
INT_OR_STRING_SAMPLES = ("1", "25%", "100m", "1Gi", "0")
PLAIN_ALPHABET = string.ascii_letters + string.digits + "-_./:"


def weighted_true(chance_in: int) -> st.SearchStrategy[bool]:
    """True once in `chance_in` draws (uniform over a list, unlike st.booleans() which is 50/50);
    shrinks to False."""
    return st.sampled_from([False] * (chance_in - 1) + [True])


def json_scalars() -> st.SearchStrategy[JsonValue]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=SHORT),
    )


def json_values(max_leaves: int = 8) -> st.SearchStrategy[JsonValue]:
    """Any JSON value, small."""
    return st.recursive(
        json_scalars(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=FEW), st.dictionaries(st.text(max_size=SHORT), inner, max_size=FEW)
        ),
        max_leaves=max_leaves,
    )


def cel_string_bounds(node: Schema) -> tuple[str | None, int | None]:
    """A pattern and a maximum length stated by a string node's simple CEL rules, if any."""
    pattern: str | None = None
    longest: int | None = None
    for entry in node.get("x-kubernetes-validations") or ():
        text = str(entry.get("rule", "")).strip()
        if matched := MATCHES.match(text):
            pattern = matched.group(1).replace("\\\\", "\\")
        elif sized := SIZE_AT_MOST.match(text):
            longest = int(sized.group(1))
    return pattern, longest


def _bounded_text(max_length: int, min_length: int) -> st.SearchStrategy[str]:
    cap = max(min_length, min(max_length, SHORT))
    plain = st.text(alphabet=PLAIN_ALPHABET, min_size=min_length, max_size=cap)
    anything = st.text(min_size=min_length, max_size=cap)
    return st.one_of(plain, plain, anything)


def string_values(node: Schema) -> st.SearchStrategy[str]:
    max_length = int(node.get("maxLength", 64))
    min_length = int(node.get("minLength", 0))
    pattern = node.get("pattern")
    cel_pattern, cel_longest = cel_string_bounds(node)
    if cel_longest is not None:
        max_length = min(max_length, cel_longest)
    pattern = pattern or cel_pattern
    if pattern:
        # Truncating may break the pattern: such values are refused at admission, which is fine.
        shortest = max(min_length, 1)
        return (
            st.from_regex(pattern, fullmatch=True)
            .map(lambda text: text[: max(shortest, min(max_length, SHORT * 2))])
            .filter(lambda text: len(text) >= min_length)
        )
    return _bounded_text(max_length, min_length)


def integer_values(node: Schema) -> st.SearchStrategy[int]:
    """Mostly small values near the minimum (a worker count of 70 costs 70 pods), sometimes any
    value within the bounds."""
    low = node.get("minimum")
    high = node.get("maximum")
    low = int(low) if low is not None else -(2**31)
    high = int(high) if high is not None else 2**63 - 1
    if node.get("exclusiveMinimum"):
        low += 1
    start = max(low, 0) if low <= 0 <= high else low
    near = st.integers(min_value=start, max_value=min(high, start + 3))
    anywhere = st.integers(min_value=low, max_value=high)
    return st.sampled_from([near] * 7 + [anywhere]).flatmap(lambda strategy: strategy)


def number_values(node: Schema) -> st.SearchStrategy[float | int]:
    low = node.get("minimum")
    high = node.get("maximum")
    return st.floats(
        min_value=None if low is None else float(low),
        max_value=None if high is None else float(high),
        exclude_min=bool(node.get("exclusiveMinimum")) and low is not None,
        allow_nan=False,
        allow_infinity=False,
    )


def int_or_string_values(node: Schema) -> st.SearchStrategy[int | str]:
    minimum = int(node.get("minimum", 0))
    numbers = st.integers(min_value=minimum, max_value=minimum + 64)
    texts = string_values(node) if node.get("pattern") else st.sampled_from(INT_OR_STRING_SAMPLES)
    return st.one_of(numbers, texts)


class SchemaStrategies:
    """Builds (and caches) one strategy per schema node; `for_node(root)` generates whole objects."""

    def __init__(self, full_depth: int = FULL_DEPTH, optional_chance: int = 4) -> None:
        self.full_depth = full_depth
        self.optional_chance = optional_chance
        # Keyed by the node's id, and holding the node: a node built for one call (the `{}` of a list
        # without `items`) and then freed could otherwise hand its id, and its strategy, to a node
        # allocated later.
        self._cache: dict[tuple[int, int], tuple[Schema, st.SearchStrategy[JsonValue]]] = {}

    def for_node(self, node: Schema, depth: int = 0) -> st.SearchStrategy[JsonValue]:
        key = (id(node), min(depth, self.full_depth + 1))
        cached = self._cache.get(key)
        if cached is not None and cached[0] is node:
            return cached[1]
        strategy = self._build(node, depth)
        self._cache[key] = (node, strategy)
        return strategy

    def _build(self, node: Schema, depth: int) -> st.SearchStrategy[JsonValue]:
        if "enum" in node:
            return st.sampled_from(list(node["enum"]))
        if node.get(INT_OR_STRING):
            return int_or_string_values(node)
        kind = node.get("type")
        if kind is None and "anyOf" in node:
            return st.one_of([self.for_node(option, depth) for option in node["anyOf"]])
        builders: dict[str, Callable[[], st.SearchStrategy[JsonValue]]] = {
            "string": lambda: string_values(node),
            "integer": lambda: integer_values(node),
            "number": lambda: number_values(node),
            "boolean": st.booleans,
            "array": lambda: self._array(node, depth),
            "object": lambda: self._object(node, depth),
        }
        build = builders.get(str(kind))
        value = build() if build is not None else json_values()
        if node.get("nullable"):
            value = st.one_of(value, st.none())
        return value

    def _array(self, node: Schema, depth: int) -> st.SearchStrategy[list[JsonValue]]:
        items = self.for_node(node.get("items") or {}, depth + 1)
        max_items = min(int(node.get("maxItems", FEW)), FEW)
        min_items = int(node.get("minItems", 0))
        list_type = node.get("x-kubernetes-list-type", "atomic")
        if list_type == "set":
            return st.lists(items, min_size=min_items, max_size=max(max_items, min_items), unique_by=_frozen)
        if list_type == "map":
            keys = tuple(node.get("x-kubernetes-list-map-keys") or ())
            return st.lists(
                items,
                min_size=min_items,
                max_size=max(max_items, min_items),
                unique_by=lambda item: tuple(
                    _frozen(item.get(k)) if isinstance(item, dict) else None for k in keys
                ),
            )
        return st.lists(items, min_size=min_items, max_size=max(max_items, min_items))

    def _object(self, node: Schema, depth: int) -> st.SearchStrategy[dict[str, JsonValue]]:
        properties: Mapping[str, Schema] = node.get("properties") or {}
        additional = node.get("additionalProperties")
        if not properties and isinstance(additional, Mapping):
            max_properties = min(int(node.get("maxProperties", FEW)), FEW)
            keys = st.text(alphabet=PLAIN_ALPHABET, min_size=1, max_size=SHORT)
            return st.dictionaries(keys, self.for_node(additional, depth + 1), max_size=max_properties)
        if not properties:
            # A free-form object: the schema says nothing, so any small JSON object.
            return st.dictionaries(st.text(max_size=SHORT), json_values(), max_size=FEW)
        required = set(node.get("required") or ())
        return self._properties(properties, required, depth)

    def _properties(
        self, properties: Mapping[str, Schema], required: set[str], depth: int
    ) -> st.SearchStrategy[dict[str, JsonValue]]:
        required_strategies = {name: self.for_node(properties[name], depth + 1) for name in sorted(required)}
        if depth >= self.full_depth:
            return st.fixed_dictionaries(required_strategies)
        optional_names = sorted(set(properties) - required)
        # Deeper objects get fewer optional fields.
        chance = self.optional_chance * (1 + depth // 2)
        optional = {name: self.for_node(properties[name], depth + 1) for name in optional_names}

        @st.composite
        def sparse(draw: st.DrawFn) -> dict[str, JsonValue]:
            value = draw(st.fixed_dictionaries(required_strategies))
            for name in optional_names:
                if draw(weighted_true(chance)):
                    value[name] = draw(optional[name])
            return value

        return sparse()


def _frozen(value: JsonValue) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return (type(value).__name__, value)


# ------------------------------------------------------------------------------------- schema paths

# A path step: a property name, ITEM for an array item, VALUE for a map value.
ITEM = "[]"
VALUE = "{}"
SchemaPath = tuple[str, ...]


def schema_paths(node: Schema, max_depth: int = 64) -> Iterator[tuple[SchemaPath, Schema]]:
    """Every (path, node) under `node`, depth-first, stopping at `max_depth` steps."""

    def walk(current: Schema, path: SchemaPath) -> Iterator[tuple[SchemaPath, Schema]]:
        yield path, current
        if len(path) >= max_depth:
            return
        for name, child in sorted((current.get("properties") or {}).items()):
            yield from walk(child, (*path, name))
        items = current.get("items")
        if isinstance(items, Mapping):
            yield from walk(items, (*path, ITEM))
        additional = current.get("additionalProperties")
        if isinstance(additional, Mapping):
            yield from walk(additional, (*path, VALUE))

    yield from walk(node, ())


def is_free_form(node: Schema) -> bool:
    """An object (or untyped node) whose content the API server stores without a schema."""
    if node.get(INT_OR_STRING):
        return False
    if node.get("type") is None and "anyOf" not in node:
        return True
    return bool(node.get(PRESERVE))


def type_name(node: Schema) -> str:
    if node.get(INT_OR_STRING):
        return "int-or-string"
    return str(node.get("type") or "any")


def dotted(path: SchemaPath) -> str:
    """spec.env[].valueFrom style, for messages."""
    text = ""
    for step in path:
        text += step if step in (ITEM, VALUE) else (f".{step}" if text else step)
    return text
