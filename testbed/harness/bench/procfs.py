"""CPU seconds and memory of processes and of the machine, read from /proc.

Why: the bench reports what the operator and the control plane's components cost (CPU seconds, peak
RSS) and how busy the machine was, without any tool besides the kernel's own accounting.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcSample:
    """CPU seconds (user + system) and memory of one process, read from /proc."""

    cpu_seconds: float
    rss_mb: float
    peak_rss_mb: float


def proc_sample(pid: int) -> ProcSample:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    memory: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            memory[key] = int(value.split()[0]) / 1024  # kB -> MiB
    return ProcSample(cpu, memory.get("VmRSS", 0.0), memory.get("VmHWM", 0.0))


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return float(total - idle), float(total)


def cpu_pressure() -> float | None:
    """Share of the last 60 s in which some runnable task waited for a CPU (/proc/pressure/cpu), in %."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = dict(part.split("=", 1) for part in first.split()[1:])
    return float(fields["avg60"]) if "avg60" in fields else None


def busy_cores(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Average number of busy cores between two `machine_busy` samples."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return round((os.cpu_count() or 1) * busy / total, 2) if total > 0 else 0.0


def component_pids(dev_dir: Path) -> dict[str, int]:
    try:
        state = json.loads((dev_dir / "run" / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return {name: int(proc["pid"]) for name, proc in state.get("processes", {}).items()}


def component_cpu(pids: dict[str, int]) -> dict[str, float]:
    cpu: dict[str, float] = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError, IndexError, ValueError):
            cpu[name] = proc_sample(pid).cpu_seconds
    return cpu
