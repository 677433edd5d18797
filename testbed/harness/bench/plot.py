"""`make bench-curve`'s plots (`python -m testbed.harness.bench.plot RESULT.json ...`): each figure of the
side-by-side bench against the job count, for every operator, as PNG files for docs/bench.md.

Why: how a figure grows with the work (linearly, or faster) is seen at a glance on a curve and hardly
in a table of medians. The results of several `make bench-peer` runs can be combined (the 5,000-job
runs take hours and may come from a run of their own): their runs are grouped by job count and the
medians computed again (testbed/harness/bench/comparison.py). Each plot shows the median per job count as a
line
and every compared run as a dot; the work queue's depth is plotted over time instead, one panel per
job count. matplotlib is a dev dependency (setup.cfg), imported only here; its object API draws
without pyplot's global state or a display.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from matplotlib.figure import Figure

from testbed.common import REPO, JsonDict
from testbed.harness.bench.comparison import KUBEFLOW_TUNED, OURS, compared, curve, figures, summarize_size

COLOURS: Final = {OURS: "tab:blue", KUBEFLOW_TUNED: "tab:orange"}
# One PNG per entry: its file name, title, y label, and the figures it draws (a line each).
PLOTS: Final[tuple[tuple[str, str, str, tuple[str, ...]], ...]] = (
    ("time-to-running", "Time to all jobs Running", "seconds", ("seconds_to_all_jobs_running",)),
    (
        "time-per-job",
        "Time to all jobs Running, per job",
        "seconds per job",
        ("seconds_per_job_to_all_jobs_running",),
    ),
    (
        "cluster-cpu",
        "Cluster CPU per job (control plane + operator)",
        "CPU seconds per job",
        ("cluster_cpu_seconds_per_job",),
    ),
    ("operator-cpu", "Operator CPU per job", "CPU seconds per job", ("operator_cpu_seconds_per_job",)),
    ("peak-rss", "Operator peak RSS", "MB", ("operator_peak_rss_mb",)),
    (
        "created-to-pods",
        "Job created -> all its pods created",
        "seconds",
        ("job_created_to_all_pods_created_p50", "job_created_to_all_pods_created_p99"),
    ),
    (
        "running-to-job",
        "Last pod Running -> job Running",
        "seconds",
        ("last_pod_running_to_job_running_p50", "last_pod_running_to_job_running_p99"),
    ),
)


def load_sizes(paths: Sequence[Path]) -> list[JsonDict]:
    """The runs of every result, grouped by job count, with their medians computed again."""
    runs_by_jobs: dict[int, list[JsonDict]] = {}
    for path in paths:
        result = json.loads(path.read_text())
        for size in result.get("sizes") or []:
            runs_by_jobs.setdefault(int(size["jobs"]), []).extend(size["runs"])
    return [
        {"jobs": jobs, "runs": runs, **summarize_size(jobs, runs)}
        for jobs, runs in sorted(runs_by_jobs.items())
    ]


def _contenders(sizes: Sequence[JsonDict]) -> list[str]:
    labels = dict.fromkeys(run["contender"] for size in sizes for run in size["runs"])
    return sorted(labels, key=lambda label: (label != OURS, label))


def plot_figure(axes: Any, sizes: Sequence[JsonDict], names: tuple[str, ...]) -> None:
    """Each contender's median per job count as a line (dashed for a second figure, such as p99), and
    every compared run as a dot."""
    shape = curve(sizes)["by_contender"]
    for label in _contenders(sizes):
        colour = COLOURS.get(label)
        for position, name in enumerate(names):
            points = sorted(
                (int(jobs), value) for jobs, value in (shape.get(label, {}).get(name) or {}).items()
            )
            points = [(jobs, value) for jobs, value in points if value is not None]
            if not points:
                continue
            suffix = f" ({name.rsplit('_', 1)[1]})" if len(names) > 1 else ""
            axes.plot(
                [jobs for jobs, _ in points],
                [value for _, value in points],
                marker="o",
                linestyle="-" if position == 0 else "--",
                color=colour,
                label=f"{label}{suffix}",
            )
            for size in sizes:
                runs = [run for run in compared(size["runs"]) if run["contender"] == label]
                values = [value for run in runs if (value := figures(run).get(name)) is not None]
                axes.scatter([size["jobs"]] * len(values), values, s=12, color=colour, alpha=0.5)
    axes.set_xlabel("jobs (x 4 pods)")
    axes.grid(True, alpha=0.3)
    _legend(axes)


def _legend(axes: Any) -> None:
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")


def plot_queue_depth(figure: Any, sizes: Sequence[JsonDict]) -> None:
    """The work queue's depth over the bring-up, one panel per job count, the first compared run of
    each contender."""
    panels = figure.subplots(1, len(sizes), squeeze=False)[0]
    for axes, size in zip(panels, sizes, strict=True):
        for label in _contenders([size]):
            run = next((run for run in compared(size["runs"]) if run["contender"] == label), None)
            samples = ((run or {}).get("bring_up", {}).get("work_queue_depth") or {}).get("samples") or []
            if samples:
                axes.plot(
                    [at for at, _ in samples],
                    [depth for _, depth in samples],
                    color=COLOURS.get(label),
                    label=label,
                    linewidth=1,
                )
        axes.set_title(f"{size['jobs']} jobs", fontsize="medium")
        axes.set_xlabel("seconds since the first create")
        axes.grid(True, alpha=0.3)
        _legend(axes)
    panels[0].set_ylabel("work queue depth")


def write_plots(sizes: Sequence[JsonDict], directory: Path, prefix: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, title, unit, names in PLOTS:
        figure = Figure(figsize=(6.4, 4.2))
        axes = figure.subplots()
        plot_figure(axes, sizes, names)
        axes.set_title(title)
        axes.set_ylabel(unit)
        axes.set_ylim(bottom=0)
        path = directory / f"{prefix}{name}.png"
        figure.tight_layout()
        figure.savefig(path, dpi=90)
        written.append(path)
    figure = Figure(figsize=(4.2 * len(sizes), 4.2))
    plot_queue_depth(figure, sizes)
    figure.suptitle("Work queue depth during the bring-up")
    figure.tight_layout()
    path = directory / f"{prefix}queue-depth.png"
    figure.savefig(path, dpi=90)
    written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.harness.bench.plot",
        description="Plots of `make bench-peer` results against the job count.",
    )
    parser.add_argument(
        "results", nargs="+", type=Path, help="peer-result.json files (combined by job count)"
    )
    parser.add_argument(
        "--out", type=Path, default=REPO / "docs" / "bench", help="directory of the PNG files"
    )
    parser.add_argument("--prefix", default="curve-", help="file name prefix")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    sizes = load_sizes(args.results)
    if not sizes:
        parser.error("the results hold no runs")
    for path in write_plots(sizes, args.out, args.prefix):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
