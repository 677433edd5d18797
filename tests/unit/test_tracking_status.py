"""The job's experiment-tracking run in status: from rank 0's report (controller.planner.progress) to
status.tracking, the Events its changes make, the trainer's UID for the run's tag, and what the client
shows of it (docs/progress.md, "Experiment tracking")."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from builders.env import distributed_env
from controller.planner.progress import apply_report, parse_report, run_url, tracking_events
from crd.spec import parse
from tests.unit.crd_cases import job
from tests.unit.lifecycle_world import T0
from trainingjob_client.describe import describe
from trainingjob_client.views import JobStatus, TrainingJob

URI = "http://mlflow.ml-infra.svc.cluster.local:5000"
SPEC = parse(job({"spec.monitoring.mlflowTrackingUri": URI})).spec
RUN = "0123456789abcdef0123456789abcdef"


def report(**fields: Any) -> Any:
    parsed, error = parse_report(json.dumps({"epoch": 1, "step": 10, **fields}))
    assert error is None
    assert parsed is not None
    return parsed


def test_the_reported_run_reaches_status_with_its_url() -> None:
    update = apply_report({}, report(mlflow={"runId": RUN, "experimentId": "3"}), SPEC, T0, 0)
    assert update.changed
    assert update.status["tracking"] == {
        "mlflowRunId": RUN,
        "mlflowExperimentId": "3",
        "mlflowRunUrl": f"{URI}/#/experiments/3/runs/{RUN}",
    }


def test_a_report_without_tracking_keeps_the_run_and_an_error_is_shown_until_a_call_succeeds() -> None:
    status = apply_report({}, report(mlflow={"runId": RUN, "experimentId": "3"}), SPEC, T0, 0).status
    later = T0 + timedelta(seconds=10)
    kept = apply_report(status, report(epoch=2, step=20), SPEC, later, 0).status
    assert kept["tracking"]["mlflowRunId"] == RUN
    failing = report(epoch=3, step=30, mlflow={"runId": RUN, "experimentId": "3"}, trackingError="refused")
    down = apply_report(kept, failing, SPEC, later + timedelta(seconds=10), 0).status
    assert down["tracking"]["unavailable"] == "refused"
    back = apply_report(down, report(epoch=4, step=40, mlflow={"runId": RUN}), SPEC, later + timedelta(20), 0)
    assert "unavailable" not in back.status["tracking"]
    assert back.status["tracking"]["mlflowExperimentId"] == "3"


def test_ids_that_are_not_mlflow_ids_are_ignored() -> None:
    for bad in ("", "a b", "x" * 65, 7, None, "../runs"):
        parsed = report(mlflow={"runId": bad})
        assert parsed.mlflow_run_id is None
    assert "tracking" not in apply_report({}, report(mlflow="nope"), SPEC, T0, 0).status


def test_run_url_without_an_experiment_and_with_a_trailing_slash() -> None:
    assert run_url(URI + "/", None, RUN) == f"{URI}/#/runs/{RUN}"


def test_events_say_when_the_run_is_created_replaced_and_tracking_comes_and_goes() -> None:
    created = tracking_events(None, {"mlflowRunId": RUN, "mlflowRunUrl": "u"})
    assert [(kind, reason) for kind, reason, _ in created] == [("Normal", "MLflowRunCreated")]
    replaced = tracking_events({"mlflowRunId": RUN}, {"mlflowRunId": "f" * 32, "mlflowRunUrl": "u"})
    assert [(kind, reason) for kind, reason, _ in replaced] == [("Warning", "MLflowRunReplaced")]
    assert RUN in replaced[0][2]
    assert "f" * 32 in replaced[0][2]
    down = tracking_events({"mlflowRunId": RUN}, {"mlflowRunId": RUN, "unavailable": "refused"})
    assert [(reason, "refused" in message) for _, reason, message in down] == [("TrackingUnavailable", True)]
    up = tracking_events({"mlflowRunId": RUN, "unavailable": "refused"}, {"mlflowRunId": RUN})
    assert [reason for _, reason, _ in up] == ["TrackingAvailable"]
    assert tracking_events({"mlflowRunId": RUN}, {"mlflowRunId": RUN}) == []


def test_the_trainer_gets_the_job_uid_only_with_a_tracker() -> None:
    tracked = job({"spec.monitoring.mlflowTrackingUri": URI, "metadata.uid": "uid-1"})
    env = {entry["name"]: entry.get("value") for entry in distributed_env(parse(tracked), 0)}
    assert env["TRAININGJOB_UID"] == "uid-1"
    assert env["MLFLOW_TRACKING_URI"] == URI
    plain = {entry["name"] for entry in distributed_env(parse(job({"metadata.uid": "uid-1"})), 0)}
    assert "TRAININGJOB_UID" not in plain


def test_the_client_and_describe_show_the_run() -> None:
    raw = {
        "state": "Running",
        "tracking": {"mlflowRunId": RUN, "mlflowRunUrl": "http://x/#/runs/r", "unavailable": "refused"},
    }
    status = JobStatus.from_dict(raw)
    assert (status.mlflow_run_id, status.mlflow_run_url) == (RUN, "http://x/#/runs/r")
    manifest = {"metadata": {"name": "j", "namespace": "n"}, "spec": {}, "status": raw}
    text = describe(TrainingJob.from_dict(manifest), [], [])
    assert f"MLflow run:  {RUN}  http://x/#/runs/r" in text
    assert "Tracking:    unavailable (refused)" in text
