"""Shrinking a manifest that breaks the fuzz property down to a minimal one, with hypothesis.

Why: a generated manifest that breaks a property usually carries dozens of fields that have nothing to
do with it; a regression test needs the few that matter. `reductions(manifest)` is a strategy whose
values are the manifest with keys and list items left out and strings cut short; hypothesis's `find`
looks for one that still causes the same kind of violation on the real cluster and shrinks it (leaving
out is the simpler choice, so shrinking leaves out all it can). Each try costs a create and a wait on
the cluster, so shrinking stops after a time budget and keeps the smallest manifest seen so far.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis import strategies as st
from hypothesis.errors import FlakyFailure, NoSuchExample

from tests.fuzz.harness import FuzzRun, Violation
from tests.fuzz.mutations import Manifest

# Below this depth a value is kept or left out whole (a deeply nested value would exhaust the
# strategy's own recursion).
ATOMIC_BELOW = 24
# A generated reduction keeps each key or item with this chance in 8.
KEEP_IN_EIGHT = 7
SHRINK_DEADLINE = 20.0
PER_VIOLATION_TRIES = 60


def _keep() -> st.SearchStrategy[bool]:
    return st.sampled_from([False] + [True] * KEEP_IN_EIGHT)


def reductions(value: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """`value` with parts left out; a required part may be left out too (the API server then refuses
    the manifest, which is no violation, so the shrinker keeps it)."""
    if depth >= ATOMIC_BELOW:
        return st.just(value)
    if isinstance(value, dict):
        children = {key: reductions(item, depth + 1) for key, item in value.items()}

        @st.composite
        def reduced_object(draw: st.DrawFn) -> dict[str, Any]:
            return {key: draw(child) for key, child in children.items() if draw(_keep())}

        return reduced_object()
    if isinstance(value, list):
        elements = [reductions(item, depth + 1) for item in value]

        @st.composite
        def reduced_list(draw: st.DrawFn) -> list[Any]:
            return [draw(element) for element in elements if draw(_keep())]

        return reduced_list()
    if isinstance(value, str) and len(value) > 8:
        shorter = [value[:size] for size in (0, 1, 8, 64, 1024) if size < len(value)]
        return st.sampled_from(shorter + [value] * (KEEP_IN_EIGHT * len(shorter)))
    return st.just(value)


def size_of(manifest: Manifest) -> int:
    return len(json.dumps(manifest))


def shrink(manifest: Manifest, still_fails: Callable[[Manifest], bool], seconds: float) -> Manifest:
    """The smallest reduction of `manifest` found for which `still_fails` holds, within `seconds`
    (the manifest itself when none is found)."""
    best = [manifest]
    deadline = time.monotonic() + seconds
    # Each answer is kept: hypothesis asks again about the example it found, and an answer that
    # changed (the budget ran out meanwhile) would be reported as a flaky test.
    answers: dict[str, bool] = {}

    def condition(candidate: Manifest) -> bool:
        key = json.dumps(candidate, sort_keys=True)
        if key not in answers:
            answers[key] = time.monotonic() < deadline and still_fails(candidate)
        if answers[key] and size_of(candidate) < size_of(best[0]):
            best[0] = candidate
        return answers[key]

    with contextlib.suppress(NoSuchExample, FlakyFailure):
        find(
            reductions(manifest),
            condition,
            settings=settings(
                max_examples=PER_VIOLATION_TRIES,
                database=None,
                deadline=None,
                phases=[Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            ),
        )
    return best[0]


def shrink_violations(fuzz: FuzzRun, violations: Sequence[Violation], seconds: float) -> list[Violation]:
    """One minimal manifest per kind of violation and mutation labels, within `seconds` overall.
    Violations without a manifest of their own (operator-wide ones) are returned unchanged."""
    deadline = time.monotonic() + seconds
    chosen: dict[tuple[str, tuple[str, ...]], Violation] = {}
    for violation in violations:
        if violation.manifest is not None:
            chosen.setdefault((violation.kind, violation.mutations), violation)
    results = [violation for violation in violations if violation.manifest is None]
    for position, ((kind, _), violation) in enumerate(chosen.items()):
        assert violation.manifest is not None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            results.append(violation)
            continue

        def still_fails(candidate: Manifest, kind: str = kind) -> bool:
            return kind in fuzz.violations_of(candidate, SHRINK_DEADLINE, kind)

        minimal = shrink(violation.manifest, still_fails, remaining / (len(chosen) - position))
        fuzz.progress(f"fuzz: shrank {kind} from {size_of(violation.manifest)} to {size_of(minimal)} bytes")
        results.append(
            Violation(
                violation.kind,
                violation.namespace,
                violation.name,
                violation.detail,
                minimal,
                violation.mutations,
            )
        )
    return results


def save_findings(violations: Sequence[Violation], directory: Path) -> list[Path]:
    """Writes each violation that has a manifest as <kind>-<hash>.json, in the shape of
    tests/fuzz/regressions/."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for violation in violations:
        if violation.manifest is None:
            continue
        text = json.dumps(violation.manifest, sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        path = directory / f"{violation.kind}-{digest}.json"
        record = {
            "violation": violation.kind,
            "detail": violation.detail[:2000],
            "mutations": list(violation.mutations),
            "manifest": violation.manifest,
        }
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return written
