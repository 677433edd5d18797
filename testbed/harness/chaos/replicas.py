"""Two operator replicas under one Lease, as a Deployment with `replicas: 2` runs them: which one leads,
killing it, replacing it, and reading from each one's JSON log when it led and what it wrote.

Why apart: the disturbances act on processes and the audit reads their logs; the replicas themselves
are testbed/harness/bench's `Operator` (the same process, flags and probes).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Final

from testbed.common import ToolError
from testbed.harness.bench.operator import Operator
from testbed.harness.chaos.audit import Leadership, Write

# Flags that make a lost node count within seconds (the defaults are 30 s and 60 s), and the
# client-go lease timings left at their defaults: the handover measured is the one users get.
FLAGS: Final = ("--node-lost-after=5s", "--force-delete-after=10s", "--progress-interval=1s")
WRITE_ACTIONS: Final = frozenset({"create", "delete", "delete-job", "patch", "release", "transition"})
LEADING: Final = "became the leader"
RELEASED: Final = "released lease"


def log_time(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def log_lines(path: Path) -> Iterator[dict[str, object]]:
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


@dataclass
class Replica:
    name: str
    operator: Operator
    ended_at: float | None = None

    def leading(self) -> bool:
        try:
            return self.operator.alive() and self.operator.metrics("leader_election_master_status").leader
        except (OSError, ToolError):
            return False

    def led_from(self) -> list[float]:
        """The times this replica's log says it became the leader."""
        return [
            log_time(str(entry["time"]))
            for entry in log_lines(self.operator.log_path)
            if str(entry.get("message", "")).startswith(LEADING)
        ]

    def released_at(self) -> float | None:
        """When this replica's log says it gave the Lease up (on SIGTERM, before its process exits)."""
        for entry in log_lines(self.operator.log_path):
            if str(entry.get("message", "")).startswith(RELEASED):
                return log_time(str(entry["time"]))
        return None

    def writes(self) -> list[Write]:
        return [
            Write(self.name, log_time(str(entry["time"])), str(entry["action"]))
            for entry in log_lines(self.operator.log_path)
            if entry.get("action") in WRITE_ACTIONS
        ]


@dataclass
class Replicas:
    kubeconfig: Path
    log_dir: Path
    started: list[Replica] = field(default_factory=list)

    def start(self) -> Replica:
        name = f"replica-{len(self.started)}"
        operator = Operator(self.kubeconfig, self.log_dir / f"{name}.log", FLAGS)
        operator.start()
        replica = Replica(name, operator)
        self.started.append(replica)
        return replica

    def alive(self) -> list[Replica]:
        return [replica for replica in self.started if replica.operator.alive()]

    def leader(self, timeout: float = 90.0) -> Replica:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for replica in self.alive():
                if replica.leading():
                    return replica
            time.sleep(0.2)
        raise ToolError(f"no replica leads after {timeout:.0f}s")

    def stop_leader(self, how: signal.Signals) -> tuple[Replica, float]:
        """Kills (SIGKILL) or stops (SIGTERM) the leader; the time it was signalled."""
        leader = self.leader()
        at = time.time()
        if how is signal.SIGKILL:
            assert leader.operator.process is not None
            leader.operator.process.kill()
            leader.operator.process.wait(timeout=30)
            leader.ended_at = at
        else:
            leader.operator.stop()  # drains its workers and releases the Lease before it exits
            # Its leadership ends at the release, not at its exit: the standby may take the Lease in
            # between, and counting the stopped replica's last moments as leading reads as two leaders.
            leader.ended_at = leader.released_at() or time.time()
        return leader, at

    def handover(self, after: float, timeout: float = 90.0) -> float:
        """Seconds from `after` until another replica's log says it leads."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [at for replica in self.alive() for at in replica.led_from() if at >= after]
            if later:
                return min(later) - after
            time.sleep(0.2)
        raise ToolError(f"no replica took over within {timeout:.0f}s")

    def leaderships(self, run_end: float) -> list[Leadership]:
        """Each replica's time as leader: a replica leads at most once (losing the lease ends it)."""
        found = []
        for replica in self.started:
            starts = replica.led_from()
            if starts:
                end = replica.ended_at if replica.ended_at is not None else run_end
                found.append(Leadership(replica.name, starts[0], end))
        return found

    def writes(self) -> list[Write]:
        return [write for replica in self.started for write in replica.writes()]

    def stop_all(self) -> None:
        for replica in self.started:
            if replica.operator.alive():
                replica.ended_at = replica.ended_at or time.time()
            replica.operator.stop()
