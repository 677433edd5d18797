"""The reference trainer's W&B run (trainer/reference_trainer/wandb_run.py) in offline mode, read back
from W&B's own files (tests/wandb_offline.py): two attempts of a job, the second resumed from an older
checkpoint than the first reached, are one run (the job's UID) whose history has each step once and in
order, with the hyperparameters as config, kept on the checkpoint claim. Beside it, what never fails
training: no wandb package, a server that does not answer (the attempt logs offline and says why), a
log call that raises. The same across a real gang restart on the real node:
tests/e2e/test_mlflow_real_node.py."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reference_trainer.config import Config
from reference_trainer.tracking import trackers
from reference_trainer.wandb_run import WandbRun, run_mode
from trainingjob_progress.base import OnceLogger
from trainingjob_progress.report import ReportBuilder

from tests.trainer.trainer_runs import agent_store, api, reports, run_pods, training_job
from tests.unit.fakeapi import FakeApi
from tests.wandb_offline import offline_runs

__all__ = ["agent_store", "api"]  # the fixtures

STEPS_PER_EPOCH = 2


class Reports:
    """Stands in for the progress Reporter: what the trainer said of its run."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def tracking(self, **fields: Any) -> None:
        self.calls.append(fields)


@pytest.mark.slow
def test_two_attempts_are_one_offline_run_on_the_claim_with_each_step_once(
    tmp_path: Path, api: FakeApi, agent_store: Callable[[], dict[str, str]]
) -> None:
    pytest.importorskip("torch")
    mount = tmp_path / "checkpoints"
    # Checkpoints every 2 epochs, a failure after epoch 3: the second attempt resumes from epoch 2 and
    # trains epoch 3 again, which the run holds already.
    job = training_job(
        mount,
        {"numWorkers": 1, "monitoring": {"wandbProject": "mnist", "wandbEntity": "team"}},
        {
            "TRAIN_STEPS_PER_EPOCH": str(STEPS_PER_EPOCH),
            "TRAIN_FAIL_AT_EPOCH": "3",
            "TRAIN_PROGRESS_INTERVAL": "0",
        },
    )
    job["spec"]["hyperparameters"]["epochs"] = 5
    job["spec"]["checkpoint"]["frequency"] = 2

    first = run_pods(job, tmp_path, api, attempt=0, resume_from=None, rendezvous=agent_store())
    assert first.codes == [1], first.logs
    assert first.envs[0]["WANDB_DIR"] == str(mount)
    assert "WANDB_API_KEY" not in first.envs[0]
    reported = reports(api, 0)[-1]
    assert (reported.wandb_run_id, reported.wandb_mode, reported.wandb_run_url) == (
        "uid-real-train",
        "offline",
        None,
    )
    assert reported.checkpoint == str(mount / "epoch-2")

    # The restarted gang does not fail again.
    again = {"TRAIN_FAIL_AT_EPOCH": ""}
    second = run_pods(
        job,
        tmp_path,
        api,
        attempt=1,
        resume_from=reported.checkpoint,
        rendezvous=agent_store(),
        extra_env=again,
    )
    assert second.codes == [0], second.logs
    final = reports(api, 0)[-1]
    assert (final.wandb_run_id, final.tracking_error) == ("uid-real-train", None)

    attempts = offline_runs(mount / "wandb")
    assert len(attempts) == 2, [run.directory for run in attempts]
    assert {run.run_id for run in attempts} == {"uid-real-train"}
    assert {(run.project, run.group, run.name) for run in attempts} == {("mnist", "real-train", "real-train")}
    # The first attempt ended preempted (to be resumed), the second finished.
    assert [(run.preempting, run.exit_code) for run in attempts] == [(True, 1), (False, 0)]
    steps = [step for run in attempts for step in run.steps("accuracy")]
    assert steps == [STEPS_PER_EPOCH * epoch for epoch in range(1, 6)], steps
    assert [step for run in attempts for step in run.steps("epoch")] == steps
    assert [row["epoch"] for run in attempts for row in run.history] == [1, 2, 3, 4, 5]
    config = attempts[1].config
    assert (config["learning_rate"], config["epochs"], config["optimizer"]) == (0.05, 5, "sgd")
    assert (config["model"], config["world_size"]) == ("mlp", 1)


def attempt(wandb_dir: Path, reports: Reports, **env: str) -> WandbRun:
    merged = {
        "WANDB_DIR": str(wandb_dir),
        "TRAININGJOB_NAME": "mnist",
        "TRAININGJOB_UID": "uid-1",
        "WANDB_PROJECT": "mnist",
        "WANDB_RUN_GROUP": "mnist",
        "EPOCHS": "3",
        **env,
    }
    run = WandbRun.from_env(Config.from_env(merged), reports, merged)  # type: ignore[arg-type]
    assert run is not None
    return run


@pytest.fixture
def wandb_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """WANDB_DIR as the operator sets it, and nothing of the machine's W&B settings."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_RUN_ID", "WANDB_INIT_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path


def test_a_server_that_does_not_answer_makes_the_attempt_log_offline(wandb_dir: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    reports = Reports()
    server = {
        "WANDB_API_KEY": "k" * 40,
        "WANDB_BASE_URL": f"http://127.0.0.1:{port}",
        "WANDB_INIT_TIMEOUT": "1",
    }
    run = attempt(wandb_dir, reports, **server)
    assert run.mode == "online"
    run.start(0)
    assert run.mode == "offline"
    assert reports.calls[-1]["wandb_run_id"] == "uid-1"
    assert reports.calls[-1]["error"].startswith("W&B: cannot start the online run")
    run.log_epoch({"accuracy": 0.5}, epoch=1, step=5)
    run.finish(completed=True)
    (offline,) = offline_runs(wandb_dir / "wandb")
    assert (offline.run_id, offline.steps("accuracy"), offline.exit_code) == ("uid-1", [5], 0)


def test_a_log_call_that_fails_is_a_warning_and_training_goes_on(wandb_dir: Path) -> None:
    reports = Reports()
    run = attempt(wandb_dir, reports)
    run.start(0)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the disk is full")

    real_log, run.run.log = run.run.log, refuse
    run.log_epoch({"accuracy": 0.5}, epoch=1, step=5)
    assert reports.calls[-1]["error"] == "W&B: could not log metrics: RuntimeError: the disk is full"
    run.run.log = real_log
    run.log_epoch({"accuracy": 0.6}, epoch=2, step=10)
    run.finish(completed=True)
    (offline,) = offline_runs(wandb_dir / "wandb")
    assert offline.steps("accuracy") == [10]


def test_no_project_another_rank_or_no_package_tracks_nothing(
    wandb_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = Reports()
    plain = {"TRAININGJOB_UID": "uid-1"}
    assert WandbRun.from_env(Config.from_env(plain), reports, plain) is None  # type: ignore[arg-type]
    ranked = {**plain, "WANDB_PROJECT": "p", "RANK": "1", "WORLD_SIZE": "2"}
    assert WandbRun.from_env(Config.from_env(ranked), reports, ranked) is None  # type: ignore[arg-type]
    assert reports.calls == []
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails, as in an image without it
    tracked = {**plain, "WANDB_PROJECT": "p"}
    assert trackers(Config.from_env(tracked), reports, tracked).__class__.__name__ == "NoTracking"  # type: ignore[arg-type]
    assert reports.calls == [
        {"error": "W&B: wandb is not installed in the trainer's image", "wandb_mode": "offline"}
    ]


def test_the_mode_is_the_users_else_online_with_a_key_else_offline() -> None:
    assert run_mode({}) == "offline"
    assert run_mode({"WANDB_API_KEY": "k"}) == "online"
    assert run_mode({"WANDB_API_KEY": "k", "WANDB_MODE": "offline"}) == "offline"
    assert run_mode({"WANDB_MODE": "disabled"}) == "disabled"


def test_each_trackers_error_stands_until_that_tracker_clears_it() -> None:
    builder = ReportBuilder(OnceLogger())
    report: dict[str, Any] = {
        "epoch": None,
        "total_epochs": None,
        "step": 1,
        "total_steps": None,
        "metrics": None,
    }
    builder.set_tracking(mlflow_run_id=None, mlflow_experiment_id=None, error="cannot reach mlflow")
    wandb = {"runId": "uid-1", "url": None, "mode": "offline"}
    builder.set_tracking(
        mlflow_run_id=None, mlflow_experiment_id=None, error=None, wandb=wandb, tracker="wandb"
    )
    sent = builder.build(**report, checkpoint=None, checkpoint_time=None)
    assert (sent["wandb"], sent["trackingError"]) == (
        {"runId": "uid-1", "mode": "offline"},
        "cannot reach mlflow",
    )
    builder.set_tracking(mlflow_run_id=None, mlflow_experiment_id=None, error="W&B: down", tracker="wandb")
    assert builder.build(**report, checkpoint=None, checkpoint_time=None)["trackingError"] == (
        "cannot reach mlflow; W&B: down"
    )
    builder.set_tracking(mlflow_run_id="r", mlflow_experiment_id=None, error=None)
    sent = builder.build(**report, checkpoint=None, checkpoint_time=None)
    assert (sent["mlflow"], sent["trackingError"]) == ({"runId": "r"}, "W&B: down")
