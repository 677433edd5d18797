"""Starting, watching and stopping the dev cluster's processes, and its kubectl.

Why: the components are plain processes on 127.0.0.1, each recorded in state.json by pid and kernel
start time with its output in `.dev/logs/<name>.log`. A wait fails fast, naming the component and
the end of its log, when one exits while starting; a stop sends SIGTERM to each process group and
SIGKILL to what outlives the grace period, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from testbed.cluster.state import KUBECONFIG, LOGS, RUN, dead_components, say, write_state
from testbed.common import ToolError, process_start_time, start_logged, still_running, tail, wait_until

START_TIMEOUT: Final = 90.0
STOP_TIMEOUT: Final = 15.0


def spawn(
    name: str, binary: Path, args: list[str], processes: dict[str, Any], *, cwd: Path | None = None
) -> None:
    """Starts a component (in the run directory unless `cwd` says otherwise) and records it in
    `processes` and state.json."""
    log_path = LOGS / f"{name}.log"
    directory = cwd or RUN
    proc = start_logged(
        [str(binary), *args], log_path, header=f"{binary.name} {' '.join(args)}", cwd=directory
    )
    processes[name] = {
        "pid": proc.pid,
        "start_time": process_start_time(proc.pid),
        "binary": str(binary),
        "args": args,
        "log": str(log_path),
        **({"cwd": str(cwd)} if cwd else {}),
    }
    write_state("processes", processes)


def wait_for(
    what: str, check: Callable[[], bool], processes: dict[str, Any], timeout: float = START_TIMEOUT
) -> None:
    """Polls `check` until it holds; fails fast, naming the component and its log, if one died."""

    def none_dead() -> None:
        dead = dead_components({"processes": processes})
        if dead:
            log = Path(processes[dead[0]]["log"])
            raise ToolError(f"{dead[0]} exited while waiting for {what}; last lines of {log}:\n{tail(log)}")

    wait_until(what, check, timeout=timeout, guard=none_dead, hint=f"; logs in {LOGS}")


def stop_processes(processes: dict[str, Any], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM every process we started (newest first), then SIGKILL what is left after a grace period."""
    alive = {name: proc for name, proc in processes.items() if still_running(proc)}
    for name in reversed(list(alive)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(alive[name]["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        alive = {name: proc for name, proc in alive.items() if still_running(proc)}
        time.sleep(0.1)
    for name, proc in alive.items():
        say(f"{name} (pid {proc['pid']}) ignored SIGTERM for {timeout:.0f}s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc["pid"], signal.SIGKILL)
    deadline = time.monotonic() + STOP_TIMEOUT
    while any(still_running(p) for p in alive.values()) and time.monotonic() < deadline:
        time.sleep(0.1)


def kubectl(bin_dir: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    """The built kubectl with the admin kubeconfig; its stdout."""
    result = subprocess.run(
        [str(bin_dir / "kubectl"), "--kubeconfig", str(KUBECONFIG), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if check and result.returncode != 0:
        raise ToolError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout
