"""Whole TrainingJob manifests for the fuzzer: generated from the CRD's schema, then mutated.

`manifests()` is the strategy: a manifest built by tests/fuzz/schema_strategies.py from the
openAPIV3Schema that crd/ builds (so it follows the schema of the working tree, whatever fields it
has), left as is about one time in four, otherwise broken by one to three mutations
(tests/fuzz/mutations.py). `generate(count, seed)` draws a fixed list of them: the same seed and
the same schema give the same manifests, so a fuzz run can be repeated exactly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cache
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from crd import contract
from crd.defaults import _root_schema
from tests.fuzz.mutations import Manifest, Mutator
from tests.fuzz.schema_strategies import Schema, SchemaStrategies


@dataclass(frozen=True)
class Generated:
    """One generated manifest and the mutations that made it ("valid" when none)."""

    manifest: Manifest
    mutations: tuple[str, ...]


@cache
def root_schema() -> Schema:
    return _root_schema()


@cache
def _strategies() -> SchemaStrategies:
    return SchemaStrategies()


@cache
def _mutator() -> Mutator:
    return Mutator(root_schema(), _strategies())


def well_formed(root: Schema | None = None) -> st.SearchStrategy[Manifest]:
    """A manifest following the schema: apiVersion, kind, metadata.name (Kubernetes requires a name even
    though the schema cannot say so) and a spec generated from the spec's schema. The status
    subresource is left out (the API server ignores it on create)."""
    node = root if root is not None else root_schema()
    strategies = _strategies() if root is None else SchemaStrategies()
    name_node = node["properties"]["metadata"]["properties"]["name"]
    return st.fixed_dictionaries(
        {
            "apiVersion": st.just(contract.API_VERSION),
            "kind": st.just(contract.KIND),
            "metadata": st.fixed_dictionaries({"name": strategies.for_node(name_node, depth=1)}),
            "spec": strategies.for_node(node["properties"]["spec"], depth=1),
        }
    )


@st.composite
def manifests(draw: st.DrawFn) -> Generated:
    manifest = copy.deepcopy(draw(well_formed()))
    if draw(st.sampled_from([True, False, False, False])):
        return Generated(manifest, ())
    mutator = _mutator()
    count = draw(st.integers(1, 3))
    labels = [draw(st.sampled_from(mutator.all()))(draw, manifest) for _ in range(count)]
    return Generated(manifest, tuple(labels))


def generate(count: int, seed_value: int) -> list[Generated]:
    """`count` manifests drawn deterministically from `seed_value` (generation only: nothing to shrink
    here; the fuzz run shrinks what breaks a property)."""
    drawn: list[Generated] = []

    @seed(seed_value)
    @settings(
        max_examples=count,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(manifests())
    def collect(generated: Generated) -> None:
        drawn.append(generated)

    collect()
    return drawn


def with_name(manifest: Manifest, name: str) -> Manifest:
    renamed: dict[str, Any] = copy.deepcopy(manifest)
    renamed.setdefault("metadata", {})["name"] = name
    return renamed
