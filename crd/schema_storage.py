"""The schema of spec.checkpoint: where checkpoints are stored and how a job resumes from them.

Storage has four backends, each accepted in two spellings (the README's short form `s3Bucket: x`
and the block form `s3: {bucket: x}`). The rules here keep every combination unambiguous: a backend
has what it needs, a value is given once, and no backend carries another backend's settings.
"""

from __future__ import annotations

from crd import contract
from crd.openapi import Rule, Schema, array, boolean, integer, obj, quantity, rule, string
from crd.schema_parts import (
    DNS_SUBDOMAIN_PATTERN,
    NAME_LENGTH,
    PATH_LENGTH,
    URL_LENGTH,
    cel_list,
)


def _bucket_block(kind: str, scheme: str, *, s3: bool) -> Schema:
    properties: dict[str, Schema] = {
        "bucket": string(f"{kind} bucket holding the checkpoints.", min_length=1, max_length=NAME_LENGTH),
        "prefix": string(
            f"Key prefix inside the bucket. Checkpoints go to {scheme}<bucket>/<prefix>; the prefix "
            "defaults to the job's name.",
            max_length=PATH_LENGTH,
        ),
    }
    if s3:
        properties["endpoint"] = string(
            "Endpoint URL of an S3-compatible store (AWS_ENDPOINT_URL), e.g. a MinIO service.",
            max_length=URL_LENGTH,
            pattern="^https?://",
        )
        properties["region"] = string("Region (AWS_DEFAULT_REGION).", max_length=64)
        credentials_text = (
            "Secret with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and optionally "
            "AWS_SESSION_TOKEN), injected as environment variables. Unset: the pod's own identity is used."
        )
    else:
        credentials_text = (
            f"Secret holding a service-account key under {contract.GCS_KEY_FILE}; mounted read-only and "
            "named by GOOGLE_APPLICATION_CREDENTIALS. Unset: the pod's own identity is used."
        )
    properties["credentialsSecret"] = string(
        credentials_text, max_length=NAME_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN
    )
    return obj(f"{kind} object storage.", properties)


# The API server checks rules against a `default: {}` before defaulting its fields, so rules read
# defaulted fields through has() (an absent storage type means the default, pvc).
STORAGE_TYPE = "(has(self.type) ? self.type : 'pvc')"


def _exclusive_settings(kind: str, fields: tuple[str, ...]) -> Rule:
    present = " || ".join(f"has(self.{f})" for f in fields)
    return rule(
        f"{STORAGE_TYPE} == '{kind}' || !({present})",
        message_expression=(
            f"'checkpoint.storage: {'/'.join(fields)} only apply to type {kind}, but type is ' + "
            f"{STORAGE_TYPE}"
        ),
    )


def storage() -> Schema:
    pvc = obj(
        "A PersistentVolumeClaim holding the checkpoints: an existing claim, or one the operator creates "
        f"(named <job>{contract.CHECKPOINTS_SUFFIX}). With neither claimName nor create the operator "
        f"creates one of {contract.DEFAULT_CHECKPOINT_CLAIM_SIZE}, which outlives the job "
        "(create.whenDeleted).",
        {
            "claimName": string(
                "An existing claim in the job's namespace, e.g. the retained claim of an earlier job "
                f"(<job>{contract.CHECKPOINTS_SUFFIX}) to resume from with checkpoint.resumeFrom. The "
                "operator never deletes it.",
                max_length=NAME_LENGTH,
            ),
            "create": obj(
                f"The claim the operator creates, <job>{contract.CHECKPOINTS_SUFFIX}. A job created again "
                "with the name of one whose claim was retained uses that claim as it is (its size and class "
                "are not changed).",
                {
                    "whenDeleted": string(
                        "What happens to the claim when the job is deleted (kubectl delete, or "
                        "ttlSecondsAfterFinished): Retain keeps it with its checkpoints, for a new job to "
                        "resume from (claimName, or a job of the same name); Delete lets the garbage "
                        "collector delete it with the job (the claim is owned by the job). A claim the job "
                        "did not create (one retained by an earlier job) is never deleted with it. Immutable "
                        "like all of storage: a change made just before the job is deleted could come too "
                        "late for the garbage collector.",
                        max_length=8,
                        enum=list(contract.CLAIM_RETENTION_POLICIES),
                        default=contract.CLAIM_RETAIN,
                    ),
                    "size": quantity(
                        "Requested storage, e.g. 100Gi.", default=contract.DEFAULT_CHECKPOINT_CLAIM_SIZE
                    ),
                    "storageClassName": string(
                        "StorageClass; the cluster's default class when unset.", max_length=NAME_LENGTH
                    ),
                    "accessModes": array(
                        "Access modes. Every worker mounts the claim, possibly on different nodes, so the "
                        "default needs a storage class that supports ReadWriteMany.",
                        {
                            "type": "string",
                            "enum": ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"],
                        },
                        max_items=4,
                        default=["ReadWriteMany"],
                    ),
                },
            ),
        },
        rules=[
            rule(
                "!(has(self.claimName) && has(self.create))",
                message="pvc: claimName and create are exclusive",
            )
        ],
    )
    return obj(
        "Where checkpoints are stored. Immutable. The short forms s3Bucket, gcsBucket, pvcName, nfsServer "
        "and nfsPath (as in the product README's examples) are equivalent to s3.bucket, gcs.bucket, "
        "pvc.claimName, nfs.server and nfs.path.",
        {
            "type": string("Storage backend.", max_length=8, enum=["pvc", "s3", "gcs", "nfs"], default="pvc"),
            "pvc": pvc,
            "s3": _bucket_block("S3", "s3://", s3=True),
            "gcs": _bucket_block("GCS", "gs://", s3=False),
            "nfs": obj(
                "An NFS export mounted at checkpoint.mountPath.",
                {
                    "server": string("NFS server host name or IP.", min_length=1, max_length=NAME_LENGTH),
                    "path": string("Exported path.", min_length=1, max_length=PATH_LENGTH, pattern="^/"),
                },
            ),
            "s3Bucket": string("Short form of s3.bucket.", min_length=1, max_length=NAME_LENGTH),
            "gcsBucket": string("Short form of gcs.bucket.", min_length=1, max_length=NAME_LENGTH),
            "pvcName": string("Short form of pvc.claimName.", min_length=1, max_length=NAME_LENGTH),
            "nfsServer": string("Short form of nfs.server.", min_length=1, max_length=NAME_LENGTH),
            "nfsPath": string("Short form of nfs.path.", min_length=1, max_length=PATH_LENGTH, pattern="^/"),
        },
        default_empty=True,
        rules=[
            rule(
                f"{STORAGE_TYPE} != 's3' || has(self.s3Bucket) || (has(self.s3) && has(self.s3.bucket))",
                message="checkpoint.storage: type s3 needs a bucket (s3.bucket or s3Bucket)",
            ),
            rule(
                f"{STORAGE_TYPE} != 'gcs' || has(self.gcsBucket) || (has(self.gcs) && has(self.gcs.bucket))",
                message="checkpoint.storage: type gcs needs a bucket (gcs.bucket or gcsBucket)",
            ),
            rule(
                f"{STORAGE_TYPE} != 'nfs' || "
                "((has(self.nfsServer) || (has(self.nfs) && has(self.nfs.server))) && "
                "(has(self.nfsPath) || (has(self.nfs) && has(self.nfs.path))))",
                message="checkpoint.storage: type nfs needs a server and a path (nfs.server/nfs.path or "
                "nfsServer/nfsPath)",
            ),
            rule(
                "!(has(self.s3Bucket) && has(self.s3) && has(self.s3.bucket))",
                message="checkpoint.storage: give the bucket once, as s3.bucket or s3Bucket",
            ),
            rule(
                "!(has(self.gcsBucket) && has(self.gcs) && has(self.gcs.bucket))",
                message="checkpoint.storage: give the bucket once, as gcs.bucket or gcsBucket",
            ),
            rule(
                "!(has(self.pvcName) && has(self.pvc))",
                message="checkpoint.storage: pvcName is the short form of pvc.claimName; use one of them",
            ),
            rule(
                "!(has(self.nfs) && ((has(self.nfsServer) && has(self.nfs.server)) || "
                "(has(self.nfsPath) && has(self.nfs.path))))",
                message="checkpoint.storage: give the NFS server and path once (nfs.* or nfsServer/nfsPath)",
            ),
            _exclusive_settings("pvc", ("pvc", "pvcName")),
            _exclusive_settings("s3", ("s3", "s3Bucket")),
            _exclusive_settings("gcs", ("gcs", "gcsBucket")),
            _exclusive_settings("nfs", ("nfs", "nfsServer", "nfsPath")),
        ],
    )


def checkpoint() -> Schema:
    reserved = cel_list(contract.RESERVED_MOUNT_PATHS)
    return obj(
        "Checkpointing: the trainer saves to CHECKPOINT_DIR every `frequency` epochs and reports the latest "
        "checkpoint; after a restart the operator resumes from it.",
        {
            "enabled": boolean("Save checkpoints.", default=False),
            "frequency": integer("Epochs between checkpoints.", minimum=1, default=1),
            "retention": integer(
                "Checkpoints kept; older ones are deleted by the trainer.", minimum=1, default=3
            ),
            "resumeFrom": string(
                "Checkpoint to start from on the first run: s3://... for s3, gs://... for gcs, a path on the "
                "volume (relative to mountPath, or absolute under it) for pvc and nfs. After a restart the "
                "latest reported checkpoint takes precedence.",
                max_length=PATH_LENGTH,
            ),
            "mountPath": string(
                "Where pvc and nfs storage is mounted in every worker.",
                max_length=PATH_LENGTH,
                pattern="^(/[^/]+)+$",
                default="/checkpoints",
                rules=[
                    rule(
                        r"!self.matches('/\\.\\.?(/|$)')",
                        message="checkpoint.mountPath must be a normalised absolute path, without '.' or "
                        "'..' segments",
                    ),
                    rule(
                        f"!{reserved}.exists(p, self == p || self.startsWith(p + '/'))",
                        message_expression=(
                            "'checkpoint.mountPath ' + self + ' collides with a path the operator mounts: "
                            f"{', '.join(contract.RESERVED_MOUNT_PATHS)}'"
                        ),
                    ),
                ],
            ),
            "storage": storage(),
        },
        default_empty=True,
    )
