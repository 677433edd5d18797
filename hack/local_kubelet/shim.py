"""One container's process and its log writer: what a container runtime's shim does for a container.

Why a process of its own: the container's output has to be kept line by line with the time and the
stream of each line (the CRI log format, hack/local_kubelet/logfiles.py), so that `kubectl logs
--timestamps`, `--since` and `--tail` are answered as a kubelet answers them; that needs a reader of
the container's stdout and stderr. If the local kubelet read them itself, its crash would cut the
pipes and kill its containers, while a kubelet's crash leaves containers running (the next start
finds and ends them). So the kubelet starts this shim in a session of its own; the shim starts the
container's command in the same process group, copies its output to the container's log and to the
pod's journal, and exits with the container's exit code (128 + N when signal N ended it). A signal
to the group reaches the container; the shim itself waits on, so the log gets everything.

    python -m hack.local_kubelet.shim SPEC.json

SPEC.json (read, then removed; it holds the container's environment): command, env, cwd, log,
journal, prefix (put before each journal line: the container's name for all but the trainer).
Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Final

from hack.local_kubelet.logfiles import LINE_MAX, format_record

DRAIN_SECONDS: Final = 2.0  # after the command exits: what its children may still write through the pipes


class LogWriter:
    """Appends output to the container's CRI log and the pod's journal, one chunk at a time."""

    def __init__(self, log: Path, journal: Path, prefix: str) -> None:
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log.open("ab")
        self.journal = journal.open("ab")
        self.prefix = prefix.encode()
        self.lock = threading.Lock()
        self.line_start = True

    def write(self, stream: str, chunk: bytes) -> None:
        with self.lock:
            self.log.write(format_record(time.time_ns(), stream, chunk))
            self.log.flush()
            self.journal.write((self.prefix if self.line_start else b"") + chunk)
            self.journal.flush()
            self.line_start = chunk.endswith(b"\n")

    def copy(self, stream: str, pipe: IO[bytes]) -> None:
        for chunk in iter(lambda: pipe.readline(LINE_MAX), b""):
            self.write(stream, chunk)


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def run(spec: dict[str, Any]) -> int:
    writer = LogWriter(Path(spec["log"]), Path(spec["journal"]), str(spec.get("prefix", "")))
    # The group's SIGTERM is meant for the container; the shim outlives it to copy the last output.
    # A handler, not SIG_IGN: the command must not inherit an ignored SIGTERM.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda _signum, _frame: None)
    try:
        process = subprocess.Popen(
            [str(token) for token in spec["command"]],
            env={str(k): str(v) for k, v in spec["env"].items()},
            cwd=spec["cwd"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as error:
        writer.write("stderr", f"local kubelet: cannot start {spec['command'][0]}: {error}\n".encode())
        return 128
    assert process.stdout is not None
    assert process.stderr is not None
    readers = [
        threading.Thread(target=writer.copy, args=(name, pipe), daemon=True)
        for name, pipe in (("stdout", process.stdout), ("stderr", process.stderr))
    ]
    for reader in readers:
        reader.start()
    code = exit_status(process.wait())
    for reader in readers:
        reader.join(DRAIN_SECONDS)
    return code


def main(argv: list[str]) -> int:
    spec_path = Path(argv[1])
    spec = json.loads(spec_path.read_text())
    spec_path.unlink(missing_ok=True)
    return run(spec)


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    os._exit(code)  # the reader threads may still hold pipes a child of the command keeps open
