"""PodGroups for gang scheduling, and what each gang scheduler needs to see on the pods.

Without gang scheduling a job whose GPUs only partly fit holds the GPUs it got while the rest of its
pods stay Pending, and two such jobs can deadlock. scheduler-plugins' coscheduling and Volcano admit
a group's pods all at once or not at all; each needs a PodGroup object and a marker on every pod
naming it, and the pods must be scheduled by that scheduler.

Volcano's PodGroup also says what the whole gang needs (`minResources`: Volcano admits a group into
its Queue only while the queue's capability has room for that much) and which Queue it joins
(spec.scheduling.queue; `default` when unset, the queue Volcano's scheduler creates for itself, as
Volcano's own admission webhook, not run by every installation, would fill in).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, Literal, TypeAlias

from builders.meta import object_meta
from builders.names import pod_group_name
from crd import contract
from crd.spec import TrainingJob

GangScheduler: TypeAlias = Literal["coscheduling", "volcano"]
# The Queue a Volcano PodGroup joins when spec.scheduling.queue is unset.
VOLCANO_DEFAULT_QUEUE: Final = "default"
# A Kubernetes quantity: a decimal number and an optional suffix (binary, decimal or an exponent).
QUANTITY: Final = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


@dataclass(frozen=True)
class PodDecoration:
    """Labels, annotations and scheduler a gang scheduler requires on each of the job's pods."""

    scheduler_name: str
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


def pod_decoration(job: TrainingJob, gang: GangScheduler) -> PodDecoration:
    """spec.scheduling.schedulerName, when set, names the gang scheduler (it may be installed under
    another name)."""
    configured = job.spec.scheduling.scheduler_name
    group = pod_group_name(job)
    if gang == contract.GANG_COSCHEDULING:
        return PodDecoration(
            scheduler_name=configured or contract.COSCHEDULING_SCHEDULER_NAME,
            labels={contract.COSCHEDULING_POD_GROUP_LABEL: group},
        )
    return PodDecoration(
        scheduler_name=configured or contract.VOLCANO_SCHEDULER_NAME,
        annotations={contract.VOLCANO_GROUP_NAME_ANNOTATION: group},
    )


def build_pod_group(job: TrainingJob, gang: GangScheduler) -> dict[str, Any]:
    scheduling = job.spec.scheduling
    # The training cluster must start together; an evaluator (outside it) is scheduled when it fits, and
    # an MPI job's launcher, created once its workers are Ready, joins a group already placed (counted,
    # it would hold the workers back for a pod that waits for them).
    replicas = job.spec.replicas
    members = [slot for slot in replicas.training if slot != replicas.launcher_slot]
    group_spec: dict[str, Any] = {"minMember": len(members)}
    if gang == contract.GANG_COSCHEDULING:
        api_version = contract.COSCHEDULING_GROUP_VERSION
        if scheduling.schedule_timeout_seconds is not None:
            group_spec["scheduleTimeoutSeconds"] = scheduling.schedule_timeout_seconds
    else:
        api_version = contract.VOLCANO_GROUP_VERSION
        group_spec["queue"] = volcano_queue(job)
        minimum = gang_resources(job, group_spec["minMember"])
        if minimum:
            group_spec["minResources"] = minimum
        if scheduling.priority:
            group_spec["priorityClassName"] = scheduling.priority
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": object_meta(job, pod_group_name(job)),
        "spec": group_spec,
    }


def volcano_queue(job: TrainingJob) -> str:
    """The Volcano Queue the job's PodGroup joins."""
    return job.spec.scheduling.queue or VOLCANO_DEFAULT_QUEUE


def gang_resources(job: TrainingJob, members: int) -> dict[str, str]:
    """What `members` trainer containers request together (their requests, else their limits, which
    the API server copies into unset requests; gpusPerWorker GPUs each, as builders/pods.py gives
    them), by resource: the PodGroup's minResources."""
    configured = job.spec.resources
    each = {**configured.limits, **configured.requests}
    if job.spec.gpus_per_worker > 0:
        each[contract.GPU_RESOURCE] = job.spec.gpus_per_worker
    return {name: times(str(quantity), members) for name, quantity in sorted(each.items())}


def times(quantity: str, count: int) -> str:
    """`count` times a quantity, in its own unit ("32Gi" x 4 = "128Gi", "500m" x 3 = "1500m")."""
    match = QUANTITY.match(quantity.strip())
    if match is None:
        raise ValueError(f"not a quantity: {quantity!r}")
    number, suffix = match.groups()
    total = (Decimal(number) * count).normalize()
    return f"{total:f}{suffix or ''}"
