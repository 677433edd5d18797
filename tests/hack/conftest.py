"""Fixtures of the tests of hack/: a throwaway second dev cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Kubectl
from tests.hack.clusters import dev_cluster


@pytest.fixture
def scratch_dir(tmp_path: Path, cluster: Kubectl) -> Iterator[Path]:
    """A second dev directory; whatever a test starts there is stopped afterwards."""
    dev_dir = tmp_path / "dev"
    try:
        yield dev_dir
    finally:
        dev_cluster("down", dev_dir=dev_dir, check=False)
