"""The curve's plots: results of several bench runs combined by job count, one PNG per figure."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.harness.bench.comparison import KUBEFLOW_TUNED, OURS
from testbed.harness.bench.plot import PLOTS, load_sizes, main
from testbed.tests.test_bench_peer import run


def result(jobs: int, *runs: dict[str, object]) -> dict[str, object]:
    return {"sizes": [{"jobs": jobs, "runs": list(runs)}]}


def test_results_are_combined_by_job_count_and_every_figure_gets_a_png(tmp_path: Path) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    small = [run(OURS, 0.3, 40, 6, 10, jobs=500), run(KUBEFLOW_TUNED, 0.3, 45, 7, 11, jobs=500)]
    for one in small:
        one["bring_up"]["work_queue_depth"] = {"samples": [[0.0, 3.0], [1.0, 9.0], [2.0, 0.0]]}
    first.write_text(json.dumps(result(500, *small)))
    large = [run(OURS, 0.3, 400, 60, 10, jobs=5000), run(KUBEFLOW_TUNED, 0.3, 600, 90, 11, jobs=5000)]
    second.write_text(json.dumps({"sizes": [{"jobs": 500, "runs": small}, {"jobs": 5000, "runs": large}]}))
    sizes = load_sizes([first, second])
    assert [size["jobs"] for size in sizes] == [500, 5000]
    assert sizes[0]["medians"][OURS]["runs"] == 2  # the 500-job runs of both files
    out = tmp_path / "plots"
    assert main([str(first), str(second), "--out", str(out), "--prefix", "c-"]) == 0
    written = sorted(path.name for path in out.iterdir())
    assert written == sorted([f"c-{name}.png" for name, *_ in PLOTS] + ["c-queue-depth.png"])
    assert all(path.read_bytes().startswith(b"\x89PNG") for path in out.iterdir())
