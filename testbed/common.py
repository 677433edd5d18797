"""What every program of the testbed needs: the repository's paths, progress lines, ports, processes, waiting.

Why one module: the dev cluster, the images, the demo and the bench each need a free port on
127.0.0.1, the kernel's start time of a process (a pid alone may be reused), a wait with a deadline, a
progress line with the elapsed time and a process started with its output in a log. Each used to carry
its own copy of these; one copy is what they share now.

Standard library only: testbed/cluster runs with the system's python3 before any project dependency
is installed. The programs run as modules from the repository (`python -m testbed.<program>`), so
`testbed.*` imports need no path set-up.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

JsonDict = dict[str, Any]

REPO: Final = Path(__file__).resolve().parent.parent
# The local cluster's state (kubeconfig, logs, run directory); TJ_DEV_DIR moves it (tests, the bench).
DEV: Final = Path(os.environ.get("TJ_DEV_DIR", REPO / ".dev"))


class ToolError(Exception):
    """A failure with a message meant for the person at the terminal: printed as one line, no traceback."""


def reader_gone() -> int:
    """What a command does once whoever reads its output has stopped (`hack/dev-cluster.sh status |
    head`): nothing more is written and no traceback is printed; the exit status is the one a shell
    gives a process ended by SIGPIPE. stdout goes to /dev/null, so the interpreter's last flush at
    exit has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + 13


class Say:
    """Prints progress lines `[<program> <m>m<ss>s] message`, timed from when it was made."""

    def __init__(self, program: str, *, stdout: bool = False) -> None:
        self.program = program
        self.stdout = stdout
        self.started = time.monotonic()

    def __call__(self, message: str) -> None:
        elapsed = int(time.monotonic() - self.started)
        stream = sys.stdout if self.stdout else sys.stderr
        print(f"[{self.program} {elapsed // 60:2d}m{elapsed % 60:02d}s] {message}", file=stream, flush=True)


# ------------------------------------------------------------------------------------------- ports


# Where the kernel's ephemeral range is not known: Linux's default is 32768-60999.
EPHEMERAL_RANGE_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS_FROM: Final = 10000


def listening_port_range(ephemeral_range: str | None = None) -> range:
    """The ports to listen on: from LISTEN_PORTS_FROM up to the kernel's ephemeral range, whose ports
    every outgoing connection takes its local port from. A port the kernel handed out there and a
    test released can be taken by any connection (hundreds a second, with a few clusters and
    operators running side by side) before the component meant for it binds it; below the range,
    only another listener can take it. Empty when the range starts too low to leave room."""
    try:
        text = ephemeral_range if ephemeral_range is not None else EPHEMERAL_RANGE_FILE.read_text()
        low = int(text.split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(LISTEN_PORTS_FROM, max(low, LISTEN_PORTS_FROM))


def free_ports(count: int) -> list[int]:
    """Distinct ports free on 127.0.0.1 now, below the ephemeral range (`listening_port_range`),
    chosen at random there (by the system's randomness: a test's seed does not make two processes
    choose alike); from the kernel's own choice where that range is too small."""
    candidates = listening_port_range()
    chooser = random.SystemRandom()
    sockets: list[socket.socket] = []
    try:
        attempts = 0
        while len(sockets) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            port = chooser.choice(candidates) if len(candidates) >= 100 * count else 0
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                attempts += 1
                if attempts > 1000:
                    raise
                continue
            sockets.append(sock)
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    (port,) = free_ports(1)
    return port


# --------------------------------------------------------------------------------------- processes


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/<pid>/stat); None if it is gone or a zombie.

    Together with the pid it identifies the process we started even if the pid is later reused.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return None if fields[0] == "Z" else fields[19]


def still_running(record: Mapping[str, Any]) -> bool:
    """A recorded process (`pid`, and `start_time` when known) is still the one that was started."""
    started = process_start_time(int(record["pid"]))
    return started is not None and started == record.get("start_time", started)


def start_logged(
    command: Sequence[str],
    log_path: Path,
    *,
    header: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Starts `command` in a session of its own (a signal to its group reaches its children), stdin
    closed, its output appended to `log_path` after a line `===== <local time> <header>`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"\n===== {time.strftime('%Y-%m-%dT%H:%M:%S')} {header}\n".encode())
        log.flush()
        return subprocess.Popen(
            list(command),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
            env=None if env is None else dict(env),
        )


def listening_addresses(pid: int, *, also_in_netns_of: int | None = None) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on, read from /proc (no external tools): in
    its own network namespace, and in that of `also_in_netns_of` (a process may hold a socket it made
    in another namespace, as the real node's API relay does)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    owners = [pid] if also_in_netns_of is None else [pid, also_in_netns_of]
    tables = [
        (f"/proc/{owner}/net/{name}", width) for owner in owners for name, width in (("tcp", 8), ("tcp6", 32))
    ]
    for table, width in tables:
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:
                continue
            address_hex, port_hex = local.split(":")
            raw = bytes.fromhex(address_hex)
            if width == 8:
                address = socket.inet_ntop(socket.AF_INET, raw[::-1])
            else:
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                address = socket.inet_ntop(socket.AF_INET6, words)
            found.add((address, int(port_hex, 16)))
    return found


def pid_running(pid: int) -> bool:
    """The process `pid` runs (neither gone nor a zombie)."""
    return process_start_time(pid) is not None


def in_private_mounts(setup: str, *command: str) -> list[str]:
    """`command` in a private mount namespace (`unshare`; a user namespace too when not run as root)
    after the shell snippet `setup` mounted what only it may see (a certificate over /etc, a private
    /tmp or /var/lib): nothing of it reaches the machine. `setup` gets the rest as "$@" and ends by
    running it (`exec "$@"`); a value it needs comes first, as "$1", and is `shift`ed off."""
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    user_namespace = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return [
        unshare,
        *user_namespace,
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        setup,
        "sh",
        *command,
    ]


def tail(path: Path, lines: int = 15) -> str:
    """The last `lines` lines of a log, for an error message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ------------------------------------------------------------------------------------------ waiting


def http_get(url: str, *, context: Any = None, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body) of a GET; status 0 with the error as body when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:  # noqa: S310
            return int(response.status), response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as error:
        return 0, str(error)


def http_ok(url: str, context: Any = None, expect: str = "ok") -> bool:
    """`url` answers 2xx with `expect` in its body (a health or readiness endpoint)."""
    status, body = http_get(url, context=context)
    return 200 <= status < 300 and expect in body


def wait_until(
    what: str,
    check: Callable[[], bool],
    *,
    timeout: float,
    interval: float = 0.2,
    guard: Callable[[], None] | None = None,
    progress: Callable[[], str] | None = None,
    say: Callable[[str], None] | None = None,
    every: float = 5.0,
    hint: str = "",
) -> None:
    """Polls `check` until it holds; ToolError after `timeout` seconds.

    `guard` runs before every poll and raises when waiting is pointless (a process it watches died).
    With `progress` and `say`, a progress line every `every` seconds; the timeout's message ends with
    the last progress line, then `hint`.
    """
    deadline = time.monotonic() + timeout
    next_report = time.monotonic() + every
    while True:
        if guard is not None:
            guard()
        if check():
            return
        now = time.monotonic()
        if now > deadline:
            last = f": {progress()}" if progress is not None else ""
            raise ToolError(f"timed out after {timeout:.0f}s waiting for {what}{last}{hint}")
        if progress is not None and say is not None and now >= next_report:
            say(progress())
            next_report = now + every
        time.sleep(interval)
