"""The reference trainer's files as a pod gets them: every file of trainer/ travels in the namespace's
trainer ConfigMap under a flat key a ConfigMap accepts, and the pod's volume puts each key back at its
path, so the mount holds trainer/'s tree and nothing else, and the trainer and the helper run from it.

Why: the entry script and the progress helper import modules from the mount (/etc/trainingjob in a pod).
A module left out of builders.configmap.TRAINER_FILES, or mounted at another path than its own, would
pass every test that runs the trainer from the repository and fail every job in a cluster.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from builders.configmap import (
    PROGRESS_HELPER_FILE,
    TRAINER_DIR,
    TRAINER_FILES,
    TRAINER_SOURCES,
    TRAINER_TEXTS,
    config_map_key,
)
from builders.pods import build_pod
from crd import contract
from crd.spec import parse
from tests.cluster import REPO
from tests.trainer.trainer_runs import install_config_map
from tests.unit.builders_support import defaulted

# What the API server accepts as a ConfigMap key (a flat name: no "/").
CONFIG_MAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def tree(directory: Path) -> set[str]:
    """Every file under `directory` by its relative path, without Python's byte-code caches."""
    return {
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_every_file_of_the_trainer_folder_is_shipped_under_a_flat_key() -> None:
    assert set(TRAINER_FILES) == tree(TRAINER_DIR)
    assert len(TRAINER_FILES) == len(set(TRAINER_FILES))
    assert set(TRAINER_TEXTS) == set(TRAINER_FILES)
    assert len(TRAINER_SOURCES) == len(TRAINER_FILES), "two files share a key"
    for name in TRAINER_SOURCES:
        assert CONFIG_MAP_KEY.match(name), name
        assert len(name) <= 253, name


def test_the_pods_volume_maps_every_key_back_to_its_path() -> None:
    pod = build_pod(parse(defaulted()), 0, attempt=0, resume_from=None)
    (volume,) = (v for v in pod["spec"]["volumes"] if v["name"] == contract.CONFIG_VOLUME)
    items = volume["configMap"]["items"]
    assert [item["path"] for item in items] == list(TRAINER_FILES)
    assert all(item["key"] == config_map_key(item["path"]) for item in items)
    assert {item["key"] for item in items} == set(TRAINER_SOURCES)


def test_the_trainer_runs_and_the_helper_imports_from_the_mounted_files_alone(tmp_path: Path) -> None:
    mount = install_config_map(defaulted(), tmp_path / "etc-trainingjob").parent
    assert tree(mount) == set(TRAINER_FILES)
    # -I: no PYTHONPATH, no user site, no current directory: only the mount, as PYTHONPATH would add it.
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
    assert helper.stdout.split() == ["False", str(mount / PROGRESS_HELPER_FILE)]
    env = {
        "TRAIN_SIMULATE": "1",
        "EPOCHS": "2",
        "TRAIN_STEPS_PER_EPOCH": "2",
        "CHECKPOINT_DIR": str(tmp_path / "ckpt"),
    }
    # The default command's script, run as the pod runs it (python <mount>/train.py).
    trainer = subprocess.run(
        [sys.executable, "-I", str(mount / contract.TRAINER_FILE)],
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


def test_the_training_readme_names_every_file_a_user_copies() -> None:
    """examples/training/README.md tells users to copy the helper's folder and says how many files it
    holds: it names the folder and every file of it, and every file of the reference trainer."""
    readme = (REPO / "examples" / "training" / "README.md").read_text(encoding="utf-8")
    for path in TRAINER_FILES:
        folder, _, name = path.rpartition("/")
        assert path in readme or (f"trainer/{folder}/" in readme and f"`{name}`" in readme), path
    helper_folder = PROGRESS_HELPER_FILE.rpartition("/")[0]
    helper = [path for path in TRAINER_FILES if path.startswith(f"{helper_folder}/")]
    in_words = {6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
    assert f"`trainer/{helper_folder}/` (all {in_words[len(helper)]} files of it)" in readme
