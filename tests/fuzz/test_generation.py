"""The fuzzer's own parts, without a cluster: generation from the schema, mutations, judging, shrinking.

The fuzz property is only as good as these: a generator that never produces a valid manifest, a
mutation that never fires, or a judge that passes a job without a state would make the cluster run
pass without testing anything.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from crd.openapi import array, integer, obj, quantity, string
from tests.fuzz.harness import unique_names
from tests.fuzz.judge import judge_job, log_problems, refusal_layer, write_budget
from tests.fuzz.manifests import Generated, generate, manifests, root_schema, well_formed
from tests.fuzz.mutations import Mutator
from tests.fuzz.schema_strategies import SchemaStrategies, cel_string_bounds, schema_paths
from tests.fuzz.shrink import reductions, shrink

SAMPLE = generate(200, 15)


def _schema_errors(manifest: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(root_schema())
    return [error.message for error in validator.iter_errors(manifest)]


def test_generation_is_repeatable() -> None:
    assert generate(30, 4) == generate(30, 4)
    assert generate(30, 4) != generate(30, 5)


def test_most_unmutated_manifests_follow_the_schema() -> None:
    valid = [item.manifest for item in SAMPLE if not item.mutations]
    following = [manifest for manifest in valid if not _schema_errors(manifest)]
    assert len(valid) >= 50
    assert len(following) >= 0.8 * len(valid), [_schema_errors(m)[:2] for m in valid if _schema_errors(m)][:5]


MUTATION_KINDS = (
    "wrong-type",
    "extreme-number",
    "extreme-size",
    "unicode",
    "deep-nesting",
    "huge-key",
    "pass-through",
    "hostile-name",
    "unknown-field",
    "duplicate-key",
    "conflict",
)


# find() writes each candidate's repr for its report; a hostile manifest's is large, which it warns of.
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
@pytest.mark.parametrize("kind", MUTATION_KINDS)
def test_every_mutation_kind_is_drawn(kind: str) -> None:
    """Searched for, not counted in a fixed sample: which 200 manifests a seed draws differs with what
    else the test process collected, and a kind drawn 4 times in one sample was missing in another."""
    found = find(
        manifests(),
        lambda generated: kind in generated.mutations,
        settings=settings(
            max_examples=2000,
            phases=[Phase.generate],
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert kind in found.mutations


def test_every_spec_field_is_generated_somewhere() -> None:
    """Coverage comes from the schema: each top-level spec field appears in some generated manifest."""
    fields = set(root_schema()["properties"]["spec"]["properties"])
    seen = {name for item in [*SAMPLE, *generate(150, 3)] for name in (item.manifest.get("spec") or {})}
    assert fields <= seen, sorted(fields - seen)


def test_names_follow_the_cel_rules_the_generator_can_read() -> None:
    name_node = root_schema()["properties"]["metadata"]["properties"]["name"]
    pattern, longest = cel_string_bounds(name_node)
    assert pattern == "^[a-z]([-a-z0-9]*[a-z0-9])?$"
    assert longest == 53
    names = [item.manifest["metadata"]["name"] for item in SAMPLE if not item.mutations]
    assert all(name and name[0].isalpha() and name.islower() for name in names if name.isascii())


@pytest.mark.filterwarnings("ignore:Generating overly large repr")
def test_deep_nesting_goes_past_the_operators_depth_limit() -> None:
    def depth(value: Any) -> int:
        deepest, stack = 0, [(value, 0)]
        while stack:
            node, level = stack.pop()
            deepest = max(deepest, level)
            children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
            stack += [(child, level + 1) for child in children]
        return deepest

    # Searched for, as the kinds are above: a fixed seed's sample depends on what else the process loaded.
    found = find(
        manifests(),
        lambda generated: "deep-nesting" in generated.mutations and depth(generated.manifest) > 100,
        settings=settings(
            max_examples=2000,
            phases=[Phase.generate],
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert depth(found.manifest) > 100


def large_schema(levels: int) -> dict[str, Any]:
    """A schema shaped like a generated pod template: deep objects, list-maps keyed by two fields,
    int-or-string, sets, maps and free-form leaves (a tree: every node built afresh)."""

    def level(remaining: int) -> dict[str, Any]:
        leaf = {
            "port": quantity("a port"),
            "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        }
        if remaining == 0:
            return obj("leaf", leaf)
        item = obj(
            "item",
            {
                "name": string("n", max_length=63),
                "protocol": string("p", max_length=8, enum=["TCP", "UDP"]),
                **leaf,
            },
            required=["name"],
        )
        return obj(
            f"level {remaining}",
            {
                "items": array("keyed", item, max_items=16, list_type="map", map_keys=["name", "protocol"]),
                "codes": array(
                    "set", {"type": "integer", "minimum": 0, "maximum": 9}, max_items=10, list_type="set"
                ),
                "child": level(remaining - 1),
                "count": integer("c", minimum=0),
            },
            required=["child"],
        )

    return obj("root", {"spec": level(levels), "metadata": obj("m", {"name": string("n", max_length=53)})})


def test_a_large_deep_schema_generates_quickly_and_validly() -> None:
    root = large_schema(40)
    strategy = well_formed(root)
    validator = jsonschema.Draft4Validator(root)
    seen: list[dict[str, Any]] = []

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(strategy)
    def check(manifest: dict[str, Any]) -> None:
        seen.append(manifest)
        assert not [error.message for error in validator.iter_errors(manifest)]

    check()
    assert seen
    assert sum(1 for _ in schema_paths(root)) > 200
    mutator = Mutator(root, SchemaStrategies())
    assert mutator.keyed
    assert mutator.free_form
    assert mutator.numeric


def test_free_form_fields_get_nesting_and_keys_else_declared_objects_do() -> None:
    """Deep nesting, huge keys and pass-through shapes go into free-form fields where the schema has
    any; a fully typed schema gets them where it declares objects (and admission must refuse them)."""
    root = large_schema(2)
    with_free_form = Mutator(root, SchemaStrategies())
    assert with_free_form.nesting_paths == with_free_form.free_form
    assert ("spec", "child", "child", "raw") in with_free_form.free_form
    typed = Mutator(root_schema(), SchemaStrategies())
    assert typed.nesting_paths == (typed.free_form or typed.declared_objects)


# -------------------------------------------------------------------------------------- the judge

ROOT = root_schema()


@pytest.mark.parametrize(
    ("status", "body", "layer"),
    [
        (400, {"message": 'strict decoding error: unknown field "spec.foo"'}, "unknown-field"),
        (400, {"message": "cannot be handled as a TrainingJob: json: cannot unmarshal"}, "decode"),
        (
            422,
            {
                "details": {
                    "causes": [
                        {
                            "reason": "FieldValueTypeInvalid",
                            "message": 'Invalid value: "string": spec.numWorkers in body must be of type '
                            'integer: "string"',
                            "field": "spec.numWorkers",
                        },
                        {
                            "reason": "FieldValueInvalid",
                            "message": "Invalid value: null: some validation rules were not checked because",
                            "field": "<nil>",
                        },
                    ]
                }
            },
            "schema",
        ),
        (
            422,
            {
                "details": {
                    "causes": [
                        {
                            "reason": "FieldValueInvalid",
                            "message": 'Invalid value: "object": monitoring.restartOnStall needs '
                            "monitoring.progressDeadlineSeconds",
                            "field": "spec.monitoring.restartOnStall",
                        }
                    ]
                }
            },
            "cel",
        ),
        (
            422,
            {
                "details": {
                    "causes": [
                        {
                            "reason": "FieldValueInvalid",
                            "message": 'Invalid value: "string": metadata.name must be at most 53 characters',
                            "field": "metadata.name",
                        }
                    ]
                }
            },
            "cel",
        ),
        (
            422,
            {
                "details": {
                    "causes": [
                        {
                            "reason": "FieldValueInvalid",
                            "message": 'Invalid value: "Upper": a lowercase RFC 1123 subdomain must consist',
                            "field": "metadata.name",
                        }
                    ]
                }
            },
            "metadata",
        ),
        (
            422,
            {"details": {"causes": [{"reason": "FieldValueDuplicate", "message": "Duplicate value"}]}},
            "list",
        ),
        (413, {}, "too-large"),
        (500, {}, "server-error"),
    ],
)
def test_refusals_are_put_down_to_their_layer(status: int, body: dict[str, Any], layer: str) -> None:
    assert refusal_layer(status, body, ROOT) == layer


EVENT = [{"reason": "Pending", "involvedObject": {"uid": "u"}}]


def _job(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"uid": "u"}, "status": status}


def test_a_job_with_a_state_and_an_event_has_an_outcome() -> None:
    assert judge_job(_job({"state": "Pending"}), EVENT).problem is None
    assert judge_job(_job({"state": "Pending"}), []).problem == "no Event"
    assert judge_job(_job({}), EVENT).problem == "no state and no blocked condition"
    assert judge_job({"metadata": {}}, EVENT).label == "no-state"


def test_a_failed_job_needs_a_reason_and_a_message() -> None:
    failed = {"state": "Failed", "failureReason": "InvalidSpec", "message": "invalid spec: x"}
    assert judge_job(_job(failed), EVENT).label == "Failed/InvalidSpec"
    assert judge_job(_job(failed), EVENT).problem is None
    assert judge_job(_job({"state": "Failed"}), EVENT).problem is not None


def test_a_blocked_job_needs_a_message() -> None:
    created = {"type": "Created", "status": "False", "reason": "FailedCreate"}
    assert judge_job(_job({"conditions": [{**created, "message": "quota"}]}), EVENT).label == "blocked"
    assert judge_job(_job({"conditions": [created]}), EVENT).problem is not None


def test_a_job_deleted_by_its_ttl_keeps_its_events() -> None:
    assert judge_job(None, EVENT).label == "deleted"
    assert judge_job(None, []).problem is not None


def test_errors_and_tracebacks_in_the_log_are_problems() -> None:
    entries = [
        {"level": "INFO", "message": "created Pod x"},
        {"level": "WARNING", "message": "failed to create Pod x", "namespace": "n", "name": "j"},
        {"level": "ERROR", "message": "reconcile failed", "namespace": "n", "name": "j"},
        {
            "level": "WARNING",
            "message": "retrying",
            "exc_info": "Traceback (most recent call last):\nValueError: x",
        },
        {"level": "ERROR", "message": "expected trouble"},
    ]
    problems = log_problems(entries, justified=["expected"])
    assert [(p.namespace, p.name) for p in problems] == [("n", "j"), ("", "")]
    assert problems[1].message == "retrying | ValueError: x"


def test_the_write_budget_grows_with_the_pods() -> None:
    assert write_budget([{"spec": {"numWorkers": 2}}]) < write_budget([{"spec": {"numWorkers": 20}}])
    assert write_budget([{"spec": {"numWorkers": "x"}}]) == write_budget([{"spec": {"numWorkers": 1}}])


def test_names_clashing_within_a_batch_get_a_suffix() -> None:
    items = [Generated({"metadata": {"name": name}}, ()) for name in ("a", "b", "a", "")]
    assert unique_names(items) == ["a", "b", "a-2", ""]


# ------------------------------------------------------------------------------------- shrinking


def test_shrinking_keeps_only_what_the_failure_needs() -> None:
    manifest = {
        "apiVersion": "ml.example.com/v1",
        "metadata": {"name": "x", "labels": {"a": "b"}},
        "spec": {
            "model": "m" * 50,
            "env": [{"name": "A"}, {"name": "B", "valueFrom": {"k": "v"}}],
            "suspend": True,
        },
    }

    def fails(candidate: dict[str, Any]) -> bool:
        env = (candidate.get("spec") or {}).get("env") or []
        return any(isinstance(e, dict) and "valueFrom" in e for e in env)

    minimal = shrink(manifest, fails, seconds=60)
    assert minimal == {"spec": {"env": [{"valueFrom": {}}]}}


@given(st.data())
@settings(max_examples=20, deadline=None, database=None)
def test_reductions_only_leave_things_out(data: st.DataObject) -> None:
    original = copy.deepcopy(SAMPLE[data.draw(st.integers(0, len(SAMPLE) - 1))].manifest)
    reduced = data.draw(reductions(original))
    assert len(json.dumps(reduced)) <= len(json.dumps(original))
