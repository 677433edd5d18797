"""The chaos run's verdict: the invariants checked over what the run recorded, as pure functions.

- every fault counted once and by its cause: each job's status.restarts equals the ledger's;
- restartCount never goes back, and never moves by more than one between two looks a second apart
  beyond what was injected meanwhile (`history` is every value seen, in order);
- every job converges: Running with its accounting (or gone, when deleted);
- no orphan (a pod whose TrainingJob is gone) and no pod held Terminating at the end;
- never two writers: each replica's writes (from its JSON log) fall inside the time it led, and no two
  replicas led at once;
- an in-place restart keeps its pods (the same UIDs, unless the operator fell back and its Event says
  why) and leaves no rank on the old attempt (each reports Running for status.attempt).

The same numbers make the one summary line and the JSON report.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.planner import podstate
from testbed.harness.chaos.plan import Ledger, restarts_of

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Leadership:
    """One replica's time as leader: from its first reconcile-enabling log line to its end (killed,
    stopped, or the end of the run), in Unix seconds."""

    replica: str
    start: float
    end: float


@dataclass(frozen=True)
class Write:
    replica: str
    at: float
    action: str


@dataclass
class Findings:
    mismatches: list[str] = field(default_factory=list)
    restart_count: list[str] = field(default_factory=list)
    unconverged: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    writers: list[str] = field(default_factory=list)
    in_place: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (
            self.mismatches
            or self.restart_count
            or self.unconverged
            or self.orphans
            or self.held
            or self.writers
            or self.in_place
        )


def accounting(ledger: Ledger, statuses: Mapping[str, JsonDict], jobs: Sequence[str]) -> list[str]:
    """Jobs whose status.restarts is not the ledger's, with both."""
    found = []
    for job in jobs:
        if job in ledger.deleted or job not in statuses:
            continue
        actual, expected = restarts_of(statuses[job]), ledger.expected(job)
        if actual != expected:
            found.append(f"{job}: restarts {actual}, expected {expected}")
    return found


def restart_counts(history: Mapping[str, Sequence[int]]) -> list[str]:
    """Jobs whose restartCount went back."""
    found = []
    for job, seen in history.items():
        for before, after in itertools.pairwise(seen):
            if after < before:
                found.append(f"{job}: restartCount went from {before} back to {after}")
                break
    return found


def final_counts(ledger: Ledger, statuses: Mapping[str, JsonDict], jobs: Sequence[str]) -> list[str]:
    """Jobs whose restartCount is not the number of restarts the ledger holds (a jump or a loss)."""
    found = []
    for job in jobs:
        if job in ledger.deleted or job not in statuses:
            continue
        count = int(statuses[job].get("restartCount") or 0)
        expected = sum(ledger.expected(job).values())
        if count != expected:
            found.append(f"{job}: restartCount {count}, expected {expected}")
    return found


def pods_replaced(
    before: Mapping[str, Mapping[str, str]],
    after: Mapping[str, Mapping[str, str]],
    fallbacks: Mapping[str, Sequence[str]],
) -> list[str]:
    """In-place jobs whose pods (rank name -> UID, before the fault and once the job settled) were
    replaced without an InPlaceRestartFallback Event that says why."""
    found = []
    for job, uids in before.items():
        if after.get(job) == uids:
            continue
        reasons = [message for message in fallbacks.get(job, ()) if message.strip()]
        if not reasons:
            found.append(f"{job}: pods replaced by an in-place restart with no fallback Event saying why")
    return found


def left_on_old_attempt(
    statuses: Mapping[str, JsonDict], pods: Mapping[str, Sequence[JsonDict]], jobs: Sequence[str]
) -> list[str]:
    """Ranks of the in-place `jobs` whose run annotation does not report Running for status.attempt."""
    found = []
    for job in jobs:
        status = statuses.get(job)
        if status is None or status.get("state") in ("Completed", "Failed"):
            continue
        attempt = int(status.get("attempt") or 0)
        for pod in pods.get(job, ()):
            if podstate.is_terminating(pod):
                continue
            report = podstate.run(pod)
            if report is None or report.state != "Running" or report.attempt != attempt:
                seen = "nothing" if report is None else f"{report.state} for attempt {report.attempt}"
                found.append(f"{job}: pod {pod['metadata']['name']} reports {seen}, status.attempt {attempt}")
    return found


def leaders_overlap(leaderships: Sequence[Leadership]) -> list[str]:
    ordered = sorted(leaderships, key=lambda lead: lead.start)
    return [
        f"{first.replica} led until {first.end:.3f} but {second.replica} led from {second.start:.3f}"
        for first, second in itertools.pairwise(ordered)
        if second.start < first.end
    ]


def writes_outside_leadership(writes: Sequence[Write], leaderships: Sequence[Leadership]) -> list[str]:
    by_replica: dict[str, list[Leadership]] = {}
    for lead in leaderships:
        by_replica.setdefault(lead.replica, []).append(lead)
    return [
        f"{write.replica} wrote ({write.action}) at {write.at:.3f} without leading"
        for write in writes
        if not any(lead.start <= write.at <= lead.end for lead in by_replica.get(write.replica, []))
    ]


def first_writes(writes: Sequence[Write], leaderships: Sequence[Leadership]) -> list[float]:
    """Seconds from each takeover (every leadership but the first) to that leader's first write: with
    its caches warm from standing by, a new leader reconciles at once, without a relist."""
    ordered = sorted(leaderships, key=lambda lead: lead.start)
    found = []
    for lead in ordered[1:]:
        mine = [write.at for write in writes if write.replica == lead.replica and write.at >= lead.start]
        if mine:
            found.append(min(mine) - lead.start)
    return found


def distribution(values: Sequence[float]) -> JsonDict:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "median": round(statistics.median(ordered), 2),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 2),
        "max": round(ordered[-1], 2),
    }


def summary_line(report: JsonDict) -> str:
    """The one line a chaos run ends with."""
    findings = report["findings"]
    counts = " ".join(f"{name}={len(items)}" for name, items in findings.items())
    faults = ",".join(f"{kind}={count}" for kind, count in sorted(report["faults"].items()))
    kill = report["handover_seconds"]["kill-9"]
    term = report["handover_seconds"]["sigterm"]
    verdict = "PASS" if report["passed"] else "FAIL"
    return (
        f"chaos {verdict}: jobs={report['jobs']} pods={report['pods_created']} faults[{faults}] "
        f"leader_kills={report['leader_kills']} apiserver_restarts={report['apiserver_restarts']} {counts} "
        f"handover kill-9 median={kill.get('median', '-')}s max={kill.get('max', '-')}s "
        f"sigterm median={term.get('median', '-')}s seconds={report['seconds']} "
        f"load={report['load_average']}"
    )
