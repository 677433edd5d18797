"""Fixtures of the progress helper's tests (tests/trainer/test_progress_*.py): the fake API server a
Reporter patches, and a service-account token file.

tests/trainer/test_real_training.py brings its own `api` (one pod path per worker), which wins there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.trainer.progress_support import POD_PATH
from tests.unit import fakeapi
from tests.unit.fakeapi import FakeApi, Reply


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with fakeapi.running() as server:
        server.default("PATCH", POD_PATH, Reply(200, {"kind": "Pod"}))
        yield server


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("token-1\n")
    return path
