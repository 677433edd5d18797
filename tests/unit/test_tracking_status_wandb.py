"""The job's W&B run in status: from rank 0's report (controller.planner.progress) to status.tracking
beside an MLflow run, the Event it makes, W&B's directory on the checkpoint claim, and what the client
and `kubectl trainingjob describe` show (docs/progress.md, "Weights & Biases")."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from builders.env import distributed_env
from controller.planner.progress import apply_report, parse_report, tracking_events
from crd.spec import parse
from tests.unit.crd_cases import job
from tests.unit.lifecycle_world import T0
from trainingjob_client.describe import describe
from trainingjob_client.views import JobStatus, TrainingJob

URI = "http://mlflow.ml-infra.svc.cluster.local:5000"
SPEC = parse(job({"spec.monitoring.wandbProject": "mnist", "spec.monitoring.mlflowTrackingUri": URI})).spec
RUN = "0b6a0c6e-2f0e-4a57-9a53-6f1f2b7c1d10"
PAGE = "https://wandb.ai/team/mnist/runs/" + RUN


def report(**fields: Any) -> Any:
    parsed, error = parse_report(json.dumps({"epoch": 1, "step": 10, **fields}))
    assert error is None
    assert parsed is not None
    return parsed


def test_an_offline_run_reaches_status_with_its_mode_and_no_page() -> None:
    update = apply_report({}, report(wandb={"runId": RUN, "mode": "offline"}), SPEC, T0, 0)
    assert update.changed
    assert update.status["tracking"] == {"wandbRunId": RUN, "wandbMode": "offline"}


def test_an_online_run_and_an_mlflow_run_side_by_side() -> None:
    both = report(mlflow={"runId": "f" * 32}, wandb={"runId": RUN, "url": PAGE, "mode": "online"})
    tracking = apply_report({}, both, SPEC, T0, 0).status["tracking"]
    assert (tracking["wandbRunId"], tracking["wandbRunUrl"], tracking["wandbMode"]) == (RUN, PAGE, "online")
    assert tracking["mlflowRunId"] == "f" * 32
    # A later attempt that fell back to offline: its page is gone from status, the error says why.
    later = report(wandb={"runId": RUN, "mode": "offline"}, trackingError="W&B: cannot start the online run")
    after = apply_report({"tracking": tracking}, later, SPEC, T0 + timedelta(seconds=5), 0).status["tracking"]
    assert "wandbRunUrl" not in after
    assert (after["wandbMode"], after["unavailable"]) == ("offline", "W&B: cannot start the online run")
    assert after["mlflowRunId"] == "f" * 32


def test_a_run_without_wandb_project_and_bad_values_are_ignored() -> None:
    untracked = parse(job({"spec.monitoring.mlflowTrackingUri": URI})).spec
    assert "tracking" not in apply_report({}, report(wandb={"runId": RUN}), untracked, T0, 0).status
    for bad in ("", "a/b", "x" * 65, 7, None):
        assert report(wandb={"runId": bad}).wandb_run_id is None
    odd = report(wandb={"runId": RUN, "url": "javascript:alert(1)", "mode": "a mode that is not one"})
    assert (odd.wandb_run_url, odd.wandb_mode) == (None, None)
    assert "tracking" not in apply_report({}, report(wandb="nope"), SPEC, T0, 0).status


def test_an_event_says_when_the_run_starts() -> None:
    started = tracking_events(None, {"wandbRunId": RUN, "wandbMode": "offline"})
    assert [(kind, reason) for kind, reason, _ in started] == [("Normal", "WandbRunStarted")]
    assert RUN in started[0][2]
    assert "offline" in started[0][2]
    online = tracking_events({}, {"wandbRunId": RUN, "wandbRunUrl": PAGE})
    assert PAGE in online[0][2]
    assert tracking_events({"wandbRunId": RUN}, {"wandbRunId": RUN, "wandbMode": "online"}) == []


def test_wandb_files_go_to_the_claim_and_the_key_comes_from_a_secret() -> None:
    tracked = job(
        {
            "metadata.uid": "uid-1",
            "spec.monitoring.wandbProject": "mnist",
            "spec.checkpoint.enabled": True,
            "spec.env": [
                {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}
            ],
        }
    )
    entries = {entry["name"]: entry for entry in distributed_env(parse(tracked), 0)}
    assert entries["WANDB_DIR"]["value"] == "/checkpoints"
    assert entries["TRAININGJOB_UID"]["value"] == "uid-1"
    assert entries["WANDB_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "wandb", "key": "api-key"}}


def test_the_client_and_describe_show_the_run() -> None:
    raw = {"state": "Running", "tracking": {"wandbRunId": RUN, "wandbMode": "offline"}}
    status = JobStatus.from_dict(raw)
    assert (status.wandb_run_id, status.wandb_run_url, status.wandb_mode) == (RUN, None, "offline")
    manifest = {"metadata": {"name": "j", "namespace": "n"}, "spec": {}, "status": raw}
    assert f"W&B run:     {RUN}  (offline)" in describe(TrainingJob.from_dict(manifest), [], [])
    online = {
        **manifest,
        "status": {"tracking": {"wandbRunId": RUN, "wandbRunUrl": PAGE, "wandbMode": "online"}},
    }
    assert f"W&B run:     {RUN}  {PAGE}" in describe(TrainingJob.from_dict(online), [], [])
