"""fastjson: orjson where it takes the value, the standard module's answer where it does not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.runtime import fastjson


@pytest.mark.parametrize(
    "text",
    [
        b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","labels":{"x":"\\u00e9"}},"n":[1,2.5,null]}',
        b'{"lone": "\\ud800"}',  # an escaped lone surrogate
        b"[NaN, Infinity, -Infinity]",
    ],
    ids=["pod", "lone-surrogate", "non-finite"],
)
def test_decodes_what_the_standard_decoder_decodes(text: bytes) -> None:
    expected = json.loads(text)
    decoded = fastjson.loads(text)
    assert json.dumps(decoded) == json.dumps(expected)


def test_nesting_past_the_limit_is_a_recursion_error_as_from_the_standard_decoder() -> None:
    """boundedjson's truncating parser takes over on RecursionError."""
    with pytest.raises(RecursionError):
        fastjson.loads(b"[" * 5000 + b"]" * 5000)


def test_integers_beyond_64_bits_are_read_as_floats_as_the_api_server_stores_them() -> None:
    """The API server decodes a number beyond int64 to a float64 before storing it, so its answers
    never hold one; orjson reads one as a float too."""
    assert fastjson.loads(b'{"n": 123456789012345678901234567890}') == {"n": 1.2345678901234568e29}


@pytest.mark.parametrize("text", [b"", b"{", b'{"a": 1,}', b"\xff\xfe", b"{'a': 1}"])
def test_what_is_not_json_is_a_value_error(text: bytes) -> None:
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)):
        fastjson.loads(text)


@pytest.mark.parametrize(
    "value",
    [
        {"metadata": {"name": "a", "labels": {"é": "ü"}}, "spec": [1, 2.5, None, True]},
        {"big": 2**70},
        {1: "a non-string key"},
    ],
    ids=["object", "big-integer", "integer-key"],
)
def test_encodes_compact_json_that_decodes_to_what_json_makes_of_it(value: Any) -> None:
    encoded = fastjson.dumps(value)
    assert b": " not in encoded
    assert b", " not in encoded
    assert json.loads(encoded) == json.loads(json.dumps(value))
