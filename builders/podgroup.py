"""PodGroups for gang scheduling, and what each gang scheduler needs to see on the pods.

Without gang scheduling a job whose GPUs only partly fit holds the GPUs it got while the rest of its
pods stay Pending, and two such jobs can deadlock. scheduler-plugins' coscheduling and Volcano admit
a group's pods all at once or not at all; each needs a PodGroup object and a marker on every pod
naming it, and the pods must be scheduled by that scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from builders.meta import object_meta
from builders.names import pod_group_name
from crd import contract
from crd.spec import TrainingJob

GangScheduler: TypeAlias = Literal["coscheduling", "volcano"]


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
    # The training cluster must start together; an evaluator (outside it) is scheduled when it fits.
    group_spec: dict[str, Any] = {"minMember": len(job.spec.replicas.training)}
    if gang == contract.GANG_COSCHEDULING:
        api_version = contract.COSCHEDULING_GROUP_VERSION
        if scheduling.schedule_timeout_seconds is not None:
            group_spec["scheduleTimeoutSeconds"] = scheduling.schedule_timeout_seconds
    else:
        api_version = contract.VOLCANO_GROUP_VERSION
        if scheduling.priority:
            group_spec["priorityClassName"] = scheduling.priority
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": object_meta(job, pod_group_name(job)),
        "spec": group_spec,
    }
