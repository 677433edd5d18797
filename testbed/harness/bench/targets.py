"""What the bench promises (docs/bench.md), and whether a run kept each promise.

Why apart: the targets are the bench's contract with its readers; the numbers sit here, next to the
one function that judges a run's figures against them.
"""

from __future__ import annotations

from typing import Final

from testbed.common import JsonDict
from testbed.harness.bench.options import Options

TARGET_BRING_UP_SECONDS: Final = 60.0
TARGET_WRITES_PER_MINUTE: Final = 0.0
TARGET_IDLE_CPU_PERCENT: Final = 2.0
TARGET_RSS_MB: Final = 150.0


def check(name: str, value: float | None, target: float, unit: str, strict: bool = True) -> JsonDict:
    """One target: `value` below `target` (or at most, when not `strict`); None is never met."""
    met = value is not None and (value < target if strict else value <= target)
    return {
        "name": name,
        "value": value,
        "target": f"{'<' if strict else '<='} {target:g} {unit}",
        "met": met,
    }


def targets(
    options: Options, bring_up: JsonDict, steady: JsonDict, memory: JsonDict | None
) -> list[JsonDict]:

    pods = bring_up["seconds_to_all_pods_created"]
    jobs = bring_up["seconds_to_all_jobs_running"]
    result = [
        check(f"all {options.pods} pods created", pods, TARGET_BRING_UP_SECONDS, "s"),
        check(f"all {options.jobs} jobs Running", jobs, TARGET_BRING_UP_SECONDS, "s"),
        check(
            "API writes per minute at steady state",
            steady["writes_per_minute"],
            TARGET_WRITES_PER_MINUTE,
            "/min",
            False,
        ),
        check("idle CPU, % of one core", steady["cpu_percent_of_one_core"], TARGET_IDLE_CPU_PERCENT, "%"),
    ]
    if memory is not None:
        result.append(
            check(
                f"RSS with {memory['jobs']} jobs and {memory['pods']} pods cached",
                memory["rss_mb"],
                TARGET_RSS_MB,
                "MB",
            )
        )
    return result
