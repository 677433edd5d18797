"""What the Helm chart's unit tests share (tests/unit/test_helm_chart.py,
tests/unit/test_helm_release_names.py): every option's values merged, and the fixture of the chart
rendered by the pinned helm, which each test module binds to its own name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

from tests.helmchart import (
    OPTIONS,
    Helm,
    merged,
)

EVERY_OPTION: Final = merged(*OPTIONS.values())


@pytest.fixture(scope="module")
def chart(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm, tmp_path_factory.mktemp("helm"))
