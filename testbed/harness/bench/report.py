"""Running a bench to its end: its JSON result on stdout, one line for an error, clean-up always.

Why apart: `make bench` and `make bench-peer` end the same way: SIGTERM and SIGHUP count as Ctrl-C,
the result is printed (and kept in a file when asked), and the cluster and the operators are torn
down whatever happened, without a second Ctrl-C cutting that short.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Protocol

from controller.runtime.errors import KubeError
from testbed.common import JsonDict, ToolError
from testbed.harness.bench.operator import say


class Runnable(Protocol):
    def run(self) -> JsonDict: ...

    def down(self) -> None: ...


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


def run_to_end(run: Callable[[], int], down: Callable[[], None], say: Callable[[str], None]) -> int:
    """Runs a tool to its end: `run`'s exit code; one line and exit code 2 for an error (a ToolError, a
    refused API request), 130 when interrupted (SIGTERM and SIGHUP count as Ctrl-C); `down` always,
    and a second Ctrl-C cannot cut it short. (`make chaos`, `make soak`.)"""
    with signals_as_interrupts():
        try:
            return run()
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
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            down()


def execute(bench: Runnable, keep: Path | None = None) -> int:
    """Runs `bench`, prints its result with `all_targets_met` (also into `keep`); the exit code."""
    code = 0
    with signals_as_interrupts():
        try:
            result = bench.run()
            result["all_targets_met"] = all(t["met"] for t in result["targets"])
            text = json.dumps(result, indent=2)
            if keep is not None:
                keep.write_text(text + "\n")
            print(text, flush=True)
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
