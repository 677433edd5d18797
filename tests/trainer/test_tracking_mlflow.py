"""The reference trainer's MLflow run (trainer/reference_trainer/tracking.py) with MLflow's own client on
a store in a temporary directory: one run per job found again by a later attempt, steps the run holds not
logged twice, params, the model as an artifact, a deleted run replaced, and a server that does not
answer costing training nothing. The same against the real server on the real node, across a real gang
restart: tests/e2e/test_mlflow_real_node.py."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from reference_trainer.config import Config
from reference_trainer.engines import SimulationEngine
from reference_trainer.tracking import TAG_NAME, TAG_NAMESPACE, TAG_UID, MlflowRun, TensorBoardLog

JOB = {
    "TRAININGJOB_NAME": "mnist",
    "TRAININGJOB_NAMESPACE": "team-a",
    "TRAININGJOB_UID": "0b6a0c6e-uid",
    "MLFLOW_EXPERIMENT_NAME": "mnist-experiments",
    "EPOCHS": "4",
    "TRAIN_STEPS_PER_EPOCH": "5",
    "LEARNING_RATE": "0.1",
    "MODEL_NAME": "cnn",
}


class Reports:
    """Stands in for the progress Reporter: what the trainer said of its run."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def tracking(self, **fields: Any) -> None:
        self.calls.append(fields)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    # MLflow's file store stands in for the server here (the e2e test uses the server).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    return (tmp_path / "mlruns").as_uri()


def attempt(uri: str, reports: Reports, **env: str) -> MlflowRun:
    merged = {**JOB, "MLFLOW_TRACKING_URI": uri, **env}
    run = MlflowRun.from_env(Config.from_env(merged), reports, merged)  # type: ignore[arg-type]
    assert run is not None
    run.start(0)
    return run


def steps(client: MlflowClient, run_id: str, metric: str = "accuracy") -> list[int]:
    return [int(m.step) for m in sorted(client.get_metric_history(run_id, metric), key=lambda m: m.timestamp)]


def test_later_attempts_log_into_the_job_run_without_repeating_steps(store: str, tmp_path: Path) -> None:
    reports = Reports()
    first = attempt(store, reports)
    first.log_epoch({"loss": 0.9, "accuracy": 0.5}, epoch=1, step=5)
    first.log_epoch({"loss": 0.7, "accuracy": 0.6}, epoch=2, step=10)
    run_id = first.run_id
    assert run_id is not None
    assert reports.calls[-1] == {"mlflow_run_id": run_id, "mlflow_experiment_id": first.experiment_id}

    # The gang restarts from the checkpoint of epoch 1: epoch 2 is trained again, and not logged again.
    second = attempt(store, reports)
    assert second.run_id == run_id
    second.log_epoch({"loss": 0.71, "accuracy": 0.61}, epoch=2, step=10)
    second.log_epoch({"loss": 0.5, "accuracy": 0.7}, epoch=3, step=15)
    config = Config.from_env({**JOB, "TRAIN_SIMULATE": "1"})
    second.log_model(SimulationEngine(config), epoch=3, step=15)
    second.finish(completed=True)

    client = MlflowClient(store)
    runs = client.search_runs([second.experiment_id or ""])
    assert [run.info.run_id for run in runs] == [run_id]
    run = client.get_run(run_id)
    assert run.info.run_name == "mnist"
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert (tags[TAG_NAMESPACE], tags[TAG_NAME], tags[TAG_UID]) == ("team-a", "mnist", "0b6a0c6e-uid")
    assert run.data.params["learning_rate"] == "0.1"
    assert run.data.params["epochs"] == "4"
    assert run.data.params["model"] == "cnn"
    assert steps(client, run_id) == [5, 10, 15]
    assert steps(client, run_id, "epoch") == [5, 10, 15]
    assert [artifact.path for artifact in client.list_artifacts(run_id, "model")]


def test_a_run_deleted_in_mlflow_is_replaced_by_a_new_one(store: str) -> None:
    reports = Reports()
    run = attempt(store, reports)
    run.log_epoch({"accuracy": 0.5}, epoch=1, step=5)
    deleted = run.run_id
    assert deleted is not None
    client = MlflowClient(store)
    client.delete_run(deleted)

    run.log_epoch({"accuracy": 0.6}, epoch=2, step=10)
    assert run.run_id not in (None, deleted)
    assert reports.calls[-1]["mlflow_run_id"] == run.run_id
    assert steps(client, str(run.run_id)) == [10]
    assert client.get_run(str(run.run_id)).data.tags[TAG_UID] == JOB["TRAININGJOB_UID"]


def test_a_server_that_does_not_answer_costs_training_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    reports = Reports()
    run = attempt(f"http://127.0.0.1:{port}", reports)
    assert run.run_id is None
    assert reports.calls[-1]["error"].startswith(f"cannot reach http://127.0.0.1:{port}")
    run.log_epoch({"accuracy": 0.5}, epoch=1, step=5)
    run.log_model(SimulationEngine(Config.from_env({**JOB, "TRAIN_SIMULATE": "1"})), epoch=1, step=5)
    run.finish(completed=True)
    assert "error" in reports.calls[-1]
    assert run.pending == [("accuracy", 0.5, 5), ("epoch", 1.0, 5)]


def test_no_uri_or_another_rank_tracks_nothing() -> None:
    reports = Reports()
    config = Config.from_env(JOB)
    assert MlflowRun.from_env(config, reports, JOB) is None  # type: ignore[arg-type]
    ranked = {**JOB, "MLFLOW_TRACKING_URI": "http://mlflow:5000", "RANK": "1", "WORLD_SIZE": "2"}
    assert MlflowRun.from_env(Config.from_env(ranked), reports, ranked) is None  # type: ignore[arg-type]


def docs_snippet() -> str:
    """The Python block of docs/progress.md's "Your own code"."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "progress.md").read_text(encoding="utf-8")
    section = text.split("**Your own code.**", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_lines_docs_give_users_keep_one_run_across_attempts(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow  # noqa: PLC0415 - its fluent API, as the docs use it

    for name, value in {**JOB, "MLFLOW_TRACKING_URI": store}.items():
        monkeypatch.setenv(name, value)
    code = docs_snippet()
    runs = []
    for _attempt in range(2):
        scope: dict[str, Any] = {}
        exec(code, scope)  # noqa: S102 - the documented lines, run as a user's trainer runs them
        runs.append(scope["run"].info.run_id)
        mlflow.end_run()
    assert runs[0] == runs[1]
    client = MlflowClient(store)
    assert client.get_run(runs[0]).data.tags[TAG_UID] == JOB["TRAININGJOB_UID"]
    assert client.get_run(runs[0]).info.run_name == JOB["TRAININGJOB_NAME"]


def test_tensorboard_events_of_every_attempt_read_back_with_each_step_once(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415

    directory = tmp_path / "checkpoints" / "tensorboard"
    env = {**JOB, "TENSORBOARD_LOG_DIR": str(directory)}
    config = Config.from_env(env)
    first = TensorBoardLog.from_env(config, env)
    assert first is not None
    first.start(0)
    for epoch in (1, 2, 3):
        first.log_epoch({"loss": 1.0 / epoch, "accuracy": 0.2 * epoch}, epoch=epoch, step=5 * epoch)
    first.finish(completed=False)
    # The gang restarts from epoch 2's checkpoint (step 10): epoch 3 is trained and written again.
    second = TensorBoardLog.from_env(config, env)
    assert second is not None
    second.start(10)
    for epoch in (3, 4):
        second.log_epoch({"loss": 0.9 / epoch, "accuracy": 0.21 * epoch}, epoch=epoch, step=5 * epoch)
    second.finish(completed=True)

    events = EventAccumulator(str(directory))
    events.Reload()
    scalars = events.Scalars("accuracy")
    assert [event.step for event in scalars] == [5, 10, 15, 20]
    assert scalars[2].value == pytest.approx(0.63)  # the second attempt's epoch 3
    assert {"loss", "accuracy", "epoch"} <= set(events.Tags()["scalars"])
    ranked = {**env, "RANK": "1", "WORLD_SIZE": "2"}
    assert TensorBoardLog.from_env(Config.from_env(ranked), ranked) is None


def test_metrics_a_restarting_server_missed_are_sent_before_the_attempt_ends(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reference_trainer import tracking  # noqa: PLC0415

    monkeypatch.setattr(tracking, "FLUSH_RETRY_SECONDS", 0.0)
    reports = Reports()
    run = attempt(store, reports)
    real = run.client.log_batch
    down = {"calls": 2}

    def restarting(*args: Any, **kwargs: Any) -> None:
        if down["calls"]:
            down["calls"] -= 1
            raise ConnectionError("connection refused")
        real(*args, **kwargs)

    monkeypatch.setattr(run.client, "log_batch", restarting)
    run.log_epoch({"accuracy": 0.5}, epoch=1, step=5)
    assert "error" in reports.calls[-1]
    run.finish(completed=False)  # a gang restart: the attempt ends, the server is back
    assert steps(MlflowClient(store), str(run.run_id)) == [5]
    assert "error" not in reports.calls[-1]
