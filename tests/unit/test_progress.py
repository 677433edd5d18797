"""controller.planner.progress: rank 0's report into status, only on change and rate-limited, and the success
policy it drives."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from controller.planner.progress import Report, apply_report, parse_report, percent, success_reached
from controller.runtime.clock import rfc3339
from crd.spec import Spec, SuccessPolicy, parse
from tests.unit.crd_cases import job
from tests.unit.lifecycle_world import T0


def spec_of(changes: dict[str, Any]) -> Spec:
    """The typed spec of a TrainingJob with these dotted-path `changes`."""
    return parse(job(changes)).spec


SPEC = spec_of({"spec.hyperparameters": {"epochs": 10}, "spec.successPolicy": {"metric": "accuracy"}})


def parsed(raw: Any) -> Report:
    report, error = parse_report(json.dumps(raw))
    assert error is None
    assert report is not None
    return report


# ------------------------------------------------------------------------------------- parsing


def test_a_full_report() -> None:
    report = parsed(
        {
            "epoch": 3,
            "totalEpochs": 10,
            "step": 1200,
            "totalSteps": 4000,
            "metrics": {"loss": 0.41, "accuracy": 0.87},
            "checkpoint": "/checkpoints/epoch-3",
            "checkpointTime": "2026-03-01T11:59:00Z",
        }
    )
    assert report == Report(
        3, 10, 1200, 4000, {"loss": 0.41, "accuracy": 0.87}, "/checkpoints/epoch-3", "2026-03-01T11:59:00Z"
    )


def test_the_checkpoint_may_be_an_object() -> None:
    report = parsed({"checkpoint": {"path": "s3://b/ck-3", "time": "2026-03-01T11:59:00Z"}})
    assert (report.checkpoint, report.checkpoint_time) == ("s3://b/ck-3", "2026-03-01T11:59:00Z")


@pytest.mark.parametrize("text", [None, ""])
def test_no_annotation_is_no_report(text: str | None) -> None:
    assert parse_report(text) == (None, None)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '"epoch 3"', "3"])
def test_an_unusable_annotation_is_an_error(text: str) -> None:
    report, error = parse_report(text)
    assert report is None
    assert error


def test_bad_fields_are_dropped_one_by_one() -> None:
    report = parsed(
        {
            "epoch": "3",
            "totalEpochs": -1,
            "step": True,
            "metrics": {"loss": "low", "accuracy": 0.5, "flag": False, "n": 2},
            "checkpoint": 7,
        }
    )
    assert report == Report(metrics={"accuracy": 0.5, "n": 2.0})
    non_finite, error = parse_report('{"epoch": NaN, "metrics": {"loss": Infinity}}')
    assert error is None
    assert non_finite == Report()


def test_a_float_epoch_is_truncated() -> None:
    assert parsed({"epoch": 3.0}).epoch == 3


def test_reports_are_bounded() -> None:
    report = parsed({"metrics": {f"m{i}": i for i in range(100)}, "checkpoint": "x" * 5000})
    assert len(report.metrics) == 64
    assert report.checkpoint is not None
    assert len(report.checkpoint) == 1024


@pytest.mark.parametrize(
    ("report", "planned", "expected"),
    [
        (Report(epoch=3, total_epochs=10), None, "30%"),
        (Report(epoch=3), 12, "25%"),
        (Report(epoch=3, total_epochs=10, step=100, total_steps=400), None, "25%"),
        (Report(epoch=12, total_epochs=10), None, "100%"),
        (Report(epoch=3), None, None),
        (Report(step=5), None, None),
    ],
)
def test_percent(report: Report, planned: int | None, expected: str | None) -> None:
    assert percent(report, planned) == expected


# ------------------------------------------------------------------------------------ applying


def test_a_report_is_copied_into_status() -> None:
    report = parsed({"epoch": 4, "step": 120, "metrics": {"accuracy": 0.8}, "checkpoint": "/c/4"})
    update = apply_report({"state": "Running"}, report, SPEC, T0, 5.0)
    assert update.changed
    assert update.retry_in is None
    assert update.status == {
        "state": "Running",
        "currentEpoch": 4,
        "totalEpochs": 10,
        "step": 120,
        "metrics": {"accuracy": 0.8},
        "progress": "40%",
        "lastProgressTime": rfc3339(T0),
        "checkpoint": {"latest": "/c/4", "count": 1, "time": rfc3339(T0)},
        "bestMetric": {"value": 0.8, "epoch": 4},
    }


def test_the_same_report_again_changes_nothing_even_much_later() -> None:
    report = parsed({"epoch": 4, "metrics": {"accuracy": 0.8}, "checkpoint": "/c/4"})
    first = apply_report({}, report, SPEC, T0, 5.0)
    again = apply_report(first.status, report, SPEC, T0 + timedelta(hours=1), 5.0)
    assert not again.changed
    assert again.retry_in is None
    assert again.status == first.status


def test_a_change_within_the_interval_is_deferred() -> None:
    first = apply_report({}, parsed({"epoch": 1}), SPEC, T0, 5.0)
    second = apply_report(first.status, parsed({"epoch": 2}), SPEC, T0 + timedelta(seconds=2), 5.0)
    assert not second.changed
    assert second.retry_in == pytest.approx(3.0)
    assert second.status == first.status
    third = apply_report(first.status, parsed({"epoch": 2}), SPEC, T0 + timedelta(seconds=5), 5.0)
    assert third.changed
    assert third.status["currentEpoch"] == 2


def test_no_rate_limit_with_a_zero_interval() -> None:
    first = apply_report({}, parsed({"epoch": 1}), SPEC, T0, 0)
    assert apply_report(first.status, parsed({"epoch": 2}), SPEC, T0, 0).changed


def test_checkpoints_count_and_keep_the_reported_time() -> None:
    status: dict[str, Any] = {}
    status = apply_report(
        status, parsed({"checkpoint": {"path": "/c/1", "time": "2026-03-01T11:00:00+01:00"}}), SPEC, T0, 0
    ).status
    assert status["checkpoint"] == {"latest": "/c/1", "count": 1, "time": "2026-03-01T10:00:00Z"}
    status = apply_report(
        status, parsed({"checkpoint": "/c/2", "checkpointTime": "garbage"}), SPEC, T0, 0
    ).status
    assert status["checkpoint"] == {"latest": "/c/2", "count": 2, "time": rfc3339(T0)}


def test_the_best_metric_tracks_improvements_beyond_min_delta() -> None:
    spec = spec_of({"spec.successPolicy": {"metric": "accuracy", "minDelta": 0.05}})
    status: dict[str, Any] = {}
    for epoch, value in [(1, 0.5), (2, 0.54), (3, 0.56), (4, 0.4)]:
        status = apply_report(
            status, parsed({"epoch": epoch, "metrics": {"accuracy": value}}), spec, T0, 0
        ).status
    assert status["bestMetric"] == {"value": 0.56, "epoch": 3}


def test_the_best_metric_of_a_minimised_metric() -> None:
    spec = spec_of({"spec.successPolicy": {"metric": "loss", "metricMode": "min"}})
    status: dict[str, Any] = {}
    for epoch, value in [(1, 1.0), (2, 0.7), (3, 0.9)]:
        status = apply_report(
            status, parsed({"epoch": epoch, "metrics": {"loss": value}}), spec, T0, 0
        ).status
    assert status["bestMetric"] == {"value": 0.7, "epoch": 2}


def test_the_input_status_is_not_modified() -> None:
    status = {"checkpoint": {"latest": "/c/1", "count": 1, "time": rfc3339(T0)}, "currentEpoch": 1}
    apply_report(status, parsed({"epoch": 2, "checkpoint": "/c/2"}), SPEC, T0, 0)
    assert status == {"checkpoint": {"latest": "/c/1", "count": 1, "time": rfc3339(T0)}, "currentEpoch": 1}


# ------------------------------------------------------------------------------ success policy


@pytest.mark.parametrize(
    ("policy", "metrics", "expected"),
    [
        ({"targetAccuracy": 0.9}, {"accuracy": 0.9}, "TargetReached"),
        ({"targetAccuracy": 0.9}, {"accuracy": 0.89}, None),
        ({"targetAccuracy": 0.9}, {"loss": 0.95}, None),
        ({"targetAccuracy": 0.1, "metric": "loss", "metricMode": "min"}, {"loss": 0.1}, "TargetReached"),
        ({"targetAccuracy": 0.1, "metric": "loss", "metricMode": "min"}, {"loss": 0.2}, None),
        ({}, {"accuracy": 1.0}, None),
    ],
)
def test_target_accuracy(policy: dict[str, Any], metrics: dict[str, float], expected: str | None) -> None:
    reached = success_reached({"metrics": metrics}, SuccessPolicy.from_json(policy))
    assert (reached[0] if reached else None) == expected


def test_target_reached_names_the_metric_and_target() -> None:
    reached = success_reached(
        {"metrics": {"accuracy": 0.93}}, SuccessPolicy.from_json({"targetAccuracy": 0.9})
    )
    assert reached == ("TargetReached", "accuracy 0.93 reached the target 0.9")


@pytest.mark.parametrize(("epoch", "stops"), [(4, False), (5, True), (9, True)])
def test_early_stopping_after_the_patience(epoch: int, stops: bool) -> None:
    status = {"currentEpoch": epoch, "bestMetric": {"value": 0.8, "epoch": 2}, "metrics": {"accuracy": 0.7}}
    reached = success_reached(status, SuccessPolicy.from_json({"earlyStoppingPatience": 3}))
    if stops:
        assert reached is not None
        assert reached[0] == "EarlyStopped"
        assert "patience 3" in reached[1]
    else:
        assert reached is None


def test_no_early_stopping_without_a_best_metric() -> None:
    assert (
        success_reached({"currentEpoch": 50}, SuccessPolicy.from_json({"earlyStoppingPatience": 1})) is None
    )
