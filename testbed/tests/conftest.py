"""Fixtures of the testbed's own tests: a throwaway second dev cluster, a copy of what images are
built from."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import Kubectl
from testbed.common import REPO
from testbed.images import debian_pins, dockerfile
from testbed.images.recipe import Context
from testbed.tests.clusters import dev_cluster


@pytest.fixture
def scratch_dir(tmp_path: Path, cluster: Kubectl) -> Iterator[Path]:
    """A second dev directory; whatever a test starts there is stopped afterwards."""
    dev_dir = tmp_path / "dev"
    try:
        yield dev_dir
    finally:
        dev_cluster("down", dev_dir=dev_dir, check=False)


@pytest.fixture
def context(tmp_path: Path) -> Context:
    """A copy of what the operator image is built from, an apt directory and a CA directory."""
    repo = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    repo.mkdir()
    for name in ("Dockerfile", ".dockerignore", "setup.cfg", "pyproject.toml", debian_pins.PINS):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, repo / name)
    for source in dockerfile.copied_sources((REPO / "Dockerfile").read_text()):
        if (REPO / source).is_dir():
            shutil.copytree(REPO / source, repo / source, ignore=ignore)
        else:
            (repo / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / source, repo / source)
    (tmp_path / "apt").mkdir()
    (tmp_path / "apt" / "sources.list").write_text("deb http://mirror.example/debian bookworm main\n")
    (tmp_path / "ca").mkdir()
    return Context(repo=repo, apt_dir=tmp_path / "apt", ca_dir=tmp_path / "ca")
