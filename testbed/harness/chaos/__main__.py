"""`make chaos` (`python -m testbed.harness.chaos`): one run, its summary line on stdout; see the
package's docstring."""

from __future__ import annotations

import sys

from testbed.harness.base import run_to_end
from testbed.harness.chaos.audit import summary_line
from testbed.harness.chaos.options import parse_options
from testbed.harness.chaos.run import Chaos, say


def main(argv: list[str] | None = None) -> int:
    chaos = Chaos(parse_options(argv))

    def run() -> int:
        report = chaos.run()
        print(summary_line(report), flush=True)
        return 0 if report["passed"] else 1

    return run_to_end(run, chaos.down, say)


if __name__ == "__main__":
    sys.exit(main())
