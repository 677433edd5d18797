"""Whether the machine is quiet enough to measure on: its load average, and other test or benchmark
processes that share its cores.

Why: the bench's figures (seconds to Running, CPU seconds of a busy control plane) are only worth
comparing when nothing else competes for the cores. A test suite or another bench started by someone
else during a run makes that run's figures another machine's; the bench waits for them to end before
a run and notes any that ran during it (testbed/harness/bench/peer.py runs such a run again).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

# Command-line words of the processes that make a run's figures another machine's.
BUSY_MARKERS: Final = ("pytest", "testbed.harness.bench")


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def ancestors(pid: int) -> set[int]:
    """`pid` and the processes it descends from (up to init)."""
    chain = {pid}
    parent = _parent(pid)
    while parent and parent not in chain:
        chain.add(parent)
        parent = _parent(parent)
    return chain


def busy_processes(markers: Iterable[str] = BUSY_MARKERS, own: int | None = None) -> list[str]:
    """Other processes whose command line holds one of `markers` ("pid: command line"): neither this
    process, nor what it descends from (make, a shell, the test that started it), nor what it started."""
    own = os.getpid() if own is None else own
    mine = ancestors(own)
    words = tuple(markers)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid in mine or own in ancestors(pid):
            continue
        command = _command_line(pid)
        if command and any(word in command for word in words):
            found.append(f"{pid}: {command[:160]}")
    return found


def load_average() -> float:
    """The machine's 1-minute load average."""
    return os.getloadavg()[0]
