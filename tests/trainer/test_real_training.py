"""The reference trainer, run for real with the environment the operator gives its pods; no cluster
(tests/trainer/trainer_runs.py says how).

Why: the operator's promises about training (ranks that find each other, checkpoints every
CHECKPOINT_FREQUENCY epochs, RESUME_FROM after a restart, progress in the pod annotation) are only
true if the trainer it ships in every namespace's trainer ConfigMap keeps its side of the contract.

The torch test needs the `train` extra (`make test` installs it). The others run without torch: the
trainer's pure-Python simulation takes the same paths through checkpoints, resume and reporting.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.trainer.trainer_runs import (
    agent_store,
    api,
    epochs_logged,
    listing,
    reports,
    run_pods,
    training_job,
    with_broken_torch,
    without_torch,
)
from tests.unit.fakeapi import FakeApi

__all__ = ["agent_store", "api"]  # the fixtures


@pytest.mark.slow
def test_two_workers_train_fail_and_resume_from_the_reported_checkpoint(
    tmp_path: Path, api: FakeApi, agent_store: Callable[[], dict[str, str]]
) -> None:
    torch = pytest.importorskip("torch")
    mount = tmp_path / "checkpoints"
    job = training_job(
        mount,
        {},
        {
            "TRAIN_STEPS_PER_EPOCH": "3",
            "TRAIN_FAIL_AT_EPOCH": "2",
            "TRAIN_PROGRESS_INTERVAL": "0",
            "TRAIN_DIST_TIMEOUT": "240",
        },
    )

    first = run_pods(job, tmp_path, api, attempt=0, resume_from=None, rendezvous=agent_store())
    assert first.envs[0]["WORLD_SIZE"] == first.envs[1]["WORLD_SIZE"] == "2"
    assert [e["RANK"] for e in first.envs] == ["0", "1"]
    assert [e["TORCH_DISTRIBUTED_BACKEND"] for e in first.envs] == ["gloo", "gloo"]
    assert first.envs[0]["CHECKPOINT_DIR"] == str(mount)
    assert "RESUME_FROM" not in first.envs[0]
    assert first.codes == [1, 1], first.logs
    for rank, log in enumerate(first.logs):
        assert "joining the rendezvous at 127.0.0.1" in log
        assert epochs_logged(log, rank) == ["epoch 1/4", "epoch 2/4"], log
        assert "failing on purpose after epoch 2" in log
    assert listing(mount) == ["epoch-1", "epoch-2"]  # rank 0 writes, every epoch
    assert reports(api, 1) == []  # only rank 0 reports
    reported = reports(api, 0)[-1]
    assert (reported.epoch, reported.total_epochs, reported.step, reported.total_steps) == (2, 4, 6, 12)
    assert reported.checkpoint == str(mount / "epoch-2")
    assert set(reported.metrics) == {"loss", "accuracy"}

    # The gang restarts; the controller passes the latest reported checkpoint as RESUME_FROM.
    second = run_pods(
        job, tmp_path, api, attempt=1, resume_from=reported.checkpoint, rendezvous=agent_store()
    )
    assert [e["RESUME_FROM"] for e in second.envs] == [str(mount / "epoch-2")] * 2
    assert [e["TRAININGJOB_ATTEMPT"] for e in second.envs] == ["1", "1"]
    assert second.codes == [0, 0], second.logs
    for rank, log in enumerate(second.logs):
        assert f"resuming from epoch 2 (checkpoint {mount / 'epoch-2'})" in log
        assert epochs_logged(log, rank) == ["epoch 3/4", "epoch 4/4"], log  # the remaining epochs only
        assert "training finished: 4 epochs, 12 steps" in log
    assert listing(mount) == ["epoch-3", "epoch-4"]  # retention 2
    final = reports(api, 0)[-1]
    assert (final.epoch, final.total_epochs, final.step, final.total_steps) == (4, 4, 12, 12)
    assert final.checkpoint == str(mount / "epoch-4")
    assert 0.5 < final.metrics["accuracy"] <= 1.0
    state = torch.load(mount / "epoch-4" / "model.pt", weights_only=True)
    assert (state["epoch"], state["step"]) == (4, 12)
    assert reports(api, 1) == []


# ---------------------------------------------------------------------------------------------------
# Without torch: the simulation, the launcher for several processes per pod, configuration errors


def test_without_torch_one_pod_runs_a_process_per_local_rank_and_resumes(
    tmp_path: Path, api: FakeApi
) -> None:
    mount = tmp_path / "checkpoints"
    # One pod with two "GPUs": LOCAL_WORLD_SIZE=2, so train.py starts ranks 0 and 1 itself.
    job = training_job(
        mount,
        {"numWorkers": 1, "gpusPerWorker": 2, "hyperparameters": {"epochs": 3}},
        {"TRAIN_STEPS_PER_EPOCH": "2", "TRAIN_FAIL_AT_EPOCH": "2", "TRAIN_PROGRESS_INTERVAL": "0"},
    )
    job["spec"]["checkpoint"]["retention"] = 1
    first = run_pods(job, tmp_path, api, attempt=0, resume_from=None, extra_env=without_torch(tmp_path))
    assert (first.envs[0]["LOCAL_WORLD_SIZE"], first.envs[0]["WORLD_SIZE"]) == ("2", "2")
    [log] = first.logs
    assert first.codes == [1], log
    assert "starting one process per local rank (ranks 0-1 of 2)" in log
    assert "torch is not importable" in log
    assert "running the pure-Python simulation" in log
    # Both ranks fail after epoch 2; the launcher gives the second one time to end by itself.
    assert epochs_logged(log, 0) == epochs_logged(log, 1) == ["epoch 1/3", "epoch 2/3"]
    assert listing(mount) == ["epoch-2"]
    assert reports(api, 0)[-1].checkpoint == str(mount / "epoch-2")

    # A resumeFrom naming the checkpoint directory itself resumes from the newest checkpoint in it.
    second = run_pods(
        job, tmp_path, api, attempt=1, resume_from=str(mount), extra_env=without_torch(tmp_path)
    )
    [log] = second.logs
    assert second.codes == [0], log
    assert f"resuming from epoch 2 (checkpoint {mount / 'epoch-2'})" in log
    assert epochs_logged(log, 0) == epochs_logged(log, 1) == ["epoch 3/3"]
    assert listing(mount) == ["epoch-3"]
    final = reports(api, 0)[-1]
    assert (final.epoch, final.step, final.checkpoint) == (3, 6, str(mount / "epoch-3"))


def test_torch_that_is_installed_but_does_not_load_fails_the_run_instead_of_simulating(
    tmp_path: Path, api: FakeApi
) -> None:
    """A torch job's rank whose torch cannot load (a tight memory limit) must not write a simulation
    checkpoint beside torch's: every later resume of the job would refuse it."""
    mount = tmp_path / "checkpoints"
    job = training_job(
        mount, {"numWorkers": 1}, {"TRAIN_STEPS_PER_EPOCH": "2", "TRAIN_PROGRESS_INTERVAL": "0"}
    )
    run = run_pods(job, tmp_path, api, attempt=0, resume_from=None, extra_env=with_broken_torch(tmp_path))
    [log] = run.logs
    assert run.codes == [1], log
    assert "torch is installed but failed to import: OSError: libtorch_cpu.so: failed to map segment" in log
    assert "simulation" not in log
    assert not mount.exists() or listing(mount) == []


def test_a_bad_setting_exits_2_with_a_clear_message(tmp_path: Path, api: FakeApi) -> None:
    job = training_job(tmp_path / "checkpoints", {"numWorkers": 1}, {"TRAIN_STEPS_PER_EPOCH": "many"})
    run = run_pods(job, tmp_path, api, attempt=0, resume_from=None)
    assert run.codes == [2]
    assert "configuration error: TRAIN_STEPS_PER_EPOCH='many' is not an integer" in run.logs[0]


def test_a_missing_resume_point_exits_2(tmp_path: Path, api: FakeApi) -> None:
    job = training_job(tmp_path / "checkpoints", {"numWorkers": 1}, {"TRAIN_SIMULATE": "1"})
    missing = str(tmp_path / "checkpoints" / "epoch-7")
    run = run_pods(job, tmp_path, api, attempt=1, resume_from=missing)
    assert run.codes == [2]
    assert f"configuration error: RESUME_FROM={missing} does not exist" in run.logs[0]


def test_a_fail_file_fails_the_rank_mid_epoch_once(tmp_path: Path, api: FakeApi) -> None:
    """TRAIN_FAIL_FILE (the recovery bench's failure): the rank that finds the file removes it and
    exits 1 after its current step; the next run, without the file, trains to the end."""
    trigger = tmp_path / "fail-now"
    trigger.touch()
    env = {"TRAIN_SIMULATE": "1", "TRAIN_STEPS_PER_EPOCH": "3", "TRAIN_FAIL_FILE": str(trigger)}
    job = training_job(tmp_path / "checkpoints", {"numWorkers": 1, "hyperparameters": {"epochs": 2}}, env)
    failed = run_pods(job, tmp_path, api, attempt=0, resume_from=None)
    assert failed.codes == [1], failed.logs
    assert f"FailedOnPurpose: TRAIN_FAIL_FILE {trigger} appeared during step 1" in failed.logs[0]
    assert epochs_logged(failed.logs[0], 0) == []
    assert not trigger.exists()
    again = run_pods(job, tmp_path, api, attempt=1, resume_from=None)
    assert again.codes == [0], again.logs
    assert epochs_logged(again.logs[0], 0) == ["epoch 1/2", "epoch 2/2"]
