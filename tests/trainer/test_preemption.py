"""No work lost to a preemption, with real torch and no cluster: the reference trainer told to stop
(SIGTERM) in the middle of an epoch saves a checkpoint of that step within its grace period, reports
it, exits 143, and a new run resumes at that step; a save that outlasts the grace period leaves the
previous checkpoint as the newest (docs/progress.md, "When the pod is told to stop").

This test plays the kubelet's part of a pod deletion: SIGTERM to the trainer, then SIGKILL once the
pod's grace period (terminationGracePeriodSeconds, from the job's podTemplate) is over. How the
trainers run is tests/trainer/trainer_runs.py's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trainingjob_progress as tp

from testbed import wait_for
from tests.trainer.trainer_runs import (
    Pods,
    agent_store,
    api,
    epochs_logged,
    listing,
    reports,
    run_pods,
    start_pods,
    training_job,
)
from tests.unit.fakeapi import FakeApi

__all__ = ["agent_store", "api"]  # the fixtures

GRACE = 30  # the pods' grace period, seconds
STEPS = 40  # per epoch
EPOCHS = 3


def preemptible_job(mount: Path, **env: str) -> dict[str, Any]:
    return training_job(
        mount,
        {
            "hyperparameters": {"epochs": EPOCHS, "batchSize": 16, "learningRate": 0.05, "optimizer": "sgd"},
            "podTemplate": {"spec": {"terminationGracePeriodSeconds": GRACE}},
        },
        {
            "TRAIN_STEPS_PER_EPOCH": str(STEPS),
            "TRAIN_STEP_SECONDS": "0.05",
            "TRAIN_PROGRESS_INTERVAL": "0",
            "TRAIN_DIST_TIMEOUT": "120",
            **env,
        },
    )


def delete_pod(process: subprocess.Popen[bytes], grace: float) -> int:
    """What a kubelet does to a pod being deleted: SIGTERM, then SIGKILL when the grace period is over;
    the trainer's exit code (-9 when it had to be killed)."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def after_epoch_one(api: FakeApi, pods: Pods) -> None:
    """Waits until rank 0 reported epoch 1: the trainers are in epoch 2 then."""

    def reported() -> bool:
        assert all(process.poll() is None for process in pods.processes), pods.logs()
        return any(report.epoch == 1 for report in reports(api, 0))

    wait_for("rank 0's report of epoch 1", reported, timeout=180)


@pytest.mark.slow
def test_a_rank_told_to_stop_mid_epoch_saves_that_step_and_the_next_run_resumes_there(
    tmp_path: Path, api: FakeApi, agent_store: Callable[[], dict[str, str]]
) -> None:
    torch = pytest.importorskip("torch")
    mount = tmp_path / "checkpoints"
    job = preemptible_job(mount)
    pods = start_pods(job, tmp_path, api, attempt=0, resume_from=None, rendezvous=agent_store())
    try:
        assert {env[tp.GRACE_PERIOD_ENV] for env in pods.envs} == {str(GRACE)}
        after_epoch_one(api, pods)
        # Worker 1 is evicted: its trainer gets SIGTERM. Every rank stops after the same step, rank 0
        # saves it, and both exit 143 on their own, within the grace period.
        evicted = delete_pod(pods.processes[1], GRACE)
        run = pods.wait(GRACE)
    finally:
        pods.kill()
    assert (evicted, run.codes[0]) == (tp.EXIT_TERMINATED, tp.EXIT_TERMINATED), run.logs
    signalled = re.search(r"SIGTERM received during step (\d+)", run.logs[1])
    assert signalled is not None, run.logs[1]
    step = int(signalled.group(1))
    assert STEPS < step < 2 * STEPS, "mid-epoch 2"
    for log in run.logs:
        assert f"stopping at step {step} of {EPOCHS * STEPS} (epoch 2/{EPOCHS})" in log
    saved = mount / f"epoch-1-step-{step}"
    assert listing(mount) == ["epoch-1", saved.name]
    state = torch.load(saved / "model.pt", weights_only=True)
    assert (state["epoch"], state["step"]) == (1, step)
    last = reports(api, 0)[-1]
    assert (last.epoch, last.step, last.checkpoint) == (1, step, str(saved))

    # The next attempt gets the reported checkpoint as RESUME_FROM and continues at that step.
    second = run_pods(job, tmp_path, api, attempt=1, resume_from=last.checkpoint, rendezvous=agent_store())
    assert second.codes == [0, 0], second.logs
    for rank, log in enumerate(second.logs):
        assert (
            f"resuming from epoch 1 (checkpoint {saved}): 2 of {EPOCHS} epochs left, at step {step} of "
            f"{EPOCHS * STEPS}"
        ) in log
        assert epochs_logged(log, rank) == [f"epoch 2/{EPOCHS}", f"epoch 3/{EPOCHS}"], log
        assert f"training finished: {EPOCHS} epochs, {EPOCHS * STEPS} steps" in log
    final = reports(api, 0)[-1]
    assert (final.epoch, final.step) == (EPOCHS, EPOCHS * STEPS)


@pytest.mark.slow
def test_a_save_that_outlasts_the_grace_period_leaves_the_previous_checkpoint_the_newest(
    tmp_path: Path, api: FakeApi
) -> None:
    """One process (the simulation), whose saves take longer than its grace period: SIGKILL comes while
    the stop's checkpoint is written but not yet renamed into place."""
    mount = tmp_path / "checkpoints"
    job = preemptible_job(mount, TRAIN_SIMULATE="1", TRAIN_SAVE_SECONDS="6")
    job["spec"]["numWorkers"] = 1
    pods = start_pods(job, tmp_path, api, attempt=0, resume_from=None)
    try:
        after_epoch_one(api, pods)
        code = delete_pod(pods.processes[0], grace=2.0)
    finally:
        pods.kill()
    log = pods.logs()[0]
    assert code == -signal.SIGKILL, log
    assert "SIGTERM received during step" in log
    # The stop's checkpoint never became one: only its hidden temporary directory is left.
    assert [name for name in listing(mount) if not name.startswith(".")] == ["epoch-1"]
    assert any(name.startswith(".epoch-1-step-") for name in listing(mount))
    assert tp.latest_checkpoint_dir(str(mount)) == str(mount / "epoch-1")
    assert reports(api, 0)[-1].checkpoint == str(mount / "epoch-1")

    # The next attempt resumes from the previous checkpoint, epoch 1's.
    fast_saves = {"TRAIN_SAVE_SECONDS": "0"}
    second = run_pods(job, tmp_path, api, attempt=1, resume_from=str(mount / "epoch-1"), extra_env=fast_saves)
    assert second.codes == [0], second.logs
    assert f"resuming from epoch 1 (checkpoint {mount / 'epoch-1'})" in second.logs[0]
