"""`make bench` (`python -m testbed.harness.bench`): one run, its JSON on stdout; see the package's
docstring."""

from __future__ import annotations

import sys

from testbed.harness.bench.options import parse_options
from testbed.harness.bench.phases import Bench
from testbed.harness.bench.report import execute


def main(argv: list[str] | None = None) -> int:
    return execute(Bench(parse_options(argv)))


if __name__ == "__main__":
    sys.exit(main())
