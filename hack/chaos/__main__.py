"""`make chaos` (`python -m hack.chaos`): one run, its summary line on stdout; see the package's docstring."""

from __future__ import annotations

import signal
import sys

from controller.runtime.errors import KubeError
from hack.bench.report import signals_as_interrupts
from hack.chaos.audit import summary_line
from hack.chaos.options import parse_options
from hack.chaos.run import Chaos, say
from hack.common import ToolError


def main(argv: list[str] | None = None) -> int:
    chaos = Chaos(parse_options(argv))
    with signals_as_interrupts():
        try:
            report = chaos.run()
            print(summary_line(report), flush=True)
            return 0 if report["passed"] else 1
        except ToolError as error:
            say(f"error: {error}")
            return 2
        except KubeError as error:
            say(f"error: API request failed: {error}")
            return 2
        except KeyboardInterrupt:
            say("interrupted")
            return 130
        finally:
            # A second Ctrl-C must not cut the clean-up short.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            chaos.down()


if __name__ == "__main__":
    sys.exit(main())
