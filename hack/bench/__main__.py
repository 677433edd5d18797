"""`make bench` (`python -m hack.bench`): one run, its JSON on stdout; see the package's docstring."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from types import FrameType

from controller.runtime.errors import KubeError
from hack.bench.operator import say
from hack.bench.options import parse_options
from hack.bench.phases import Bench
from hack.common import ToolError


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run like Ctrl-C does, so the clean-up runs."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    bench = Bench(options)
    code = 0
    with signals_as_interrupts():
        try:
            result = bench.run()
            result["all_targets_met"] = all(t["met"] for t in result["targets"])
            print(json.dumps(result, indent=2), flush=True)
        except ToolError as error:
            say(f"error: {error}")
            code = 1
        except KubeError as error:
            say(f"error: API request failed: {error}")
            code = 1
        except KeyboardInterrupt:
            say("interrupted")
            code = 130
        finally:
            # A second Ctrl-C must not cut the clean-up short; children inherit the ignore.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            bench.down()
    return code


if __name__ == "__main__":
    sys.exit(main())
