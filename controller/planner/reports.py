"""Rank 0's progress reports into status in every state of the job, the last one of a rank 0 on its way
out included, and what it means when that rank was killed before its trainer was done.

Why: a trainer told to stop (SIGTERM: a preemption, an eviction, a gang restart, a suspension, Kueue
taking its admission back) saves a checkpoint within its pod's grace period and reports it
(docs/progress.md): no work is lost if the next attempt starts from that checkpoint. That report comes
from a pod being deleted, whose trainer still runs; the tracking finalizer keeps such a pod until its
trainer has stopped or its grace period is over (tracking.py), so its last report is always seen, and
this module reads it whatever the job is doing (restarting, suspended, queued again), before anything
else is decided. When that rank 0's trainer was killed at the end of its grace period (exit code 137
after its deletion began), a checkpoint it was saving was not reported: the next attempt resumes from
the latest one that was, and status.checkpoint.interrupted says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from controller.planner import podstate, texts
from controller.planner.facts import Facts
from controller.planner.progress import ProgressUpdate, apply_report
from controller.runtime.clock import parse_time
from crd.contract import CONTAINER_NAME

# The exit code of a process killed by SIGKILL, which the kubelet sends when the grace period is over.
SIGKILL_EXIT: Final = 137


@dataclass(frozen=True)
class RecordProgress:
    """Rank 0 reported something new (`update`) or something unusable (`problem`), or its trainer was
    killed at the end of its grace period (`interrupted`: what status.checkpoint.interrupted says)."""

    STEP: ClassVar = True
    update: ProgressUpdate | None
    problem: str | None = None
    interrupted: str | None = None


def progress(facts: Facts, status: Mapping[str, Any]) -> tuple[ProgressUpdate | None, str | None]:
    """Rank 0's report applied to `status` (rate-limited unless rank 0 has exited: its last report has
    nothing to flush it later), or the problem with it."""
    report, problem = facts.report(status)
    if report is None:
        return None, problem
    interval = 0.0 if facts.rank0_finished(status) else facts.settings.progress_min_interval
    return apply_report(status, report, facts.spec, facts.now, interval), None


def record(facts: Facts, status: Mapping[str, Any], taken: Sequence[object]) -> RecordProgress | None:
    """What rank 0's report, or its end, adds to the status now (a problem once per reconcile)."""
    update, problem = progress(facts, status)
    if problem and not any(isinstance(step, RecordProgress) and step.problem for step in taken):
        return RecordProgress(None, problem)
    if update is not None and update.changed:
        return RecordProgress(update)
    interrupted = interrupted_save(facts, status)
    return RecordProgress(None, interrupted=interrupted) if interrupted is not None else None


def interrupted_save(facts: Facts, status: Mapping[str, Any]) -> str | None:
    """Whether rank 0's pod, being deleted, had its trainer killed at the end of its grace period: the
    sentence status.checkpoint.interrupted should hold, or None (also when it holds it already)."""
    pod = facts.reporter(status)
    if pod is None or not podstate.is_terminating(pod):
        return None
    ended = podstate.termination(pod)
    if ended is None or ended.container != CONTAINER_NAME or ended.exit_code != SIGKILL_EXIT:
        return None
    if ended.reason == "OOMKilled":
        return None
    finished, started = podstate.finished_at(pod, CONTAINER_NAME), podstate.deletion_start(pod)
    if finished is None or started is None or parse_time(finished) < started:
        return None
    checkpoint = dict(status.get("checkpoint") or {})
    saved = checkpoint.get("time")
    if saved and parse_time(str(saved)) >= started:
        return None  # it reported a checkpoint saved after the signal: only its exit was cut short
    grace = pod.get("spec", {}).get("terminationGracePeriodSeconds")
    period = f"its {grace}s grace period" if grace is not None else "its grace period"
    latest = checkpoint.get("latest")
    resumes = f"the next attempt resumes from {latest}" if latest else "no checkpoint was reported yet"
    message = texts.reason(
        f"rank 0 ({pod['metadata']['name']}) was killed at the end of {period} (exit code {SIGKILL_EXIT}) "
        f"before its trainer exited: a checkpoint it was saving then was not reported; {resumes}"
    )
    return None if checkpoint.get("interrupted") == message else message
