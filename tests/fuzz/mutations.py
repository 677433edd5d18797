"""Mutations that turn a well-formed TrainingJob into the bad input a hostile or careless user writes.

Why: a generator that only follows the schema finds nothing; one that ignores it produces manifests
the API server refuses, which never reach the operator. Each mutation here takes a generated manifest
and breaks it in one way, at a place chosen from the schema (so new fields are mutated too): a wrong
type, an extreme number, an extreme size, hostile unicode, deep nesting in a free-form field, a hostile
name, an unknown field, or fields that conflict. Many mutated manifests are still accepted (a long
string within maxLength, a float the schema calls a number, nesting the schema cannot see): those are
the ones that test the operator.

Every mutation is a hypothesis strategy taking the manifest and returning (manifest, label); the
labels are counted in the fuzz summary.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from crd import contract
from tests.fuzz.schema_strategies import (
    ITEM,
    VALUE,
    JsonValue,
    Schema,
    SchemaPath,
    SchemaStrategies,
    is_free_form,
    json_values,
    schema_paths,
    type_name,
)

Manifest = dict[str, Any]
Mutation = Callable[[st.DrawFn, Manifest], str]

# Numbers past what every layer can hold: int32 and int64 edges, past JSON's doubles' exact integers,
# the largest double, fractions where integers go, negative zero.
EXTREME_NUMBERS: tuple[int | float, ...] = (
    -1,
    0,
    2**31 - 1,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    10**12,
    10**30,
    1e308,
    -1e308,
    5e-324,
    0.5,
    1.5,
    -0.0,
)
HUGE_STRING = 40_000
UNICODE_SAMPLES = (
    "\x00",
    "\x07bell\x1b[31m",
    "line\nbreak\r\n",
    "\u202eevil\u202c",  # right-to-left override
    "\u05e9\u05dc\u05d5\u05dd",  # Hebrew (RTL script)
    "\U0001f680\U0001f9e0",  # astral plane
    "\U000e0001tag",  # language tag
    "zero\u200bwidth\ufeff",
    "e\u0301\u0301\u0301",  # stacked combining marks
    "\u2028\u2029\x85",
    "\ud800",  # a lone surrogate: not UTF-8, escaped as \ud800 in JSON
    "\uffff\ufffe",
    "A" + "\u0300" * 200,
)
HOSTILE_NAMES = (
    "a" * contract.MAX_JOB_NAME,
    "a" * (contract.MAX_JOB_NAME + 1),
    "a" * 63,
    "a" * 64,
    "a" * 253,
    "a" * 254,
    "Upper",
    "9starts-with-digit",
    "-dash",
    "dash-",
    "dot.ted",
    "under_score",
    "sp ace",
    "\u0430dmin",  # Cyrillic a
    "\U0001f680",
    "a\x00b",
    "..",
    "a/b",
    "",
)
DEEP_LEVELS = (20, 99, 100, 101, 150, 400)
TYPE_SAMPLES: tuple[JsonValue, ...] = ("text", "", 7, 1.5, True, None, [], [1, "x"], {}, {"k": "v"})


JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _json_type(value: JsonValue) -> str:
    return next((name for kind, name in JSON_TYPES if isinstance(value, kind)), "null")


class Mutator:
    """Mutations of manifests of one root schema (the openAPIV3Schema of the CRD)."""

    def __init__(self, root: Schema, strategies: SchemaStrategies) -> None:
        self.root = root
        self.strategies = strategies
        spec_paths = [(p, n) for p, n in schema_paths(root) if p[:1] == ("spec",)]
        self.all_paths = [p for p, _ in spec_paths if len(p) > 1]
        self.nodes: dict[SchemaPath, Schema] = dict(spec_paths)
        self.numeric = [p for p, n in spec_paths if type_name(n) in ("integer", "number", "int-or-string")]
        self.strings = [p for p, n in spec_paths if type_name(n) in ("string", "int-or-string")]
        self.arrays = [p for p, n in spec_paths if type_name(n) == "array"]
        self.maps = [p for p, n in spec_paths if isinstance(n.get("additionalProperties"), Mapping)]
        self.keyed = [p for p in self.arrays if self.nodes[p].get("x-kubernetes-list-type") in ("map", "set")]
        self.free_form = [p for p, n in spec_paths if len(p) > 1 and is_free_form(n)]
        self.vocabulary = sorted({name for _, n in spec_paths for name in (n.get("properties") or {})})
        # Names of the fields that hold objects: a free-form field often passes such objects on.
        self.object_names = sorted(
            {path[-1] for path, n in spec_paths if n.get("properties") and path[-1] not in (ITEM, VALUE)}
        )
        self.declared_objects = [
            p
            for p, n in spec_paths
            if n.get("properties") and not n.get("x-kubernetes-preserve-unknown-fields")
        ]
        self.nesting_paths = self.free_form or self.declared_objects

    # ------------------------------------------------------------------------ placing a value at a path

    def place(self, draw: st.DrawFn, manifest: Manifest, path: SchemaPath, value: JsonValue) -> None:
        """Sets the value at `path`, creating the objects, lists and map entries on the way (a list or
        map on the way gets a generated element when it has none)."""
        node: Any = manifest
        for index, step in enumerate(path[:-1]):
            following = path[index + 1]
            container: Any = [] if following == ITEM else {}
            node = self._child(draw, node, step, path[: index + 1], container)
        last = path[-1]
        if last == ITEM:
            if not isinstance(node, list):
                raise ValueError(f"not a list at {path}")
            if node:
                node[draw(st.integers(0, len(node) - 1))] = value
            else:
                node.append(value)
        elif last == VALUE:
            if node:
                node[draw(st.sampled_from(sorted(node)))] = value
            else:
                node["k"] = value
        else:
            node[last] = value

    def _child(self, draw: st.DrawFn, node: Any, step: str, path: SchemaPath, empty: Any) -> Any:
        if step == ITEM:
            if not node:
                node.append(self._fresh(draw, path, empty))
            position = draw(st.integers(0, len(node) - 1))
            if not isinstance(node[position], type(empty)):
                node[position] = empty
            return node[position]
        if step == VALUE:
            if not node:
                node["k"] = self._fresh(draw, path, empty)
            key = draw(st.sampled_from(sorted(node)))
            if not isinstance(node[key], type(empty)):
                node[key] = empty
            return node[key]
        if not isinstance(node.get(step), type(empty)):
            node[step] = self._fresh(draw, path, empty)
        return node[step]

    def _fresh(self, draw: st.DrawFn, path: SchemaPath, empty: Any) -> Any:
        """A generated value for `path` when it has the container type needed, else `empty`."""
        schema = self.nodes.get(path)
        if schema is None:
            return empty
        value = draw(self.strategies.for_node(schema, depth=len(path)))
        return value if isinstance(value, type(empty)) else empty

    # ------------------------------------------------------------------------------------- mutations

    def wrong_type(self, draw: st.DrawFn, manifest: Manifest) -> str:
        path = draw(st.sampled_from(self.all_paths))
        wanted = type_name(self.nodes[path])
        value = draw(st.sampled_from([v for v in TYPE_SAMPLES if _json_type(v) != wanted]))
        self.place(draw, manifest, path, copy.deepcopy(value))
        return "wrong-type"

    def extreme_number(self, draw: st.DrawFn, manifest: Manifest) -> str:
        path = draw(st.sampled_from(self.numeric))
        node = self.nodes[path]
        edges: list[int | float] = list(EXTREME_NUMBERS)
        for bound in ("minimum", "maximum"):
            if bound in node:
                edges += [node[bound], node[bound] - 1, node[bound] + 1]
        self.place(draw, manifest, path, draw(st.sampled_from(edges)))
        return "extreme-number"

    def extreme_string(self, draw: st.DrawFn, manifest: Manifest) -> str:
        path = draw(st.sampled_from(self.strings))
        longest = int(self.nodes[path].get("maxLength", 256))
        length = draw(st.sampled_from(sorted({longest, longest + 1, HUGE_STRING})))
        letter = draw(st.sampled_from(["a", "/", "9", "\u00e9", "\U0001f680"]))
        self.place(draw, manifest, path, letter * length)
        return "extreme-size"

    def many_items(self, draw: st.DrawFn, manifest: Manifest) -> str:
        if draw(st.booleans()) or not self.maps:
            path = draw(st.sampled_from(self.arrays))
            node = self.nodes[path]
            count = draw(
                st.sampled_from(sorted({int(node.get("maxItems", 64)), int(node.get("maxItems", 64)) + 1}))
            )
            item = draw(self.strategies.for_node(node.get("items") or {}, depth=len(path)))
            self.place(draw, manifest, path, _distinct_items(node, item, count))
        else:
            path = draw(st.sampled_from(self.maps))
            node = self.nodes[path]
            count = int(node.get("maxProperties", 64)) + draw(st.sampled_from([0, 1]))
            value = draw(self.strategies.for_node(node["additionalProperties"], depth=len(path)))
            self.place(draw, manifest, path, {f"k{i}": copy.deepcopy(value) for i in range(count)})
        return "extreme-size"

    def hostile_unicode(self, draw: st.DrawFn, manifest: Manifest) -> str:
        path = draw(st.sampled_from(self.strings))
        text = draw(
            st.one_of(
                st.sampled_from(UNICODE_SAMPLES),
                st.text(st.characters(codec="utf-8"), min_size=1, max_size=16),
                st.lists(st.sampled_from(UNICODE_SAMPLES), min_size=2, max_size=4).map("".join),
            )
        )
        self.place(draw, manifest, path, text)
        return "unicode"

    def deep_nesting(self, draw: st.DrawFn, manifest: Manifest) -> str:
        path = draw(st.sampled_from(self.nesting_paths))
        levels = draw(st.sampled_from(DEEP_LEVELS))
        leaf: JsonValue = draw(st.sampled_from(["x", 1, None, {}, []]))
        for level in range(levels):
            leaf = {"k": leaf} if level % 2 == 0 else [leaf]
        value = leaf if isinstance(leaf, dict) else {"k": leaf}
        self.place(draw, manifest, path, value)
        return "deep-nesting"

    def known_keys_wrong_shape(self, draw: st.DrawFn, manifest: Manifest) -> str:
        """A free-form field holding keys the Pod API knows (the schema's own property names, object
        fields half the time) with values of any shape: the API server stores them, and whatever
        reads them later (the Pod API, the operator) must cope."""
        path = draw(st.sampled_from(self.nesting_paths))
        keys = st.one_of(st.sampled_from(self.object_names), st.sampled_from(self.vocabulary))
        value = draw(st.dictionaries(keys, json_values(), min_size=1, max_size=3))
        self.place(draw, manifest, path, value)
        return "pass-through"

    def huge_key(self, draw: st.DrawFn, manifest: Manifest) -> str:
        """An unknown key in a free-form field, long enough that an error quoting it is huge."""
        path = draw(st.sampled_from(self.nesting_paths))
        length = draw(st.sampled_from([64, 1024, HUGE_STRING]))
        self.place(draw, manifest, (*path, "k" * length), "v")
        return "huge-key"

    def hostile_name(self, draw: st.DrawFn, manifest: Manifest) -> str:
        manifest.setdefault("metadata", {})["name"] = draw(st.sampled_from(HOSTILE_NAMES))
        return "hostile-name"

    def unknown_field(self, draw: st.DrawFn, manifest: Manifest) -> str:
        path = draw(st.sampled_from(self.declared_objects))
        name = draw(st.sampled_from(["unknownField", "Model", "spec", "x" * 300]))
        self.place(draw, manifest, (*path, name), draw(st.sampled_from(["v", 1, {}])))
        return "unknown-field"

    def duplicate_key(self, draw: st.DrawFn, manifest: Manifest) -> str:
        """Two items of a set or map list with the same key."""
        path = draw(st.sampled_from(self.keyed))
        node = self.nodes[path]
        item = draw(self.strategies.for_node(node.get("items") or {}, depth=len(path)))
        self.place(draw, manifest, path, [item, copy.deepcopy(item)])
        return "duplicate-key"

    def conflict(self, draw: st.DrawFn, manifest: Manifest) -> str:
        """Fields that contradict each other (named in the schema's rules and in docs/api.md)."""
        spec = manifest.setdefault("spec", {})
        chosen = draw(st.sampled_from(CONFLICTS))
        chosen(draw, spec)
        return "conflict"

    def all(self) -> Sequence[Mutation]:
        mutations: list[Mutation] = [
            self.wrong_type,
            self.extreme_number,
            self.extreme_string,
            self.many_items,
            self.hostile_unicode,
            self.hostile_name,
            self.unknown_field,
            self.conflict,
            # Into free-form fields; without any (every field typed), where the schema declares an
            # object, and admission must refuse them.
            self.deep_nesting,
            self.known_keys_wrong_shape,
            self.huge_key,
        ]
        if self.keyed:
            mutations.append(self.duplicate_key)
        return mutations


def _distinct_items(node: Schema, item: JsonValue, count: int) -> list[JsonValue]:
    """`count` copies of `item`, made distinct where the list's keys allow (map keys that are strings,
    sets of integers); otherwise duplicates, which the API server refuses for set and map lists."""
    keys = node.get("x-kubernetes-list-map-keys") or ()
    items_node = node.get("items") or {}
    if isinstance(item, dict) and keys:
        properties = items_node.get("properties") or {}
        result = []
        for index in range(count):
            copied = copy.deepcopy(item)
            for key in keys:
                if (properties.get(key) or {}).get("type") == "string":
                    copied[key] = f"K{index}"
            result.append(copied)
        return result
    if node.get("x-kubernetes-list-type") == "set" and items_node.get("type") == "integer":
        low = int(items_node.get("minimum", 0))
        return list(range(low, low + count))
    return [copy.deepcopy(item) for _ in range(count)]


# ---------------------------------------------------------------------------------------- conflicts

Conflict = Callable[[st.DrawFn, dict[str, Any]], None]
STORAGE_TYPES = ("pvc", "s3", "gcs", "nfs")
STORAGE_SETTINGS: dict[str, dict[str, Any]] = {
    "pvc": {"pvcName": "claim"},
    "s3": {"s3": {"bucket": "b"}},
    "gcs": {"gcsBucket": "b"},
    "nfs": {"nfs": {"server": "nfs", "path": "/export"}},
}


def _value_and_value_from(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    entry = {"name": "BOTH", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    env = spec.get("env")
    spec["env"] = [*(env if isinstance(env, list) else []), entry]


def _reserved_env(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    names = [*contract.RESERVED_ENV_NAMES, *(p + "X" for p in contract.RESERVED_ENV_PREFIXES)]
    spec["env"] = [{"name": draw(st.sampled_from(names)), "value": "1"}]


def _storage_with_other_settings(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    kind = draw(st.sampled_from(STORAGE_TYPES))
    other = draw(st.sampled_from([t for t in STORAGE_TYPES if t != kind]))
    storage = {"type": kind, **STORAGE_SETTINGS[kind], **STORAGE_SETTINGS[other]}
    spec["checkpoint"] = {"enabled": True, "storage": storage}


def _gpu_mismatch(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    gpus = draw(st.integers(0, 3))
    spec["gpusPerWorker"] = gpus
    spec["resources"] = {"limits": {contract.GPU_RESOURCE: draw(st.sampled_from([gpus + 1, "1.5", "2Gi"]))}}


def _requests_above_limits(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    spec["resources"] = {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def _exit_codes(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    policy = draw(st.sampled_from(["Never", "OnFailure", "ExitCode"]))
    spec["failurePolicy"] = {"restartPolicy": policy, "retryableExitCodes": [1, 2], "permanentExitCodes": [2]}


def _ports(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    port = draw(st.sampled_from([8080, 29500, 1024, 65535]))
    spec["monitoring"] = {"enabled": True, "metricsPort": port}
    spec["networking"] = {"masterPort": port}


def _stall(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    spec["monitoring"] = {"restartOnStall": True}


def _mount_path(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    reserved = draw(st.sampled_from(contract.RESERVED_MOUNT_PATHS))
    path = draw(st.sampled_from([reserved, reserved + "/x", f"/checkpoints/..{reserved}", "/a/./b", "/"]))
    spec["checkpoint"] = {"enabled": True, "mountPath": path}


def _resume_elsewhere(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    resume = draw(
        st.sampled_from(["s3://b/k", "gs://b/k", "../../etc/passwd", "/etc/trainingjob/x", "s3://"])
    )
    kind = draw(st.sampled_from(STORAGE_TYPES))
    spec["checkpoint"] = {
        "enabled": True,
        "resumeFrom": resume,
        "storage": {"type": kind, **STORAGE_SETTINGS[kind]},
    }


def _backoff_order(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    spec["failurePolicy"] = {"restartBackoff": {"initialDelaySeconds": 100, "maxDelaySeconds": 10}}


def _nccl_without_gpus(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    spec["gpusPerWorker"] = 0
    spec["networking"] = {"backend": "nccl"}


def _upper_cased_params(draw: st.DrawFn, spec: dict[str, Any]) -> None:
    spec["hyperparameters"] = {"additionalParams": {"lr": "1", "LR": "2"}}


CONFLICTS: tuple[Conflict, ...] = (
    _value_and_value_from,
    _reserved_env,
    _storage_with_other_settings,
    _gpu_mismatch,
    _requests_above_limits,
    _exit_codes,
    _ports,
    _stall,
    _mount_path,
    _resume_elsewhere,
    _backoff_order,
    _nccl_without_gpus,
    _upper_cased_params,
)
