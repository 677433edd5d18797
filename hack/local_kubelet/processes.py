"""The processes that stand in for pods' containers: started, signalled, awaited, logged.

Why apart: process supervision is the kubelet's container runtime here. Each container runs under
its shim (hack/local_kubelet/shim.py) in a session of its own, so a signal to the group reaches the
command and its children; the shim writes the container's log in the CRI format
(hack/local_kubelet/logfiles.py) and appends to the pod's journal, where this module writes its own
lines (which pod, which command, what was skipped, the exit code). A record per container in
<state-dir>/processes/ (pid and kernel start time) lets the next start of the local kubelet find and
kill what a crashed one left behind. A thread per process waits for its exit and posts it to the
kubelet's event queue.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hack.common import REPO, process_start_time
from hack.local_kubelet.env import PASSED_ENV
from hack.local_kubelet.launch import ContainerLaunch, PodLaunch
from hack.local_kubelet.logfiles import PodLogs, mark_exit, parse_record
from hack.local_kubelet.volumes import write_private
from hack.podstatus import exit_code_of, log_tail_message, now_rfc3339

SHIM: Final = "hack.local_kubelet.shim"

log = logging.getLogger("local-kubelet")


@dataclass
class Process:
    """One container's shim and command."""

    uid: str
    namespace: str
    pod: str
    container: str
    popen: subprocess.Popen[bytes]
    log: Path  # the container instance's CRI log
    journal: Path
    stopping: str | None = None  # why SIGTERM was sent: "deleted", "shutdown" or "finished"
    kill_at: float | None = None

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass
class Exited:
    uid: str
    container: str
    returncode: int


def journal_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as handle:
        handle.write("".join(f"===== {line}\n" for line in lines).encode())


class Supervisor:
    """The running containers by (pod uid, container name), their logs and their records."""

    def __init__(self, logs: PodLogs, records: Path, exits: queue.Queue[Any]) -> None:
        self.logs = logs
        self.records = records
        self.exits = exits
        self.running: dict[tuple[str, str], Process] = {}

    def pods(self) -> set[str]:
        """The uids of pods with a container running."""
        return {uid for uid, _container in self.running}

    def of_pod(self, uid: str) -> list[Process]:
        return [p for (owner, _name), p in self.running.items() if owner == uid]

    def start_pod(self, launch: PodLaunch) -> None:
        """Marks the pod's start in its journal and its log directory."""
        self.logs.register(launch.namespace, launch.name, launch.uid, launch.attempt)
        journal_lines(
            self.logs.journal(launch.namespace, launch.name),
            [
                f"{now_rfc3339()} local kubelet: pod {launch.namespace}/{launch.name} "
                f"(uid {launch.uid}, attempt {launch.attempt})",
                *(f"skipped: {note}" for note in launch.notes),
            ],
        )
        for note in launch.notes:
            log.warning("%s/%s: %s", launch.namespace, launch.name, note)

    def spawn(self, launch: PodLaunch, container: ContainerLaunch, restart: int) -> Process:
        log_path = self.logs.instance(launch.namespace, launch.name, launch.uid, container.name, restart)
        journal = self.logs.journal(launch.namespace, launch.name)
        header = [f"container {container.name} ({container.role}): {container.described}"]
        if container.stand_in:
            header.append(f"not runnable here: a stand-in runs ({' '.join(container.command[3:])})")
        else:
            header.append(f"command: {' '.join(container.command)}")
        if container.torchrun:
            header.append(
                f"torchrun with its stores on 127.0.0.1, {container.env.get('PET_RDZV_ENDPOINT')} for the "
                "rendezvous; real torch from this interpreter, Gloo on the loopback"
            )
        elif container.trainer:
            header.append(
                f"MASTER_ADDR=127.0.0.1 MASTER_PORT={launch.port}; TRAIN_SIMULATE=1 (the reference "
                "trainer's pure-Python simulation: no torch, nothing listens)"
            )
        header += [f"skipped: {note}" for note in container.notes]
        journal_lines(journal, header)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()  # its log can be asked for as soon as the container counts as started
        spec = {
            "command": container.command,
            "env": container.env,
            "cwd": str(container.cwd),
            "log": str(log_path),
            "journal": str(journal),
            "prefix": "" if container.trainer else f"[{container.name}] ",
        }
        spec_path = self.records / f"{launch.uid}_{container.name}.spec.json"
        write_private(spec_path, json.dumps(spec).encode())
        shim_env = {key: os.environ[key] for key in PASSED_ENV if key in os.environ}
        with journal.open("ab") as errors:
            popen = subprocess.Popen(
                [sys.executable, "-m", SHIM, str(spec_path)],
                env=shim_env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=errors,
                stderr=errors,
                start_new_session=True,
            )
        record = {
            "uid": launch.uid,
            "namespace": launch.namespace,
            "name": launch.name,
            "container": container.name,
            "pid": popen.pid,
            "start_time": process_start_time(popen.pid),
            "log": str(log_path),
        }
        write_private(self.records / f"{launch.uid}_{container.name}.json", json.dumps(record).encode())
        process = Process(launch.uid, launch.namespace, launch.name, container.name, popen, log_path, journal)
        self.running[(launch.uid, container.name)] = process
        uid, name = launch.uid, container.name
        threading.Thread(
            target=lambda: self.exits.put(Exited(uid, name, popen.wait())),
            name=f"wait-{launch.name}-{name}",
            daemon=True,
        ).start()
        for note in container.notes:
            log.warning("%s: %s", process.label, note)
        log.info("%s: started pid %d (%s); log %s", process.label, popen.pid, container.role, log_path)
        return process

    def signal(self, proc: Process, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.popen.pid, signum)

    def terminate(self, proc: Process, why: str, seconds: float) -> None:
        """SIGTERM now, SIGKILL when `seconds` have passed (`kill_overdue`); once per process."""
        if proc.stopping is not None:
            return
        proc.stopping = why
        proc.kill_at = time.monotonic() + seconds
        log.info("%s: %s; SIGTERM to pid %d (SIGKILL after %.0fs)", proc.label, why, proc.popen.pid, seconds)
        self.signal(proc, signal.SIGTERM)

    def kill_overdue(self, now: float) -> None:
        """SIGKILL to every process still running after its grace period."""
        for proc in self.running.values():
            if proc.kill_at is not None and now >= proc.kill_at:
                log.warning("%s: still running after its grace period; SIGKILL", proc.label)
                self.signal(proc, signal.SIGKILL)
                proc.kill_at = None

    def finish(self, exited: Exited) -> tuple[Process, int] | None:
        """Forgets an exited process (its exit marked in its log and the journal); its exit code."""
        proc = self.running.pop((exited.uid, exited.container), None)
        if proc is None:
            return None
        code = exit_code_of(exited.returncode)
        mark_exit(proc.log, code)
        journal_lines(proc.journal, [f"{now_rfc3339()} container {proc.container} exited with code {code}"])
        log.info("%s: pid %d exited with code %d", proc.label, proc.popen.pid, code)
        return proc, code

    def forget(self, uid: str) -> None:
        """The records of a pod whose end is reported (or that is gone)."""
        for path in self.records.glob(f"{uid}_*.json"):
            path.unlink(missing_ok=True)

    def termination_message(self, proc: Process, code: int) -> str | None:
        """The log's tail as a kubelet keeps it for a failed container (FallbackToLogsOnError)."""
        if code == 0 or not proc.log.is_file():
            return None
        records = (parse_record(line) for line in proc.log.read_bytes().split(b"\n"))
        text = b"".join(r.output(timestamps=False) for r in records if r is not None)
        return log_tail_message(text.decode("utf-8", errors="replace"))

    def kill_leftovers(self) -> Iterator[str]:
        """The uids of pods whose containers a previous run of this kubelet started: each process killed
        if still there and its log marked ended. Their records stay until the caller `forget`s them."""
        if not self.records.is_dir():
            return
        seen: set[str] = set()
        for path in sorted(self.records.glob("*.json")):
            if path.name.endswith(".spec.json"):
                path.unlink(missing_ok=True)
                continue
            try:
                record = json.loads(path.read_text())
                pid, uid = int(record["pid"]), str(record["uid"])
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if process_start_time(pid) is not None and process_start_time(pid) == record.get("start_time"):
                log.warning(
                    "killing pid %d left by an earlier run (%s/%s/%s)",
                    pid,
                    record.get("namespace"),
                    record.get("name"),
                    record.get("container"),
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            if record.get("log"):
                mark_exit(Path(str(record["log"])), 137)
            if uid not in seen:
                seen.add(uid)
                yield uid
