"""The progress helper's checkpoint housekeeping (trainingjob_progress/checkpoints.py, imported through
trainingjob_progress): retention, paths and resume resolution, atomic publication, and the
variables it reads from what the operator injects.

Split out of tests/trainer/test_progress_helper.py (the Reporter).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import pytest
import trainingjob_progress as tp

from builders.env import distributed_env
from crd import contract
from crd.spec import parse
from tests.trainer.progress_support import warnings_from
from tests.unit.crd_cases import job

# ---------------------------------------------------------------------------------------------------
# Checkpoints


def make_checkpoints(root: Path, *epochs: int) -> None:
    for epoch in epochs:
        (root / f"epoch-{epoch}").mkdir(parents=True)
        (root / f"epoch-{epoch}" / "model.pt").write_bytes(b"x")


def test_enforce_retention_deletes_the_oldest_checkpoints_beyond_keep(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, 1, 2, 9, 10, 11)
    (tmp_path / "epoch-final").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".epoch-12.tmp-1-ab").mkdir()
    deleted = tp.enforce_retention(str(tmp_path), keep=2)
    assert deleted == [str(tmp_path / f"epoch-{n}") for n in (1, 2, 9)]  # by epoch number, not by name
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".epoch-12.tmp-1-ab",
        "epoch-10",
        "epoch-11",
        "epoch-final",
        "notes.txt",
    ]
    assert tp.enforce_retention(str(tmp_path), keep=2) == []
    assert tp.enforce_retention(str(tmp_path), keep=5) == []


def test_enforce_retention_reads_checkpoint_dir_and_retention_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_checkpoints(tmp_path, 1, 2, 3)
    monkeypatch.setenv("CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.delenv("CHECKPOINT_RETENTION", raising=False)
    assert tp.enforce_retention() == []  # no retention configured: keep everything
    monkeypatch.setenv("CHECKPOINT_RETENTION", "1")
    assert tp.enforce_retention() == [str(tmp_path / "epoch-1"), str(tmp_path / "epoch-2")]
    assert tp.latest_checkpoint_dir() == str(tmp_path / "epoch-3")
    monkeypatch.delenv("CHECKPOINT_DIR")
    assert tp.enforce_retention(keep=1) == []


def test_enforce_retention_leaves_object_storage_and_rejects_keep_below_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    assert tp.enforce_retention("s3://bucket/job", keep=1) == []
    assert any("lifecycle rules" in m for m in warnings_from(caplog))
    with pytest.raises(ValueError, match="at least 1"):
        tp.enforce_retention(str(tmp_path), keep=0)


def test_checkpoint_paths_and_resume_resolution(tmp_path: Path) -> None:
    assert tp.checkpoint_path(3, "/checkpoints") == "/checkpoints/epoch-3"
    assert tp.checkpoint_path(3, "gs://bucket/job/") == "gs://bucket/job/epoch-3"
    with pytest.raises(ValueError, match="non-negative"):
        tp.checkpoint_path(-1, "/checkpoints")
    assert tp.checkpoint_epoch("/checkpoints/epoch-12/") == 12
    assert tp.checkpoint_epoch("/checkpoints/model.pt") is None
    assert tp.resume_path({"RESUME_FROM": "/checkpoints/epoch-2"}) == "/checkpoints/epoch-2"
    assert tp.resume_path({"RESUME_FROM": ""}) is None
    assert tp.resume_path({}) is None
    assert tp.latest_checkpoint_dir(str(tmp_path / "missing")) is None
    make_checkpoints(tmp_path, 2, 10)
    assert tp.latest_checkpoint_dir(str(tmp_path)) == str(tmp_path / "epoch-10")
    assert tp.resolve_checkpoint(str(tmp_path)) == str(tmp_path / "epoch-10")
    assert tp.resolve_checkpoint(str(tmp_path / "epoch-2")) == str(tmp_path / "epoch-2")
    assert tp.resolve_checkpoint("s3://bucket/job") == "s3://bucket/job"


def test_atomic_checkpoint_publishes_complete_directories_only(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    with tp.atomic_checkpoint(1, str(root)) as partial:
        assert not (root / "epoch-1").exists()
        Path(partial, "model.pt").write_text("v1")
    assert (root / "epoch-1" / "model.pt").read_text() == "v1"
    with tp.atomic_checkpoint(1, str(root)) as partial:  # written again after a restart
        Path(partial, "model.pt").write_text("v2")
    assert (root / "epoch-1" / "model.pt").read_text() == "v2"

    def crash_while_writing() -> None:
        with tp.atomic_checkpoint(2, str(root)) as partial:
            Path(partial, "model.pt").write_text("half")
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        crash_while_writing()
    assert sorted(os.listdir(root)) == ["epoch-1"]
    reference = tmp_path / "made-with-mkdir"
    reference.mkdir()  # the checkpoint gets the umask's mode, not mkdtemp's private 0700
    assert (root / "epoch-1").stat().st_mode == reference.stat().st_mode


def test_the_helper_reads_what_the_operator_injects() -> None:
    # The helper cannot import the operator's modules (it runs in the training image): guard the drift.
    assert tp.DEFAULT_ANNOTATION == contract.PROGRESS_ANNOTATION
    manifest = job({"spec.checkpoint.enabled": True})
    manifest["metadata"]["namespace"] = "ml-training"
    names = {entry["name"] for entry in distributed_env(parse(manifest), 0)}
    read = {
        "POD_NAME",
        "TRAININGJOB_NAMESPACE",
        "TRAININGJOB_PROGRESS_ANNOTATION",
        "TRAININGJOB_REPLICA_INDEX",
        "RANK",
        "LOCAL_WORLD_SIZE",
        "CHECKPOINT_DIR",
        "CHECKPOINT_RETENTION",
        tp.GRACE_PERIOD_ENV,
    }
    assert read <= names
    assert tp.GRACE_PERIOD_ENV == contract.GRACE_PERIOD_ENV
    assert tp.API_URL_ENV.startswith(contract.RESERVED_ENV_PREFIXES)  # spec.env can never set it


def test_a_checkpoint_saved_mid_epoch_is_named_by_its_step_and_ordered_after_its_epoch(
    tmp_path: Path,
) -> None:
    make_checkpoints(tmp_path, 1, 2)
    stopped = tp.checkpoint_path(2, str(tmp_path), step=57)
    assert stopped == str(tmp_path / "epoch-2-step-57")
    with tp.atomic_checkpoint(2, str(tmp_path), 57) as temporary:
        Path(temporary, "model.pt").write_bytes(b"x")
    (tmp_path / "epoch-1-step-33").mkdir()  # older than epoch 2's
    assert (tp.checkpoint_epoch(stopped), tp.checkpoint_step(stopped)) == (2, 57)
    assert tp.checkpoint_step(str(tmp_path / "epoch-2")) is None
    assert [path for _, path in tp.list_checkpoints(str(tmp_path))] == [
        str(tmp_path / name) for name in ("epoch-1", "epoch-1-step-33", "epoch-2", "epoch-2-step-57")
    ]
    assert tp.latest_checkpoint_dir(str(tmp_path)) == stopped
    assert tp.resolve_checkpoint(str(tmp_path)) == stopped
    (tmp_path / "epoch-3").mkdir()  # the end of the epoch comes after any step saved in it
    assert tp.latest_checkpoint_dir(str(tmp_path)) == str(tmp_path / "epoch-3")
    assert tp.enforce_retention(str(tmp_path), keep=2) == [
        str(tmp_path / name) for name in ("epoch-1", "epoch-1-step-33", "epoch-2")
    ]
    with pytest.raises(ValueError, match="step must be a non-negative integer"):
        tp.checkpoint_path(2, str(tmp_path), step=-1)


def test_stop_on_sigterm_only_sets_a_flag_and_says_how_long_there_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(tp.GRACE_PERIOD_ENV, "45")
    assert tp.grace_period_seconds() == 45.0
    assert tp.grace_period_seconds({}) is None
    assert tp.grace_period_seconds({tp.GRACE_PERIOD_ENV: "soon"}) is None
    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop = tp.stop_on_sigterm()
        assert not stop.is_set()
        with caplog.at_level(logging.INFO, logger="trainingjob_progress"):
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one changes nothing
        assert stop.is_set()
        said = [record.getMessage() for record in caplog.records]
        assert said == [
            "SIGTERM received: stopping after the current step (within the pod's 45 s grace period)"
        ]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert tp.EXIT_TERMINATED == 128 + signal.SIGTERM
