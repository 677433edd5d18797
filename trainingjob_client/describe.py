"""`kubectl trainingjob describe`: the job, why it is not running, and one row per rank, as text.

Pure functions from the client's views to lines, so the layout is tested without a cluster. The
per-rank table is what `kubectl describe tj` cannot show: which pod holds which rank, on which node,
in which phase, and the exit code or waiting reason of its trainer container. An MPI job's launcher has
a row but no rank: mpirun gives the ranks to the workers' slots, and the launcher runs none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from trainingjob_client.progressbar import postfix
from trainingjob_client.views import JobEvent, JobStatus, RankStatus, TrainingJob, why_not_running

EVENTS_SHOWN = 10
LAUNCHER_RANK = "launcher"  # what the RANK column shows for an MPI job's launcher


def table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell, like kubectl's tables; the last column is not padded."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [str(cell).ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append((indent + "   ".join([*cells, str(row[-1])])).rstrip())
    return lines


def rank_rows(ranks: Sequence[RankStatus], launcher_slot: int | None = None) -> list[list[str]]:
    """One row per pod; the RANK of an MPI job's launcher (in `launcher_slot`) reads `launcher`."""
    return [
        [
            LAUNCHER_RANK if rank.rank == launcher_slot else str(rank.rank),
            rank.pod or "(no pod)",
            rank.node or "-",
            rank.phase or "-",
            rank.state_text() or "-",
        ]
        for rank in ranks
    ]


RESTART_KINDS: Final = {"InPlace": "in place", "Recreate": "pods recreated"}


def restarts_line(status: JobStatus) -> str:
    """How many restarts, and the last one's reason and (for a job restarted in place) its kind."""
    last = [
        part
        for part in (status.last_restart_reason, RESTART_KINDS.get(status.last_restart_kind or ""))
        if part
    ]
    return f"{status.restart_count}" + (f" (last: {', '.join(last)})" if last else "")


def describe(job: TrainingJob, ranks: Sequence[RankStatus], events: Sequence[JobEvent]) -> str:
    status = job.status
    lines = [
        f"Name:        {job.name}",
        f"Namespace:   {job.namespace}",
        f"State:       {status.state or '(no status yet)'}",
    ]
    if status.message:
        lines.append(f"Message:     {status.message}")
    why = why_not_running(status)
    if status.finished:
        lines.append(f"Finished:    {why}")
    else:
        lines.append(f"Not running: {why}" if why else "Running:     all workers")
    percent = status.percent()
    progress = f"{percent:.0f}%" if percent is not None else "-"
    details = postfix(status)
    lines.append(f"Progress:    {progress}" + (f"  {details}" if details else ""))
    lines.append(f"Restarts:    {restarts_line(status)}")
    if status.failure_reason:
        lines.append(f"Failure:     {status.failure_reason}")
    if status.latest_checkpoint:
        lines.append(f"Checkpoint:  {status.latest_checkpoint}")
    if status.mlflow_run_id:
        url = f"  {status.mlflow_run_url}" if status.mlflow_run_url else ""
        lines.append(f"MLflow run:  {status.mlflow_run_id}{url}")
    if status.wandb_run_id:
        where = status.wandb_run_url or (f"({status.wandb_mode})" if status.wandb_mode else "")
        lines.append(f"W&B run:     {status.wandb_run_id}  {where}".rstrip())
    if status.tracking_unavailable:
        lines.append(f"Tracking:    unavailable ({status.tracking_unavailable}); training goes on")
    lines.append("Ranks:")
    lines += table(
        ["RANK", "POD", "NODE", "PHASE", "EXIT CODE / WAITING"], rank_rows(ranks, job.replicas.launcher_slot)
    )
    if status.conditions:
        lines.append("Conditions:")
        rows = [[c.type, c.status, c.reason or "-", c.message or "-"] for c in status.conditions]
        lines += table(["TYPE", "STATUS", "REASON", "MESSAGE"], rows)
    lines.append(f"Events (last {EVENTS_SHOWN}):" if len(events) > EVENTS_SHOWN else "Events:")
    shown = list(events)[-EVENTS_SHOWN:]
    if shown:
        rows = [[e.type, e.reason, str(e.count), e.message] for e in shown]
        lines += table(["TYPE", "REASON", "COUNT", "MESSAGE"], rows)
    else:
        lines.append("  <none>")
    return "\n".join(lines)
