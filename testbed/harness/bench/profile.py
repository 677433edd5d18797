"""`make bench --profile`: where the operator's CPU goes during the bring-up, sampled by py-spy.

Why py-spy and not cProfile: the operator's work happens on its worker, informer and Event threads,
and cProfile sees only the thread that enabled it; it also slows every call it counts. py-spy samples
the Python stack of the thread holding the GIL from outside the process (ptrace), so the operator runs
unmodified, threads blocked on the API server do not count, and the profile covers exactly the
bring-up. The folded stacks are kept beside the operator's log (open
them in speedscope or inferno); the bench's JSON gets the functions with the most samples, counted
both where the sample was taken (self) and anywhere on the stack (total).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Final

from testbed.common import JsonDict, ToolError

SAMPLES_PER_SECOND: Final = 100
TOP: Final = 15
_FOLDED_LINE: Final = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")


def py_spy() -> str:
    """The py-spy binary of the bench's environment (setup.cfg's dev extra): next to its interpreter
    (`make bench` runs the venv's python without the venv on PATH), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.is_file() else shutil.which("py-spy")
    if found is None:
        raise ToolError("py-spy is not installed: run `make venv` (it is in the dev extra of setup.cfg)")
    return found


class Profiler:
    """py-spy recording one process from `start` to `stop`, its folded stacks written to `output`."""

    def __init__(self, pid: int, output: Path) -> None:
        self.pid = pid
        self.output = output
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.output.parent.mkdir(parents=True, exist_ok=True)
        command = [
            py_spy(),
            "record",
            f"--pid={self.pid}",
            f"--rate={SAMPLES_PER_SECOND}",
            "--format=raw",
            f"--output={self.output}",
            "--gil",  # only the thread holding the GIL: where CPU goes, not threads waiting on sockets
            "--nonblocking",  # never pause the operator to read its stacks
        ]
        with (self.output.parent / "py-spy.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def stop(self, timeout: float = 60.0) -> JsonDict:
        """Ends the recording (py-spy writes its file on SIGINT) and summarises it."""
        if self.process is None:
            return {}
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None
        if not self.output.exists():
            return {"error": f"py-spy wrote no profile; see {self.output.parent / 'py-spy.log'}"}
        return summarise(self.output.read_text(encoding="utf-8", errors="replace"))


def summarise(folded: str, top: int = TOP) -> JsonDict:
    """The functions with the most samples in py-spy's folded stacks ("a;b;c 12" per line): `self`
    counts the innermost frame, `total` every function once per stack it appears in."""
    own: Counter[str] = Counter()
    anywhere: Counter[str] = Counter()
    samples = 0
    for line in folded.splitlines():
        match = _FOLDED_LINE.match(line.strip())
        if match is None:
            continue
        count = int(match["count"])
        frames = [_function(frame) for frame in match["stack"].split(";") if frame]
        if not frames:
            continue
        samples += count
        own[frames[-1]] += count
        for function in set(frames):
            anywhere[function] += count

    def share(counter: Counter[str]) -> list[JsonDict]:
        return [
            {"function": name, "samples": count, "percent": round(100 * count / max(1, samples), 1)}
            for name, count in counter.most_common(top)
        ]

    return {"samples": samples, "self": share(own), "total": share(anywhere)}


def _function(frame: str) -> str:
    """`name (path/to/module.py:123)` -> `name (module.py)`: one entry per function, not per line."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({Path(path).name})" if path else name
