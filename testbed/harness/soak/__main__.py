"""`make soak` (`python -m testbed.harness.soak`): one run, its verdict line on stdout; see the
package's docstring."""

from __future__ import annotations

import sys
from typing import Any

from testbed.harness.base import run_to_end
from testbed.harness.soak.options import parse_options
from testbed.harness.soak.run import Soak, say


def verdict_line(report: dict[str, Any]) -> str:
    rss, median, churn = report["rss_mb"], report["rss_median_mb"], report["churn"]
    word = "levelled off" if report["levelled_off"] else "DID NOT level off"
    return (
        f"soak: RSS {word} (median {median['earlier']} -> {median['later']} MB over the later two "
        f"thirds, tolerance {report['tolerance_mb']} MB); RSS start {rss['start']} peak {rss['peak']} "
        f"end {rss['end']} MB; CPU {report['cpu_seconds']} s ({report['cpu_percent_of_one_core']}% of a "
        f"core) in {report['seconds']} s; jobs created {churn.get('created', 0)}, completed "
        f"{churn.get('completions', 0)}, rank failures {churn.get('rank_failures', 0)}, deleted "
        f"{churn.get('deleted', 0)}; stuck Terminating {report['stuck_terminating']}; "
        f"load {report['load_average']}"
    )


def main(argv: list[str] | None = None) -> int:
    soak = Soak(parse_options(argv))

    def run() -> int:
        report = soak.run()
        print(verdict_line(report), flush=True)
        return 0 if report["levelled_off"] and not report["stuck_terminating"] else 1

    return run_to_end(run, soak.down, say)


if __name__ == "__main__":
    sys.exit(main())
