"""Pod tracking: when the operator may let go of a pod's last state.

Every pod the operator creates carries the tracking finalizer (crd.contract.TRACKING_FINALIZER), the
way batch/v1 Job's pods carry `batch.kubernetes.io/job-tracking`: however a pod ends (its program
fails, a preemption deletes it, someone force-deletes it, its node goes), the API server keeps the
object with its final state until the finalizer is removed. So the final state of a pod is never only
in one process's memory: a reconcile after a failover, after an API server restart or after the
operator was down still finds it.

The planner says which finalizers to remove (`Release`), and the reconciler removes them only after it
wrote the status planned from that same observation, so a pod goes only once its end is accounted
for:

* a pod that ended (phase Succeeded or Failed), or is being deleted and its trainer has stopped or
  its grace period is over: its end is what the planned status was decided on (a failure counted, a
  disruption restart, a finished job, or a deletion the job waits out); nothing later about it can
  change the accounting. A pod being deleted whose trainer still runs within its grace period is
  kept: that trainer may still report (a checkpoint saved on SIGTERM, docs/progress.md), and the
  report must reach the status before the pod can go (planner/reports.py reads it);
* a pod whose TrainingJob is gone, or that belongs to an earlier job of the same name (an orphan): no
  status will ever account for it, and the garbage collector is deleting it.

A live, running pod keeps its finalizer: it has not ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controller.planner import podstate
from crd import contract

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Release:
    """Remove the tracking finalizer from the pod `name` (if it is still the pod with `uid`)."""

    name: str
    uid: str
    # Where the finalizer is in the pod's list: the removal is made conditional on it still being there.
    position: int


def tracked(pod: Mapping[str, Any]) -> bool:
    return contract.TRACKING_FINALIZER in (pod.get("metadata", {}).get("finalizers") or [])


def ended(pod: Mapping[str, Any], now: datetime | None = None) -> bool:
    """The pod can no longer change how the job's attempt is judged: it finished (by the pod's own
    phase: a trainer done while a sidecar runs still holds its node), or it is being deleted and
    nothing in it can report any more: its trainer has stopped or never started, or its grace period
    is over (`now` past its deletionTimestamp, which a kubelet's or kwok's final confirmation, and a
    force delete, set to the moment they were made). Without `now`: any pod being deleted."""
    if podstate.phase(pod) in ("Succeeded", "Failed"):
        return True
    if not podstate.is_terminating(pod):
        return False
    if now is None or podstate.phase(pod) == "Pending":
        return True
    if podstate.worker_phase(pod) in ("Succeeded", "Failed"):
        return True
    deadline = podstate.deletion_time(pod)
    return deadline is None or deadline <= now


def release(pod: Mapping[str, Any]) -> Release:
    metadata = pod["metadata"]
    finalizers = list(metadata.get("finalizers") or [])
    return Release(
        str(metadata["name"]), str(metadata.get("uid", "")), finalizers.index(contract.TRACKING_FINALIZER)
    )


def releases(pods: Iterable[Mapping[str, Any]], now: datetime | None = None) -> tuple[Release, ...]:
    """The job's pods whose end the status planned from this observation (made at `now`) accounts for."""
    return tuple(release(pod) for pod in _by_name(pods) if tracked(pod) and ended(pod, now))


def orphans(pods: Iterable[Mapping[str, Any]], job_uid: str | None) -> tuple[Release, ...]:
    """Pods labelled for a job key that the job living under that key (`job_uid`, None: no job) does
    not control: the job was deleted (or orphaned them: `kubectl delete --cascade=orphan`), or deleted
    and created again. Nothing will account for them."""
    return tuple(
        release(pod)
        for pod in _by_name(pods)
        if tracked(pod) and (job_uid is None or _controller_uid(pod) != job_uid)
    )


def _controller_uid(pod: Mapping[str, Any]) -> str | None:
    for owner in pod.get("metadata", {}).get("ownerReferences") or []:
        if owner.get("controller") and owner.get("kind") == contract.KIND:
            return str(owner.get("uid"))
    return None


def _by_name(pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(pods, key=lambda pod: str(pod.get("metadata", {}).get("name", "")))
