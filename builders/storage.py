"""Resolve spec.checkpoint into one plain description of where checkpoints live.

The spec accepts each storage backend in two spellings (the README's short form `s3Bucket: x` and the
block form `s3: {bucket: x}`), and a pvc may be named, created by the operator, or both unset. The env,
volume and PVC builders all need the same answer, so it is computed once here.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from builders.names import pvc_name
from crd import contract
from crd.spec import TrainingJob

VOLUME_TYPES = ("pvc", "nfs")


@dataclass(frozen=True)
class CheckpointStorage:
    type: str
    # CHECKPOINT_DIR: the mount path for volumes, s3://bucket/prefix or gs://bucket/prefix otherwise.
    directory: str
    mount_path: str
    claim_name: str | None = None
    creates_claim: bool = False
    # The claim it creates outlives the job (create.whenDeleted Retain): it gets no owner reference.
    retains_claim: bool = False
    nfs_server: str | None = None
    nfs_path: str | None = None
    bucket: str | None = None
    prefix: str | None = None
    endpoint: str | None = None
    region: str | None = None
    credentials_secret: str | None = None

    @property
    def is_volume(self) -> bool:
        return self.type in VOLUME_TYPES


def checkpoint_storage(job: TrainingJob) -> CheckpointStorage | None:
    """The checkpoint storage of a defaulted job, or None when no storage is wired into the pods."""
    checkpoint = job.spec.checkpoint
    if not checkpoint.in_use:
        return None
    storage = checkpoint.storage
    mount_path = checkpoint.mount_path
    kind = storage["type"]
    if kind == "pvc":
        pvc = storage.get("pvc", {})
        creates = "create" in pvc
        claim = storage.get("pvcName") or pvc.get("claimName") or (pvc_name(job) if creates else None)
        retains = creates and pvc["create"].get("whenDeleted", contract.CLAIM_RETAIN) == contract.CLAIM_RETAIN
        return CheckpointStorage(
            kind, mount_path, mount_path, claim_name=claim, creates_claim=creates, retains_claim=retains
        )
    if kind == "nfs":
        nfs = storage.get("nfs", {})
        return CheckpointStorage(
            kind,
            mount_path,
            mount_path,
            nfs_server=storage.get("nfsServer") or nfs.get("server"),
            nfs_path=storage.get("nfsPath") or nfs.get("path"),
        )
    block = storage.get(kind, {})
    bucket = str(storage.get(f"{kind}Bucket") or block["bucket"])
    prefix = str(block.get("prefix") or job.name).strip("/")
    scheme = "s3" if kind == "s3" else "gs"
    return CheckpointStorage(
        kind,
        f"{scheme}://{bucket}/{prefix}" if prefix else f"{scheme}://{bucket}",
        mount_path,
        bucket=bucket,
        prefix=prefix,
        endpoint=block.get("endpoint"),
        region=block.get("region"),
        credentials_secret=block.get("credentialsSecret"),
    )


def resume_path(storage: CheckpointStorage | None, resume_from: str) -> str:
    """RESUME_FROM as the trainer sees it: volume paths relative to the mount become absolute."""
    if (
        storage is not None
        and storage.is_volume
        and not resume_from.startswith("/")
        and "://" not in resume_from
    ):
        return posixpath.join(storage.mount_path, resume_from)
    return resume_from
