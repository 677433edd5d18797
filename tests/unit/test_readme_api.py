"""The README's table of spec fields against the CRD schema, so that the summary a new user reads first
cannot drift from the API: every top-level spec field has a row and every row names real fields, a
sub-field a row names (`storage.pvc.create.whenDeleted: Delete`) exists with the value it shows, and
a field with a closed set of values lists all of them (a value added to an enum, or one the schema no
longer has, fails here). The descriptions themselves are docs/api.md, generated from the same schema.
"""

from __future__ import annotations

import re
from typing import Any, Final

import pytest

from crd import contract
from crd.defaults import subschema
from tests.cluster import REPO

Schema = dict[str, Any]
HEADER: Final = "| spec field | what it sets |"
# `path`, `path: Value`, or `path` followed by a parenthesised list of its values.
NAMED: Final = re.compile(r"`([a-z][A-Za-z]*(?:\.[a-z][A-Za-z]*)*)(?:: ([A-Za-z]+))?`(?: \(([^)]*)\))?")


def spec_table(markdown: str) -> list[tuple[str, str]]:
    """The (field cell, description cell) rows of the README's spec-field table."""
    lines = markdown.splitlines()
    start = lines.index(HEADER) + 2  # after the header and its separator
    rows: list[tuple[str, str]] = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        field, description = (cell.strip() for cell in line.strip()[1:-1].split(" | ", 1))
        rows.append((field, description))
    return rows


ROWS: Final = spec_table((REPO / "README.md").read_text(encoding="utf-8"))
SPEC: Final = subschema("spec")


def resolve(schema: Schema, path: str) -> Schema | None:
    """The schema node at a dotted property path, or None if a name on the way is not a field."""
    node: Schema | None = schema
    for name in path.split("."):
        node = (node or {}).get("properties", {}).get(name)
    return node


def fields_of(cell: str) -> list[str]:
    return [match.group(1) for match in NAMED.finditer(cell)]


def test_the_table_is_found_and_read() -> None:
    assert len(ROWS) >= 10
    table = f"text\n{HEADER}\n|---|---|\n| `a`, `b` (x) | c, `d` |\n| `e` | f |\n\n| not | this |\n"
    assert spec_table(table) == [("`a`, `b` (x)", "c, `d`"), ("`e`", "f")]


def test_every_top_level_spec_field_has_a_row_and_every_row_is_a_field() -> None:
    named = [name for field, _ in ROWS for name in fields_of(field)]
    assert sorted(named) == sorted(SPEC["properties"]), "README.md's spec-field table"


@pytest.mark.parametrize(("field", "description"), ROWS, ids=[field for field, _ in ROWS])
def test_a_row_names_real_sub_fields_and_shows_their_values(field: str, description: str) -> None:
    owners = [SPEC["properties"][name] for name in fields_of(field)]
    for match in NAMED.finditer(description):
        path, value, values = match.groups()
        # A sub-field of the row's fields, or a spec field.
        nodes = [node for node in (resolve(owner, path) for owner in [*owners, SPEC]) if node is not None]
        if not nodes:
            # Else a value of the row's own field (`pytorch`), or the trainer container's name.
            known = {contract.CONTAINER_NAME}.union(*(owner.get("enum", ()) for owner in owners))
            assert path in known, f"{field}: `{path}` is no field of the schema"
            continue
        enum = nodes[0].get("enum")
        if value is not None:
            assert value in (enum or ()), f"{field}: `{path}: {value}` is not one of its values"
        if enum is not None and values is not None:
            listed = set(re.findall(r"[A-Za-z]+", values))
            assert set(enum) <= listed, f"{field}: `{path}` ({values}) leaves out {set(enum) - listed}"


def test_a_field_with_a_closed_set_of_values_lists_them_in_its_row() -> None:
    for field, description in ROWS:
        for name in fields_of(field):
            enum = SPEC["properties"][name].get("enum")
            if enum is not None:
                text = f"{field} {description}"
                # A value that is not one word (a controller's name) is quoted as it is.
                words = set(re.findall(r"[A-Za-z]+", text)) | set(re.findall(r"`([^`]+)`", text))
                assert set(enum) <= words, f"{name}: {set(enum) - words}"
