"""Every violation the fuzzer found, as the minimal manifest it shrank to, checked on the real cluster.

Each file in tests/fuzz/regressions/ holds one manifest (`make fuzz` writes new ones to
tests/fuzz/findings/ in the same shape; move them here). The test creates it alone in a namespace of
its own with the operator running and checks the fuzz property for it: a clear outcome with an Event,
no ERROR line or traceback, writes within budget (tests/fuzz/harness.py, `violations_of`). A file
with a `refused` entry was fixed at admission: it must now be refused. A file
with an `xfail` entry records a defect not fixed yet: the test is expected to fail, and fails the
run once the defect is fixed (strict), so the entry is then removed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import Kubectl
from tests.cluster import DEV
from tests.e2e.operator import running_operator
from tests.fuzz.cluster_api import ApiServer
from tests.fuzz.conftest import OPERATOR_NAMESPACE
from tests.fuzz.harness import WRITE_WINDOW, FuzzRun

REGRESSIONS = Path(__file__).parent / "regressions"
DEADLINE = 60.0


def _cases() -> list[Any]:
    cases = []
    for path in sorted(REGRESSIONS.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        marks = [pytest.mark.xfail(reason=record["xfail"], strict=True)] if record.get("xfail") else []
        cases.append(pytest.param(record, id=path.stem, marks=marks))
    return cases


@pytest.fixture(scope="module")
def fuzz(
    cluster: Kubectl, fuzz_operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FuzzRun]:
    api = ApiServer(DEV / "kubeconfig")
    args = (f"--lease-namespace={OPERATOR_NAMESPACE}", "--log-level=INFO")
    log_dir = tmp_path_factory.mktemp("fuzz-regressions")
    try:
        with running_operator(fuzz_operator_kubeconfig, log_dir, *args, name="regressions") as operator:
            yield FuzzRun(api, operator, deadline=DEADLINE)
    finally:
        api.close()


@pytest.mark.parametrize("record", _cases())
def test_a_manifest_the_fuzzer_found_gets_a_clear_outcome(fuzz: FuzzRun, record: dict[str, Any]) -> None:
    watch = WRITE_WINDOW if record["violation"] == "write-budget" else 0.0
    accepted, kinds = fuzz.check_alone(record["manifest"], DEADLINE, watch_writes=watch)
    if record.get("refused"):
        # Fixed at admission: the schema now refuses what used to reach the operator.
        assert not accepted, record["refused"]
        return
    assert accepted, f"refused at admission: {record.get('detail')}"
    assert not kinds, f"{sorted(kinds)} (found as {record['violation']}: {record.get('detail')})"
    assert fuzz.operator.alive()
