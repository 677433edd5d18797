"""Elastic jobs (spec.elastic): a lost worker shrinks the world instead of restarting the gang.

torchrun's agents keep a job going when one of them goes away: the processes of the others fail
their collective, their agents form a new rendezvous round with whoever is left (at least
minWorkers) and start their processes again, which resume from the latest checkpoint; an agent that
starts later joins the next round and the world grows back. What the operator decides, here:

* A worker lost to a disruption (preemption, eviction, node loss, a pod deleted by someone else)
  while at least minWorkers others run is a shrink: its pod is deleted if it is still there, the loss
  is counted (status.elastic.shrinks: not a failure, not a gang restart, so neither backoffLimit nor
  maxDisruptionRestarts is used up) and its replica index stays in status.elastic.replacing until
  its new pod runs, which is counted as a grow. The last states of a lost pod (terminating, then
  its tombstone) are recognised by that index and never counted twice.
* Worker 0 cannot be replaced this way: its agent hosts the rendezvous store (PET_RDZV_ENDPOINT),
  and with it goes every agent's rendezvous, so losing it is a gang restart, counted as the
  disruption it is; so is losing a worker when fewer than minWorkers would be left. A worker that
  fails on its own (a non-zero exit without a disruption) is judged by failurePolicy as in any job.
* Missing workers (lost ones, or more after kubectl scale) are created while the others run, and
  the job stays Running as long as minWorkers of its workers run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from builders.names import pod_name
from controller.planner import podstate
from controller.planner.facts import Facts, attempt_of
from controller.planner.failures import PodFailure
from controller.planner.gang import Gang
from crd.contract import ATTEMPT_LABEL
from crd.spec import Elastic

JsonDict = dict[str, Any]
Pods = tuple[JsonDict, ...]

HOST_LOST = (
    "it hosts the rendezvous (PET_RDZV_ENDPOINT), without which no worker can rejoin; restarting the "
    "whole gang"
)


@dataclass(frozen=True)
class Shrink:
    """Workers lost to a disruption (`lost`, replica indices) while `survivors` others run on: counted,
    and their pods (`stop`) deleted. With `lost` empty, only replacements lost before they ran go."""

    STEP: ClassVar = False
    lost: tuple[int, ...]
    stop: Pods
    survivors: int
    reason: str
    message: str


@dataclass(frozen=True)
class Rejoined:
    """Replacements that run (`indices`, counted as grows), and indices no longer replaced because
    numWorkers went below them (`dropped`)."""

    STEP: ClassVar = True
    indices: tuple[int, ...]
    dropped: tuple[int, ...] = ()


@dataclass(frozen=True)
class AddWorkers:
    """Pods for missing workers (lost or added) while the others keep running."""

    STEP: ClassVar = False
    indices: tuple[int, ...]


@dataclass(frozen=True)
class Fallback:
    """Not a decision: failurePolicy judges these `failures` as in any job (a gang restart, or the
    end), with `note` saying why the job could not shrink."""

    failures: tuple[PodFailure, ...]
    note: str | None = None


def replacing(status: Mapping[str, Any]) -> frozenset[int]:
    """Replica indices of lost workers whose replacement does not run yet."""
    indices = (status.get("elastic") or {}).get("replacing") or []
    return frozenset(int(index) for index in indices if isinstance(index, int))


def react(facts: Facts, status: Mapping[str, Any], gang: Gang) -> Shrink | Rejoined | Fallback | None:
    """Losses first (a shrink, or the failure policy's verdict), then replacements that now run."""
    elastic = facts.spec.elastic
    assert elastic is not None
    being_replaced = replacing(status)
    judged: list[PodFailure] = []
    lost: dict[int, PodFailure] = {}
    stop: list[JsonDict] = []
    for failure in gang.failures:
        index = failure.index
        if index is not None and index in being_replaced:
            if failure.gone:
                continue  # the lost pod on its way out, or its last state: counted already
            if failure.disruption:
                stop.append(gang.ranks[index])  # a replacement lost before it ran: nothing shrank
            else:
                judged.append(failure)
        elif failure.disruption and index is not None:
            lost.setdefault(index, failure)
        else:
            judged.append(failure)
    for index, failure in _deleted(facts, status, gang, being_replaced).items():
        lost.setdefault(index, failure)
    if judged:
        return Fallback((*judged, *lost.values()))
    if lost:
        return _shrink(elastic, gang, being_replaced, lost, stop)
    if stop:
        return Shrink((), tuple(stop), 0, "", "")
    running = [index for index in being_replaced if _runs(gang, index)]
    dropped = [index for index in being_replaced if index >= gang.size]
    if running or dropped:
        return Rejoined(tuple(sorted(running)), tuple(sorted(dropped)))
    return None


def _runs(gang: Gang, index: int) -> bool:
    pod = gang.ranks.get(index)
    return pod is not None and podstate.phase(pod) == "Running"


def _deleted(
    facts: Facts, status: Mapping[str, Any], gang: Gang, being_replaced: frozenset[int]
) -> dict[int, PodFailure]:
    """Workers of this attempt whose pod someone deleted without a disruption condition (the operator
    deletes a running elastic job's pods only when they are lost or beyond numWorkers)."""
    attempt = str(attempt_of(status))
    deleted: dict[int, PodFailure] = {}
    for pod in gang.terminating:
        index = podstate.replica_index(pod)
        if (
            index is None
            or not 0 <= index < gang.size
            or index in gang.ranks
            or index in being_replaced
            or pod["metadata"].get("labels", {}).get(ATTEMPT_LABEL) != attempt
            or podstate.failed_before_deletion(pod)  # a failure of its own (among gang.failures)
        ):
            continue
        name = str(pod["metadata"]["name"])
        deleted[index] = PodFailure(name, index, "", None, "PodDeleted", "deleted", True, gone=True)
    return deleted


def _shrink(
    elastic: Elastic,
    gang: Gang,
    being_replaced: frozenset[int],
    lost: Mapping[int, PodFailure],
    stop: Sequence[JsonDict],
) -> Shrink | Fallback:
    failures = tuple(lost[index] for index in sorted(lost))
    if 0 in lost:
        return Fallback(failures, f"{lost[0].pod} {HOST_LOST}")
    survivors = sum(
        1 for index in gang.ranks if index not in lost and index not in being_replaced and _runs(gang, index)
    )
    if survivors < elastic.min_workers:
        return Fallback(
            failures,
            f"{survivors} worker(s) would be left, fewer than elastic.minWorkers {elastic.min_workers}; "
            "restarting the whole gang",
        )
    pods = [*stop, *(gang.ranks[index] for index, failure in lost.items() if not failure.gone)]
    described = "; ".join(failure.describe() for failure in failures)
    message = (
        f"{described}: the other {survivors} worker(s) continue without a gang restart (elastic); "
        f"{'it is' if len(lost) == 1 else 'they are'} replaced when {'it' if len(lost) == 1 else 'they'} "
        "can be scheduled"
    )
    return Shrink(tuple(sorted(lost)), tuple(pods), survivors, failures[0].reason, message)


def add_workers(facts: Facts, gang: Gang) -> AddWorkers | None:
    """The missing workers whose names are free (a lost pod still terminating holds its name), or None
    when every one waits for its old pod to go."""
    holding = {pod["metadata"]["name"] for pod in gang.terminating}
    free = tuple(index for index in gang.missing if pod_name(facts.job, index) not in holding)
    return AddWorkers(free) if free else None


def replacement_wait(facts: Facts, gang: Gang) -> str:
    names = ", ".join(pod_name(facts.job, index) for index in gang.missing)
    running = gang.count("Running")
    return f"{running}/{gang.size} workers running; {names} will be created once the old pod has terminated"


def running_message(facts: Facts, gang: Gang) -> str | None:
    """How an elastic job runs when at least minWorkers of its workers do (None: fewer run)."""
    elastic = facts.spec.elastic
    if elastic is None:
        return None
    running = gang.count("Running", "Succeeded")
    total = gang.size
    if running < elastic.min_workers:
        return None
    if running >= total:
        return f"{total}/{total} workers running"
    waiting = [index for index in range(total) if not _runs(gang, index)]
    names = ", ".join(pod_name(facts.job, index) for index in waiting[:3])
    more = f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
    unscheduled = [
        message for message in map(podstate.unschedulable_message, gang.unscheduled) if message is not None
    ]
    why = f" ({unscheduled[0]})" if unscheduled else ""
    return (
        f"{running}/{total} workers running (elastic.minWorkers {elastic.min_workers}); "
        f"waiting for {names}{more}{why}"
    )
