"""make soak's verdict without a cluster: when the operator's RSS counts as levelled off."""

from __future__ import annotations

from testbed.harness.soak.analysis import Sample, level_off, summary


def series(*rss: float) -> list[Sample]:
    return [Sample(10.0 * index, value, 0.5 * index, 5 * index) for index, value in enumerate(rss)]


def test_memory_that_reaches_its_working_set_levels_off() -> None:
    verdict = level_off(series(60, 70, 75, 78, 79, 80, 80, 81, 80, 81, 80, 81))
    assert verdict.levelled_off
    assert verdict.growth_mb <= 1.0


def test_memory_that_keeps_growing_does_not() -> None:
    verdict = level_off(series(*(60 + 3 * index for index in range(12))))
    assert not verdict.levelled_off
    assert verdict.growth_mb > 5.0


def test_the_warm_up_does_not_count() -> None:
    # A steep first third (caches filling) and flat afterwards.
    assert level_off(series(20, 40, 60, 80, 80, 80, 81, 80, 80, 81, 80, 80)).levelled_off


def test_too_few_samples_never_count_as_levelled_off() -> None:
    assert not level_off(series(60, 60, 60)).levelled_off


def test_the_summary_has_start_peak_end_and_the_cpu_share() -> None:
    result = summary(series(60, 90, 70))
    assert result["rss_mb"] == {"start": 60.0, "peak": 90.0, "end": 70.0}
    assert result["cpu_seconds"] == 1.0
    assert result["cpu_percent_of_one_core"] == 5.0
