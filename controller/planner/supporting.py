"""The objects a TrainingJob needs besides its pods, and what differs between them and the cluster.

Headless and master Services, an MPI job's hostfile (its Secret, whose key changes each time it is
made, is created with the pods: planner/transitions.py), the checkpoint claim and the PodGroup, and the
objects the namespace's jobs share (the trainers' ServiceAccount and RoleBinding, the trainer's sources) are
built by `builders/`; `diff_objects` compares them with what the cache holds (the job's objects and
the namespace's shared ones) and lists what to create or patch (the reconciler does the writing).
Only the fields the operator owns are compared (a ConfigMap's data, a Service's ports and selector, a
RoleBinding's subjects, the PodGroup fields it sets), so defaulting by the API server or additions by other
controllers never cause a write. The checkpoint claim is only created, and released
(`release_claims`) when it must outlive the job (builders/pvc.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from builders import mpi
from builders.names import pvc_name
from builders.podgroup import GangScheduler, build_pod_group
from builders.pvc import build_checkpoint_pvc, release_claim_patch
from builders.services import build_headless_service, build_master_service
from builders.shared import build_shared
from crd.spec import TrainingJob

JsonDict = dict[str, Any]

# Per kind: the top-level fields the operator owns and keeps equal to what it built. An empty tuple
# means "create only" (a PVC's spec is immutable once bound).
OWNED_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "ConfigMap": (("data",),),
    "Service": (("spec", "ports"), ("spec", "selector"), ("spec", "publishNotReadyAddresses")),
    "ServiceAccount": (),
    # Its roleRef cannot change: a RoleBinding that binds another role is replaced (guards.py).
    "RoleBinding": (("subjects",),),
    "PersistentVolumeClaim": (),
    # Key by key: Volcano's admission webhook fills in spec.queue, which must not count as a difference.
    "PodGroup": (("spec", "minMember"), ("spec", "scheduleTimeoutSeconds"), ("spec", "priorityClassName")),
}


@dataclass(frozen=True)
class Patch:
    """A JSON merge patch of one of the job's objects (of its `status` when subresource says so); a
    body with metadata.resourceVersion applies only to that version of the object."""

    kind: str
    name: str
    body: JsonDict
    api_version: str
    subresource: str | None = None


def desired_objects(
    job: TrainingJob, gang: GangScheduler | None, *, trainer_rights: bool = True
) -> list[JsonDict]:
    """Every non-pod object of the job, in creation order (pods need the account and trainer first);
    without the trainers' RoleBinding when `trainer_rights` is False (planner/guards.py)."""
    objects = [
        *build_shared(job, trainer_rights=trainer_rights),
        build_headless_service(job),
        build_master_service(job),
    ]
    if job.spec.mpi is not None:
        objects.append(mpi.build_config_map(job))
    claim = build_checkpoint_pvc(job)
    if claim is not None:
        objects.append(claim)
    if gang is not None:
        objects.append(build_pod_group(job, gang))
    return objects


def release_claims(job: TrainingJob, existing: Mapping[tuple[str, str], JsonDict]) -> list[Patch]:
    """The patch that makes the job's checkpoint claim outlive it when whenDeleted says Retain but the
    claim is still owned by the job (created so before the policy existed). Made whatever the job's
    state: a finished job's TTL is what it protects against."""
    claim = existing.get(("PersistentVolumeClaim", pvc_name(job)))
    body = release_claim_patch(job, claim) if claim is not None else None
    if body is None:
        return []
    return [Patch("PersistentVolumeClaim", pvc_name(job), body, "v1")]


def _lookup(obj: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = obj
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _nest(path: tuple[str, ...], value: Any) -> JsonDict:
    body: JsonDict = {path[-1]: value}
    for key in reversed(path[:-1]):
        body = {key: body}
    return body


def _merge(into: JsonDict, addition: Mapping[str, Any]) -> None:
    for key, value in addition.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def diff_objects(
    desired: list[JsonDict], existing: Mapping[tuple[str, str], JsonDict]
) -> tuple[list[JsonDict], list[Patch]]:
    """(objects to create, merge patches to apply) so that `existing` matches `desired`.

    `existing` maps (kind, name) to the job's owned objects from the cache.
    """
    creates: list[JsonDict] = []
    patches: list[Patch] = []
    for obj in desired:
        kind = obj["kind"]
        name = obj["metadata"]["name"]
        current = existing.get((kind, name))
        if current is None:
            creates.append(obj)
            continue
        body: JsonDict = {}
        for path in OWNED_FIELDS.get(kind, ()):
            wanted = _lookup(obj, path)
            if wanted is not None and _lookup(current, path) != wanted:
                _merge(body, _nest(path, wanted))
        if body:
            if kind == "ConfigMap":
                stale_keys = set(current.get("data") or {}) - set(obj.get("data") or {})
                body["data"].update(dict.fromkeys(stale_keys))
            patches.append(Patch(kind, name, body, obj["apiVersion"]))
    return creates, patches
