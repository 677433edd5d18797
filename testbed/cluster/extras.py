"""Dev processes that belong with the cluster: `run <name> -- <command...>` and `stop <name>`.

Why: the demo's operator must outlive the command that started it, yet never outlive the cluster.
`run` records such processes in state.json by pid and kernel start time (their output in
`.dev/logs/<name>.log`), `down` stops them before the components, and running the same name and
command again while it runs is a no-op, so scripts can call it again.
"""

from __future__ import annotations

import os
import time
from typing import Any

from testbed.cluster.lifecycle import EXTRA_STOP_TIMEOUT
from testbed.cluster.processes import stop_processes, wait_for
from testbed.cluster.state import (
    COMPONENTS,
    EXTRA_NAME,
    LOGS,
    NODE_COMPONENTS,
    OPTIONAL_PROCESSES,
    cluster_lock,
    read_state,
    say,
    write_state,
)
from testbed.common import ToolError, http_ok, process_start_time, start_logged, still_running


def run_extra(name: str, command: list[str], wait_http: str | None, timeout: float, replace: bool) -> None:
    """Starts `command` as the registered dev process `name` (a no-op when it already runs it), then
    optionally waits until `wait_http` answers 200."""
    if (
        name in COMPONENTS
        or name in OPTIONAL_PROCESSES
        or name in NODE_COMPONENTS
        or not EXTRA_NAME.match(name)
    ):
        raise ToolError(
            f"{name!r} cannot name a dev process (lower-case letters, digits, dashes; no component)"
        )
    if not command:
        raise ToolError("no command given: `run <name> -- <command...>`")
    with cluster_lock():
        state = read_state()
        if state is None:
            raise ToolError("the dev cluster is not running; start it with `hack/dev-cluster.sh up`")
        extras: dict[str, Any] = state.setdefault("extras", {})
        current = extras.get(name)
        if current and still_running(current) and current.get("command") == command and not replace:
            say(f"{name} is already running (pid {current['pid']}); log {current['log']}")
        else:
            if current and still_running(current):
                if not replace:
                    raise ToolError(
                        f"{name} already runs another command (pid {current['pid']}): "
                        f"`hack/dev-cluster.sh stop {name}` first, or `run --replace`"
                    )
                say(f"stopping {name} (pid {current['pid']}) to replace it")
                stop_processes({name: current}, timeout=EXTRA_STOP_TIMEOUT)
            extras[name] = spawn_extra(name, command)
            write_state("extras", extras)
            say(f"started {name} (pid {extras[name]['pid']}); log {extras[name]['log']}")
        process = extras[name]
    if wait_http:
        wait_for(f"{name} at {wait_http}", lambda: http_ok(wait_http, expect=""), {name: process}, timeout)
        say(f"{name} is ready ({wait_http})")


def spawn_extra(name: str, command: list[str]) -> dict[str, Any]:
    log_path = LOGS / f"{name}.log"
    try:
        proc = start_logged(command, log_path, header=" ".join(command))
    except OSError as error:
        raise ToolError(f"cannot start {name}: {error}") from error
    return {
        "pid": proc.pid,
        "start_time": process_start_time(proc.pid),
        "command": command,
        "cwd": os.getcwd(),
        "log": str(log_path),
        "started": time.time(),
    }


def stop_extra(name: str) -> None:
    """Stops the dev process `name` (SIGTERM, SIGKILL after a grace period); a no-op when none runs."""
    with cluster_lock():
        state = read_state()
        extras: dict[str, Any] = (state or {}).get("extras", {})
        process = extras.pop(name, None)
        if process is None:
            say(f"{name} is not running")
            return
        stop_processes({name: process}, timeout=EXTRA_STOP_TIMEOUT)
        write_state("extras", extras)
        say(f"stopped {name}")
