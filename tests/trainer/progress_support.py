"""What the progress helper's tests share (tests/trainer/test_progress_*.py): the log warnings a test
caught, and where a report goes.
"""

from __future__ import annotations

import pytest

POD_PATH = "/api/v1/namespaces/ml-training/pods/mnist-worker-0"
DEADLINE = 10.0


def warnings_from(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trainingjob_progress" and r.levelno >= 30]
