"""What goes into the planner and what comes out of it.

In: `Observed`, everything the caches show about one TrainingJob at one instant (the job as stored,
its pods, those being deleted among them (the tracking finalizer keeps them), its other owned
objects, node readiness, the gang scheduler the cluster runs, what it shows of Kueue and of the
admission policies in crd/, and the create failures of the last attempt to carry out a plan), plus
the operator-wide `Settings`.

Out: a `Plan`, the status the job should have and the writes that get the cluster there. The
reconciler carries it out and never changes it; when a create fails, it asks again with the
failures in `Observed.create_failures` and writes the status that answer holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from builders.mpi import SshKey
from builders.podgroup import GangScheduler
from controller.planner.supporting import Patch
from controller.planner.tracking import Release

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Settings:
    """Operator-wide knobs (flags), as opposed to per-job spec fields."""

    force_delete_after: float = 60.0
    progress_min_interval: float = 5.0
    # A NotReady node counts as lost (its pods' gang restarts) this long after it turned NotReady.
    node_lost_after: float = 30.0


@dataclass(frozen=True)
class CreateFailure:
    """An object the API server would not create, and whether another try could succeed.

    `invalid`: the object itself is refused (400 BadRequest, 422 Invalid, 413 too large): permanent
    for this spec. `blocked`: something outside the job stands in the way (a quota, a missing
    PriorityClass, a name taken by an object the job does not own, a forbidden namespace).
    """

    kind: str
    name: str
    verdict: Literal["invalid", "blocked"]
    message: str
    # Only this object is refused (another object holds its name); objects like it may still be created.
    alone: bool = False


@dataclass(frozen=True)
class Queueing:
    """What the caches show of Kueue, when the cluster serves its API: the ResourceFlavors admissions
    name (their node labels and tolerations go on the pods), and the classes a Workload's priority is
    read from, by name. The job's own Workloads are among `Observed.owned`."""

    flavors: Mapping[str, JsonDict] = field(default_factory=dict)
    priority_classes: Mapping[str, JsonDict] = field(default_factory=dict)
    workload_priority_classes: Mapping[str, JsonDict] = field(default_factory=dict)
    # MultiKueue's worker clusters by name, as their Active condition (planner/multikueue.py).
    multikueue_clusters: Mapping[str, JsonDict] = field(default_factory=dict)


@dataclass(frozen=True)
class Guards:
    """What the caches show of the admission policies in crd/ that bound the rights the operator hands
    out (controller/guards_watch.py): `missing` maps each policy's name to what of it is not installed
    (the policy, its binding, or a binding that does not deny), empty when all are. `known` is False
    while the operator cannot tell (its watches of them have not synced): then it grants nothing new
    and takes nothing back (controller/planner/guards.py)."""

    missing: Mapping[str, str] = field(default_factory=dict)
    known: bool = True


@dataclass(frozen=True)
class Observed:
    job: JsonDict
    pods: Sequence[JsonDict]
    owned: Mapping[tuple[str, str], JsonDict]
    nodes: Mapping[str, JsonDict]
    now: datetime
    nodes_known: bool = True
    # The gang scheduler the cluster runs (discovery); used for jobs that ask for gang scheduling.
    gang_scheduler: GangScheduler | None = None
    # Volcano's Queues by name, while Volcano is the gang scheduler and its Queues are listed; None:
    # not known (nothing is judged by them).
    volcano_queues: Mapping[str, JsonDict] | None = None
    # What went wrong carrying out the plan made from this same observation.
    create_failures: Sequence[CreateFailure] = ()
    # Kueue, when the cluster serves its API (discovery); None: not installed.
    kueue: Queueing | None = None
    # The admission policies the trainers' rights rest on (the reconciler always passes what it sees).
    guards: Guards = field(default_factory=Guards)
    # A fresh SSH key pair for an MPI job's Secret, made by the reconciler (the planner makes no keys).
    ssh_key: SshKey | None = None


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str
    uid: str
    reason: str
    force: bool = False


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """The status to write and the writes to make, in order: patches of supporting objects, creates
    (supporting objects, then pods), pod deletes; then the job itself when its TTL expired. The
    tracking finalizers of `releases` are removed only after `status` is written.

    `objects_first`: the job is blocked by a refused create and the plan tries the creates again, so
    the reconciler makes them before writing status and writes only what the outcome changes (a
    failure that keeps recurring then writes nothing).

    `slow_start`: the job's last creates were refused, so its pods go in batches of 1, 2, 4, ... that
    stop at a refusal every pod shares (the Job controller's slow start): a job blocked by a quota
    costs one refused request per retry. Otherwise they go all at once (as many in parallel as the
    create pool allows), one round trip for a job that nothing blocks."""

    status: JsonDict
    creates: list[JsonDict] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)
    deletes: list[Delete] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False
    objects_first: bool = False
    slow_start: bool = False
    # Pods whose end `status` accounts for: their tracking finalizer goes once it is written.
    releases: tuple[Release, ...] = ()
