"""Decoding that no object can turn against the process: depth checks, truncation, fallbacks."""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import pytest

from controller.runtime import boundedjson
from controller.runtime.boundedjson import TRUNCATED_KEY, loads, nesting_exceeds, truncated_paths


def nested_arrays(depth: int) -> str:
    return "[" * depth + "0" + "]" * depth


def depth_of(value: Any) -> int:
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, level + 1) for child in children)
    return deepest


def random_json(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth <= 0 or roll < 0.3:
        return rng.choice(
            [0, -1.5e3, True, False, None, "", 'q"uo\\te', "[{(", "]}", "\\", "é\u2028", 12345678901234567890]
        )
    if roll < 0.65:
        return [random_json(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    keys = ["a", "]", "}", '"', "\\", "k"]
    return {rng.choice(keys) + str(i): random_json(rng, depth - 1) for i in range(3)}


def test_shallow_json_decodes_exactly_like_the_standard_decoder() -> None:
    rng = random.Random(7)  # noqa: S311 - reproducible test data
    for _ in range(500):
        value = random_json(rng, 8)
        text = json.dumps(value)
        assert loads(text) == json.loads(text)
        assert loads(text, 8) == json.loads(text)


@pytest.mark.parametrize(
    ("depth", "exceeds"), [(1, False), (99, False), (100, False), (101, True), (5000, True)]
)
def test_the_depth_check_is_exact_at_the_limit(depth: int, exceeds: bool) -> None:
    assert nesting_exceeds(nested_arrays(depth).encode(), 100) is exceeds


def test_brackets_inside_strings_neither_add_nor_hide_depth() -> None:
    # Keys made of closing brackets would pair with the real opening ones if strings were not removed.
    hidden = '{"]": ' * 300 + "0" + "}" * 300
    assert nesting_exceeds(hidden.encode(), 100)
    decoy = json.dumps({"a": "[" * 500, "b": "{" * 500 + '\\"' + "[" * 5, "c": "\\" * 7})
    assert not nesting_exceeds(decoy.encode(), 100)
    assert loads(decoy) == json.loads(decoy)


def test_deep_subtrees_are_replaced_and_the_shallow_part_kept() -> None:
    deep = '{"k": [' * 1500 + "1" + "]}" * 1500
    spec = '{"affinity": ' + deep + ', "ok": [1, {"y": "z"}]}'
    text = '{"metadata": {"name": "job", "uid": "u-1"}, "spec": ' + spec + "}"
    decoded = loads(text)
    assert decoded["metadata"] == {"name": "job", "uid": "u-1"}
    assert decoded["spec"]["ok"] == [1, {"y": "z"}]
    assert depth_of(decoded) == boundedjson.DEFAULT_MAX_DEPTH + 1
    paths = truncated_paths(decoded)
    assert len(paths) == 1
    assert paths[0].startswith("spec.affinity.k[0].k[0]")


def test_truncation_keeps_siblings_of_the_cut_subtree() -> None:
    decoded = loads('{"a": [1, 2.5e3, true, null, "x\\u00e9\\"]", {"b": {}}], "c": {"d": [[]]}}', 3)
    marker = {TRUNCATED_KEY: "nested deeper than 3 levels"}
    assert decoded == {"a": [1, 2500.0, True, None, 'xé"]', {"b": marker}], "c": {"d": [marker]}}
    assert truncated_paths(decoded) == ["a[5].b", "c.d[0]"]


def test_a_payload_too_deep_for_the_standard_decoder_is_truncated_even_unchecked() -> None:
    text = nested_arrays(sys.getrecursionlimit() * 3)
    with pytest.raises(RecursionError):
        json.loads(text)
    decoded = loads(text, check_nesting=False)
    assert depth_of(decoded) == boundedjson.DEFAULT_MAX_DEPTH + 1


def test_unchecked_decoding_of_shallow_payloads_is_the_standard_decoder() -> None:
    text = json.dumps({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}})
    assert loads(text, check_nesting=False) == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", '{"a": 1}}', "[1, 2", "nope", '{"a": 1} 2'])
def test_text_that_is_not_json_raises_value_error_on_both_paths(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the same error type json.loads raises
        loads(text)
    with pytest.raises(ValueError):  # noqa: PT011
        boundedjson._parse_truncating(text, 5)


def test_truncated_paths_is_bounded() -> None:
    marker = {TRUNCATED_KEY: "x"}
    value = {"items": [marker] * 50}
    assert len(truncated_paths(value, limit=10)) == 10
    assert truncated_paths({"a": 1}) == []
