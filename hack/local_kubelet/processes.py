"""The trainer processes that stand in for pods' containers: started, signalled, awaited, logged.

Why apart: process supervision is the kubelet's container runtime here. Each process runs in its own
session (a signal reaches its children too), its output goes to <log-dir>/<ns>_<pod>.log (appended
across attempts, each start and exit marked), and a record in <state-dir>/processes/<uid>.json (pid
and kernel start time) lets the next start of the local kubelet find and kill what a crashed one left
behind. A thread per process waits for its exit and posts it to the kubelet's event queue.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hack.common import process_start_time
from hack.local_kubelet.volumes import TokenFile, write_private
from hack.podstatus import exit_code_of, log_tail_message, now_rfc3339

log = logging.getLogger("local-kubelet")


@dataclass(frozen=True)
class Launch:
    """What starting one pod's trainer takes, decided before anything runs."""

    uid: str
    namespace: str
    name: str
    job: str
    attempt: str
    command: list[str]
    env: dict[str, str]
    work: Path
    port: int
    notes: list[str]
    tokens: list[TokenFile]
    fallback_to_logs: bool


@dataclass
class Running:
    """One trainer process standing in for a pod's container."""

    uid: str
    namespace: str
    name: str
    job: str
    attempt: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int
    tokens: list[TokenFile]
    token_minted: float
    fallback_to_logs: bool
    stopping: str | None = None  # why SIGTERM was sent: "deleted" or "shutdown"
    kill_at: float | None = None


@dataclass
class Exited:
    uid: str
    returncode: int


class Supervisor:
    """The running trainers by pod uid, their logs and their records."""

    def __init__(self, log_dir: Path, records: Path, exits: queue.Queue[Any]) -> None:
        self.log_dir = log_dir
        self.records = records
        self.exits = exits
        self.running: dict[str, Running] = {}

    def log_path(self, namespace: str, pod: str) -> Path:
        """Where a pod's container output goes (what `kubectl logs` would show)."""
        return self.log_dir / f"{namespace}_{pod}.log"

    def spawn(self, launch: Launch) -> None:
        log_path = self.log_path(launch.namespace, launch.name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as handle:
            header = [
                f"{now_rfc3339()} local kubelet: pod {launch.namespace}/{launch.name} "
                f"(uid {launch.uid}, attempt {launch.attempt})",
                f"command: {' '.join(launch.command)}",
                f"MASTER_ADDR=127.0.0.1 MASTER_PORT={launch.port}; TRAIN_SIMULATE=1 (the reference trainer's "
                "pure-Python simulation: no torch, nothing listens)",
                *(f"skipped: {note}" for note in launch.notes),
            ]
            handle.write("".join(f"===== {line}\n" for line in header).encode())
            handle.flush()
            offset = handle.tell()  # the termination message comes from the trainer's output only
            process = subprocess.Popen(
                launch.command,
                env=launch.env,
                cwd=launch.work,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        record = {
            "namespace": launch.namespace,
            "name": launch.name,
            "pid": process.pid,
            "start_time": process_start_time(process.pid),
        }
        write_private(self.records / f"{launch.uid}.json", json.dumps(record).encode())
        self.running[launch.uid] = Running(
            uid=launch.uid,
            namespace=launch.namespace,
            name=launch.name,
            job=launch.job,
            attempt=launch.attempt,
            process=process,
            log_path=log_path,
            log_offset=offset,
            tokens=launch.tokens,
            token_minted=time.monotonic(),
            fallback_to_logs=launch.fallback_to_logs,
        )
        uid = launch.uid
        threading.Thread(
            target=lambda: self.exits.put(Exited(uid, process.wait())),
            name=f"wait-{launch.name}",
            daemon=True,
        ).start()
        for note in launch.notes:
            log.warning("%s/%s: %s", launch.namespace, launch.name, note)
        log.info(
            "%s/%s: started pid %d (attempt %s, MASTER_PORT %d); log %s",
            launch.namespace,
            launch.name,
            process.pid,
            launch.attempt,
            launch.port,
            log_path,
        )

    def signal(self, proc: Running, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.process.pid, signum)

    def terminate(self, uid: str, why: str, seconds: float) -> None:
        """SIGTERM now, SIGKILL when `seconds` have passed (`kill_overdue`); once per process."""
        proc = self.running.get(uid)
        if proc is None or proc.stopping is not None:
            return
        proc.stopping = why
        proc.kill_at = time.monotonic() + seconds
        log.info(
            "%s/%s: pod %s; SIGTERM to pid %d (SIGKILL after %.0fs)",
            proc.namespace,
            proc.name,
            why,
            proc.process.pid,
            seconds,
        )
        self.signal(proc, signal.SIGTERM)

    def kill_overdue(self, now: float) -> None:
        """SIGKILL to every process still running after its grace period."""
        for proc in self.running.values():
            if proc.kill_at is not None and now >= proc.kill_at:
                log.warning("%s/%s: still running after its grace period; SIGKILL", proc.namespace, proc.name)
                self.signal(proc, signal.SIGKILL)
                proc.kill_at = None

    def finish(self, exited: Exited) -> tuple[Running, int] | None:
        """Forgets an exited process (its exit marked in its log, its tokens removed); its exit code."""
        proc = self.running.pop(exited.uid, None)
        if proc is None:
            return None
        code = exit_code_of(exited.returncode)
        with proc.log_path.open("ab") as handle:
            handle.write(f"===== {now_rfc3339()} exited with code {code}\n".encode())
        for token in proc.tokens:
            token.path.unlink(missing_ok=True)
        log.info("%s/%s: pid %d exited with code %d", proc.namespace, proc.name, proc.process.pid, code)
        return proc, code

    def termination_message(self, proc: Running, code: int) -> str | None:
        """The log's tail as a kubelet keeps it for a failed container (FallbackToLogsOnError)."""
        if code == 0 or not proc.fallback_to_logs:
            return None
        with proc.log_path.open("rb") as handle:
            handle.seek(proc.log_offset)
            return log_tail_message(handle.read().decode("utf-8", errors="replace"))

    def forget(self, uid: str) -> None:
        """The record of a process whose end is reported (or whose pod is gone)."""
        (self.records / f"{uid}.json").unlink(missing_ok=True)

    def kill_leftovers(self) -> Iterator[str]:
        """The uids of processes a previous run of this kubelet started: each killed if still there.
        Their records stay until the caller `forget`s them."""
        if not self.records.is_dir():
            return
        for path in sorted(self.records.glob("*.json")):
            try:
                record = json.loads(path.read_text())
                pid = int(record["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if process_start_time(pid) is not None and process_start_time(pid) == record.get("start_time"):
                log.warning(
                    "killing pid %d left by an earlier run (pod %s/%s)",
                    pid,
                    record.get("namespace"),
                    record.get("name"),
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            yield path.stem
