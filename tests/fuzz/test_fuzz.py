"""The fuzz property on the real cluster: no generated TrainingJob can leave the operator without a
clear outcome, hurt it, or stop other jobs (issue 15; tests/fuzz/harness.py says what is checked).

`make test` runs a fixed-seed sample (FUZZ_EXAMPLES defaults to 100; docs/fuzz.md says how long); `make fuzz`
runs the long run (FUZZ_EXAMPLES=1700) and shrinks every kind of violation to a minimal manifest,
written to FUZZ_FINDINGS (tests/fuzz/findings/ by default) for tests/fuzz/regressions/. The summary
line is printed at the end of pytest's output.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testbed import Kubectl
from tests.cluster import DEV
from tests.e2e.operator import running_operator
from tests.fuzz.cluster_api import ApiServer
from tests.fuzz.conftest import OPERATOR_NAMESPACE, record_summary
from tests.fuzz.harness import FuzzRun
from tests.fuzz.manifests import generate
from tests.fuzz.shrink import save_findings, shrink_violations

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "100"))
SEED = int(os.environ.get("FUZZ_SEED", "15"))
SHRINK_SECONDS = float(os.environ.get("FUZZ_SHRINK_SECONDS", "0"))
FINDINGS = Path(os.environ.get("FUZZ_FINDINGS", Path(__file__).parent / "findings"))


def test_generated_manifests_all_get_a_clear_outcome(
    cluster: Kubectl, fuzz_operator_kubeconfig: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    items = generate(EXAMPLES, SEED)
    api = ApiServer(DEV / "kubeconfig")
    log_dir = Path(os.environ.get("FUZZ_LOG_DIR", tmp_path))
    args = (f"--lease-namespace={OPERATOR_NAMESPACE}", "--log-level=INFO")
    try:
        with running_operator(fuzz_operator_kubeconfig, log_dir, *args, name="fuzz-operator") as operator:
            fuzz = FuzzRun(api, operator)
            report = fuzz.run(items)
            summary = report.summary(SEED)
            record_summary(request.config, summary)
            if report.violations and SHRINK_SECONDS > 0:
                found = shrink_violations(fuzz, report.violations, SHRINK_SECONDS)
                for path in save_findings(found, FINDINGS):
                    record_summary(request.config, f"fuzz: minimal manifest written to {path}")
    finally:
        api.close()
    assert report.accepted > 0, summary
    if report.violations:
        shown = [f"{v.line()}\n  {json.dumps(v.manifest)[:1000]}" for v in report.violations[:20]]
        pytest.fail("\n".join([summary, *shown]), pytrace=False)
