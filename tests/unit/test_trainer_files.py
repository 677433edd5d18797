"""The reference trainer's files as a pod gets them: every file of trainer/ travels in the namespace's
trainer ConfigMap, under a key a ConfigMap accepts, and runs from a directory holding nothing else.

Why: train.py and the progress helper are split into modules that import each other from their own
directory (/etc/trainingjob in a pod). A module left out of builders.configmap.TRAINER_FILES would
pass every test that runs the trainer from the repository and fail every job in a cluster.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from builders.configmap import TRAINER_DIR, TRAINER_FILES, TRAINER_SOURCES

# What the API server accepts as a ConfigMap key (a flat name: no "/").
CONFIG_MAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def test_every_file_of_the_trainer_folder_is_shipped_under_a_flat_key() -> None:
    on_disk = {path.name for path in TRAINER_DIR.glob("*.py")}
    assert set(TRAINER_FILES) == on_disk
    assert len(TRAINER_FILES) == len(set(TRAINER_FILES))
    for name in TRAINER_SOURCES:
        assert CONFIG_MAP_KEY.match(name), name
        assert len(name) <= 253, name


def install(directory: Path) -> Path:
    """The ConfigMap's files in `directory`, as the kubelet mounts them."""
    directory.mkdir()
    for name, text in TRAINER_SOURCES.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def test_the_trainer_runs_and_the_helper_imports_from_the_mounted_files_alone(tmp_path: Path) -> None:
    mount = install(tmp_path / "etc-trainingjob")
    # -I: no PYTHONPATH, no user site, no current directory: only the script's own directory (the mount).
    helper = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(mount)!r}); import trainingjob_progress as tp; "
            "print(tp.Reporter.from_env({}).enabled, tp.__file__)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert helper.returncode == 0, helper.stderr
    assert helper.stdout.split() == ["False", str(mount / "trainingjob_progress.py")]
    env = {
        "TRAIN_SIMULATE": "1",
        "EPOCHS": "2",
        "TRAIN_STEPS_PER_EPOCH": "2",
        "CHECKPOINT_DIR": str(tmp_path / "ckpt"),
    }
    trainer = subprocess.run(
        [sys.executable, "-I", str(mount / "train.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert trainer.returncode == 0, trainer.stderr
    assert "training finished: 2 epochs, 4 steps" in trainer.stderr
    assert sorted(path.name for path in (tmp_path / "ckpt").iterdir()) == ["epoch-1", "epoch-2"]
