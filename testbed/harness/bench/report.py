"""Running a bench to its end: its JSON result on stdout, one line for an error, clean-up always.

Why apart: `make bench` and `make bench-peer` end the same way: SIGTERM and SIGHUP count as Ctrl-C,
the result is printed (and kept in a file when asked), and the cluster and the operators are torn
down whatever happened, without a second Ctrl-C cutting that short (testbed/harness/base.py's
signals; chaos, soak and bench-status end with its `run_to_end`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from controller.runtime.errors import KubeError
from testbed.common import JsonDict, ToolError
from testbed.harness.base import ignore_interrupts, signals_as_interrupts
from testbed.harness.bench.operator import say


class Runnable(Protocol):
    def run(self) -> JsonDict: ...

    def down(self) -> None: ...


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
            ignore_interrupts()
            bench.down()
    return code
