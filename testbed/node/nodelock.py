"""The machine's real-node lock, held by a node that `hack/dev-cluster.sh up` starts, for its whole life.

Why: the machine has one real node, and whoever runs it holds `<tmp>/trainingjob-operator-real-node.lock`
(a test session from its first real-node test until it exits, tests/sessions.py; `make bench-recovery`
for its run). A node started by `up --with real-node` outside those lives longer than the command that
started it, so a small holder process (`hold`, in a process of its own) takes the lock before the node
starts and keeps it until `remove real-node` or `down` has taken the node down and undone what it
changed on the machine (realnode.undo_host stops it last). Another holder makes `up` refuse in one
line that names it, before anything is changed; a test session that finds a dev node's holder waits,
naming it. The holder is recorded with the node (state.json's and the machine's record), so a node
killed without its `down` has its holder stopped by the next `up` that reclaims what it left.

When the caller holds the lock already (a test session or the bench that runs `up`: the holder's pid
is an ancestor of this process; `flock <lock> hack/dev-cluster.sh up ...`: the lock's open file is
inherited), the holder waits for it and takes it over if the caller lets go while the node still runs
(a session that keeps its cluster, TJ_KEEP_CLUSTER=1). Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, Final

from testbed.common import REPO, ToolError, process_start_time, still_running
from testbed.node import nodeconfig, nodehost

# TJ_REAL_NODE_LOCK moves it (the testbed's tests hold a scratch one); tests/sessions.py reads the same.
LOCK: Final = Path(
    os.environ.get("TJ_REAL_NODE_LOCK") or Path(tempfile.gettempdir()) / "trainingjob-operator-real-node.lock"
)
# The holder's modes: TAKE the lock now, or WAIT for the caller that holds it to let go.
TAKE: Final = "take"
WAIT: Final = "wait"
# The holder's first line on stdout: HELD (TAKE), WAITING (WAIT), or BUSY and the holder's line.
HELD: Final = "held"
WAITING: Final = "waiting"
BUSY: Final = "busy"
# The holder looks for its node's processes every POLL seconds; gone for GONE_FOR, it lets go.
POLL: Final = 10.0
GONE_FOR: Final = 60.0
# containerd, the node's first process, starts seconds after the holder (the builds come before it).
START_WITHIN: Final = 600.0
HOLDER_PID: Final = re.compile(r"pid (\d+)\b")
# The holder process's program (`hold`; not `-m`: the package imports this module first).
HOLDER: Final = (
    "import sys; from pathlib import Path; from testbed.node.nodelock import hold; "
    "sys.exit(hold(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]))"
)


class RealNodeHeld(ToolError):
    """Another session or node holds the machine's real node: an operational refusal (exit code 2)."""

    exit_code = 2


def holder_line(pid: int, dev: Path) -> str:
    """What the holder writes into the lock file: what tests/sessions.py and `up` show as its holder."""
    return (
        f"pid {pid}: the real node of the cluster in {dev}, started by hack/dev-cluster.sh up (down ends it)"
    )


def holder_pid(holder: str) -> int | None:
    """The pid a holder's line names (every holder writes `pid N` first), or None."""
    match = HOLDER_PID.match(holder.strip())
    return int(match.group(1)) if match else None


def held_by_caller(holder: str, ancestors: Iterable[int]) -> bool:
    """Whether the lock's holder is one of the processes this one runs under (a test session's
    fixture, the bench, running `up`): their node is theirs to start."""
    pid = holder_pid(holder)
    return pid is not None and pid in set(ancestors)


def refusal(holder: str) -> str:
    return (
        f"the machine's real node is held by another session or node ({holder}); wait for it to end, "
        f"or take that node down (`hack/dev-cluster.sh down` in its cluster); lock {LOCK}"
    )


def ancestors(pid: int | None = None) -> list[int]:
    """This process's parent, its parent's parent, ... up to init."""
    found: list[int] = []
    current = os.getpid() if pid is None else pid
    while current > 1:
        try:
            stat = Path(f"/proc/{current}/stat").read_text()
        except OSError:
            break
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent <= 0 or parent in found:
            break
        found.append(parent)
        current = parent
    return found


def inherited_lock(lock: Path = LOCK) -> bool:
    """Whether this process holds the lock through an open file it inherited (`flock LOCK cmd`): its
    lock is then ours to take again without waiting."""
    for fd_link in Path("/proc/self/fd").iterdir():
        try:
            if Path(os.readlink(fd_link)) != lock:
                continue
            fcntl.flock(int(fd_link.name), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (OSError, ValueError):
            continue
        return True
    return False


def current_holder(lock: Path = LOCK) -> str | None:
    """Who holds the lock now (its line), or None when it is free (it is not kept)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            return handle.read().strip() or "holder unknown"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def check(lock: Path = LOCK) -> bool:
    """Whether the caller holds the lock already (True) or it is free (False); RealNodeHeld (one
    line, naming the holder) when someone else holds it."""
    if inherited_lock(lock):
        return True
    holder = current_holder(lock)
    if holder is None:
        return False
    if held_by_caller(holder, ancestors()):
        return True
    raise RealNodeHeld(refusal(holder))


def claim(dev: Path, log: Path, lock: Path = LOCK) -> dict[str, Any]:
    """Starts the holder of the machine's lock for the node about to start; its record (pid, start
    time). When the caller holds the lock already (a test session, the bench, `flock`), the holder
    waits for it and takes it over when the caller lets go with the node still up (a session kept
    with TJ_KEEP_CLUSTER=1, a `flock LOCK hack/dev-cluster.sh up` without `down`). RealNodeHeld
    (one line, naming the holder) when someone else holds it."""
    mode = WAIT if check(lock) else TAKE
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(lock), str(dev), mode],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=output,
            start_new_session=True,  # not ended with the `up` that started it, nor by its Ctrl-C
            text=True,
        )
    assert process.stdout is not None
    said = process.stdout.readline().strip()
    process.stdout.close()
    if said not in (HELD, WAITING):
        process.wait()
        raise RealNodeHeld(refusal(said.removeprefix(BUSY).strip() or "holder unknown"))
    return {"pid": process.pid, "start_time": process_start_time(process.pid)}


def release(record: dict[str, Any] | None, timeout: float = 10.0) -> None:
    """Stops the holder (after the node is gone): the lock is free once it has exited."""
    if not record or not still_running(record):
        return
    pid = int(record["pid"])
    os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # our child when the `up` that started it failed: reaped here
        return
    deadline = time.monotonic() + timeout
    while still_running(record) and time.monotonic() < deadline:
        time.sleep(0.05)
    if still_running(record):
        os.kill(pid, signal.SIGKILL)


def hold(lock: Path, dev: Path, mode: str = TAKE) -> int:
    """The holder: takes the lock (TAKE: at once, or says who has it; WAIT: once the caller that holds
    it lets go), then keeps it until SIGTERM."""
    handle: IO[str] = lock.open("a+")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if mode == WAIT:
        print(WAITING, flush=True)
        sys.stdout.close()
        fcntl.flock(handle, fcntl.LOCK_EX)
    else:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            print(f"{BUSY} {handle.read().strip() or 'holder unknown'}", flush=True)
            return 2
    handle.seek(0)
    handle.truncate()
    handle.write(holder_line(os.getpid(), dev) + "\n")
    handle.flush()
    if mode == TAKE:
        print(HELD, flush=True)
        sys.stdout.close()
    watch_the_node(node_processes)
    return 0


def watch_the_node(
    processes: Callable[[], bool | None],
    poll: float = POLL,
    gone_for: float = GONE_FOR,
    start_within: float = START_WITHIN,
) -> None:
    """Returns once the node, having run, has had no process for `gone_for` seconds, or never ran
    within `start_within`: a node killed without its `down` (a cancelled CI job, an `up` killed
    before the node started) then frees the machine's lock, and the next `up` undoes what it left; a
    `down` ends the holder itself, after the node is gone. `processes` says whether the node has any
    (None: could not tell)."""
    began = time.monotonic()
    seen = False
    gone_since: float | None = None
    while True:
        running = processes()
        now = time.monotonic()
        if running:
            seen, gone_since = True, None
        elif running is not None and seen:
            gone_since = now if gone_since is None else gone_since
            if now - gone_since >= gone_for:
                return
        elif not seen and now - began >= start_within:
            return
        time.sleep(poll)


def node_processes() -> bool | None:
    """Whether a process runs in the real node's cgroups (None while one of them is being removed)."""
    try:
        return bool(nodehost.cgroup_pids([nodeconfig.CGROUP_ROOT, nodeconfig.RUNTIME_CGROUP]))
    except OSError:
        return None
