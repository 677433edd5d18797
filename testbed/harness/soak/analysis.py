"""Whether the operator's memory levelled off during a soak, from its samples: a pure rule, tested
without a cluster (testbed/tests/test_soak_analysis.py).

The rule: split the samples after the warm-up (the first third) into two halves of time; RSS levelled
off when the median of the later half exceeds the median of the earlier half by no more than
`tolerance_mb` (a leak keeps growing: each later window sits above the earlier one; a cache that has
reached its working set does not).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sample:
    seconds: float  # since the start of the churn
    rss_mb: float
    cpu_seconds: float
    jobs_created: int


@dataclass(frozen=True)
class Verdict:
    levelled_off: bool
    earlier_mb: float
    later_mb: float
    growth_mb: float


def level_off(samples: Sequence[Sample], tolerance_mb: float = 5.0) -> Verdict:
    """The rule above; too few samples (under 6) never count as levelled off."""
    if len(samples) < 6:
        return Verdict(False, 0.0, 0.0, 0.0)
    settled = samples[len(samples) // 3 :]
    half = len(settled) // 2
    earlier = statistics.median(sample.rss_mb for sample in settled[:half])
    later = statistics.median(sample.rss_mb for sample in settled[half:])
    growth = later - earlier
    return Verdict(growth <= tolerance_mb, round(earlier, 1), round(later, 1), round(growth, 1))


def summary(samples: Sequence[Sample]) -> dict[str, Any]:
    """Start, peak and end RSS, CPU used, and the CPU share of one core over the churn."""
    if not samples:
        return {}
    first, last = samples[0], samples[-1]
    elapsed = max(last.seconds - first.seconds, 1e-9)
    return {
        "rss_mb": {
            "start": round(first.rss_mb, 1),
            "peak": round(max(sample.rss_mb for sample in samples), 1),
            "end": round(last.rss_mb, 1),
        },
        "cpu_seconds": round(last.cpu_seconds - first.cpu_seconds, 1),
        "cpu_percent_of_one_core": round(100 * (last.cpu_seconds - first.cpu_seconds) / elapsed, 1),
        "seconds": round(elapsed),
    }
