"""TrainingJob manifests the API server must reject, with the field its error must name, and ones it
must accept.

The unit tests check what can be checked without a cluster (schema-level cases fail OpenAPI
validation at the named field, CEL and transition cases pass it so that only their rule can reject
them, every named field exists in the schema). Cluster tests run the same table through kubectl:

    kubectl apply --dry-run=server -f <manifest>          # must fail, stderr must mention `field`
    kubectl apply -f <before>; kubectl apply -f <manifest>  # transition cases: the second must fail

`layer` says which part of the API server rejects the case: "schema" (OpenAPI types, bounds, enums,
patterns, required), "list" (duplicate items of a set/map list), "unknown-field" (kubectl's strict
field validation), "cel" (x-kubernetes-validations) and "transition" (CEL rules using oldSelf).

The cases of the fields with Kubernetes' own types (podTemplate, scheduling.affinity,
env[].valueFrom) live in tests/unit/crd_cases_embedded.py, the schema-level ones in
tests/unit/crd_cases_schema.py, the shared building blocks in tests/unit/crd_case_model.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from crd import contract
from tests.unit.crd_case_model import InvalidCase, base_job, case, job, transition
from tests.unit.crd_cases_elastic import elastic_invalid_cases, elastic_valid_manifests, elastic_valid_updates
from tests.unit.crd_cases_embedded import embedded_type_cases, podtemplate_manifests
from tests.unit.crd_cases_frameworks import frameworks_invalid_cases, frameworks_valid_manifests
from tests.unit.crd_cases_mpi import mpi_invalid_cases, mpi_valid_manifests
from tests.unit.crd_cases_schema import S3, schema_cases
from tests.unit.crd_cases_tensorflow import (
    tensorflow_invalid_cases,
    tensorflow_valid_manifests,
    tensorflow_valid_updates,
)

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"

LONG_NAME = "a" * (contract.MAX_JOB_NAME + 1)


def _list_cases() -> list[InvalidCase]:
    return [
        case(
            "env-duplicate-name",
            {"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG", "value": "WARN"}]},
            "spec.env[1]",
            "list",
        ),
        case(
            "exit-codes-duplicate",
            {
                "spec.failurePolicy.restartPolicy": "ExitCode",
                "spec.failurePolicy.retryableExitCodes": [137, 137],
            },
            "spec.failurePolicy.retryableExitCodes[1]",
            "list",
        ),
    ]


def _unknown_field_cases() -> list[InvalidCase]:
    return [
        case("spec-unknown-field", {"spec.numGPUs": 2}, "spec.numGPUs", "unknown-field"),
        case(
            "hyperparameters-snake-case",
            {"spec.hyperparameters.learning_rate": 0.1},
            "spec.hyperparameters.learning_rate",
            "unknown-field",
        ),
        case(
            "s3-misspelled",
            {f"{S3}.type": "s3", f"{S3}.s3": {"bucket": "b", "bukket": "c"}},
            f"{S3}.s3.bukket",
            "unknown-field",
        ),
    ]


def _cel_cases() -> list[InvalidCase]:
    return [
        # The enum names it (torch.distributed's third backend); a rule refuses it and says why.
        case("backend-mpi", {"spec.networking.backend": "mpi"}, "spec.networking.backend", "cel"),
        # A Volcano Queue is the queue of the job's PodGroup: without gang scheduling there is none.
        case(
            "volcano-queue-without-gang",
            {"spec.scheduling.queue": "research"},
            "spec.scheduling.queue",
            "cel",
        ),
        InvalidCase("name-too-long", job(name=LONG_NAME), "metadata.name", "cel"),
        InvalidCase("name-starts-with-digit", job(name="1-training"), "metadata.name", "cel"),
        InvalidCase("name-with-dot", job(name="bert.v2"), "metadata.name", "cel"),
        case("env-reserved-name", {"spec.env": [{"name": "WORLD_SIZE", "value": "8"}]}, "spec.env[0]", "cel"),
        case(
            "env-reserved-tf-config",
            {"spec.env": [{"name": "TF_CONFIG", "value": "{}"}]},
            "spec.env[0]",
            "cel",
        ),
        case(
            "env-reserved-prefix",
            {"spec.env": [{"name": "HP_DROPOUT", "value": "0.1"}]},
            "spec.env[0]",
            "cel",
        ),
        case(
            "env-value-and-valueFrom",
            {
                "spec.env": [
                    {"name": "TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                ]
            },
            "spec.env[0]",
            "cel",
        ),
        case(
            "env-two-sources",
            {
                "spec.env": [
                    {
                        "name": "TOKEN",
                        "valueFrom": {
                            "secretKeyRef": {"name": "s", "key": "k"},
                            "configMapKeyRef": {"name": "c", "key": "k"},
                        },
                    }
                ]
            },
            "spec.env[0].valueFrom",
            "cel",
        ),
        case(
            "gpu-limit-mismatch",
            {"spec.gpusPerWorker": 2, "spec.resources.limits": {contract.GPU_RESOURCE: "4"}},
            "spec.resources.limits",
            "cel",
        ),
        case(
            "gpu-request-mismatch",
            {"spec.gpusPerWorker": 0, "spec.resources.requests": {contract.GPU_RESOURCE: 1}},
            "spec.resources.requests",
            "cel",
        ),
        case(
            "requests-above-limits",
            {"spec.resources.requests": {"cpu": "8"}, "spec.resources.limits": {"cpu": "4"}},
            "spec.resources.requests",
            "cel",
        ),
        case(
            "exit-codes-overlap",
            {
                "spec.failurePolicy.restartPolicy": "ExitCode",
                "spec.failurePolicy.retryableExitCodes": [137, 1],
                "spec.failurePolicy.permanentExitCodes": [1, 2],
            },
            "spec.failurePolicy.permanentExitCodes",
            "cel",
        ),
        case(
            "exit-codes-without-ExitCode-policy",
            {"spec.failurePolicy.retryableExitCodes": [137]},
            "spec.failurePolicy.restartPolicy",
            "cel",
        ),
        case(
            "backoff-max-below-initial",
            {"spec.failurePolicy.restartBackoff": {"initialDelaySeconds": 60, "maxDelaySeconds": 30}},
            "spec.failurePolicy.restartBackoff.maxDelaySeconds",
            "cel",
        ),
        case("s3-without-bucket", {f"{S3}.type": "s3"}, S3, "cel"),
        case("s3-block-without-bucket", {f"{S3}.type": "s3", f"{S3}.s3": {"prefix": "runs"}}, S3, "cel"),
        case("gcs-without-bucket", {f"{S3}.type": "gcs"}, S3, "cel"),
        case("nfs-without-path", {f"{S3}.type": "nfs", f"{S3}.nfsServer": "nfs.example"}, S3, "cel"),
        case(
            "s3-bucket-twice",
            {f"{S3}.type": "s3", f"{S3}.s3Bucket": "a", f"{S3}.s3": {"bucket": "b"}},
            S3,
            "cel",
        ),
        case("pvcName-and-pvc", {f"{S3}.pvcName": "a", f"{S3}.pvc": {"claimName": "b"}}, S3, "cel"),
        case("s3-settings-with-pvc-type", {f"{S3}.type": "pvc", f"{S3}.s3Bucket": "a"}, S3, "cel"),
        case(
            "pvc-claim-and-create",
            {f"{S3}.pvc": {"claimName": "a", "create": {"size": "1Gi"}}},
            f"{S3}.pvc",
            "cel",
        ),
        case(
            "mountPath-shadows-config",
            {"spec.checkpoint.mountPath": contract.CONFIG_MOUNT_PATH},
            "spec.checkpoint.mountPath",
            "cel",
        ),
        case(
            "mountPath-dot-dot-into-config",
            {"spec.checkpoint.mountPath": "/checkpoints/../etc/trainingjob"},
            "spec.checkpoint.mountPath",
            "cel",
        ),
        case(
            "mountPath-dot-segment",
            {"spec.checkpoint.mountPath": "/data/./ckpt"},
            "spec.checkpoint.mountPath",
            "cel",
        ),
        case(
            "mountPath-under-shm",
            {"spec.checkpoint.mountPath": "/dev/shm/ckpt"},
            "spec.checkpoint.mountPath",
            "cel",
        ),
        case(
            "metricsPort-equals-masterPort",
            {"spec.monitoring.enabled": True, "spec.monitoring.metricsPort": 29500},
            "spec.monitoring.metricsPort",
            "cel",
        ),
        case(
            "restartOnStall-without-deadline",
            {"spec.monitoring.restartOnStall": True},
            "spec.monitoring.restartOnStall",
            "cel",
        ),
        case(
            "toleration-exists-with-value",
            {"spec.scheduling.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
            "spec.scheduling.tolerations[0]",
            "cel",
        ),
        case(
            "toleration-empty-key-equal",
            {"spec.scheduling.tolerations": [{"operator": "Equal", "value": "v"}]},
            "spec.scheduling.tolerations[0]",
            "cel",
        ),
        case(
            "toleration-seconds-without-NoExecute",
            {"spec.scheduling.tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 30}]},
            "spec.scheduling.tolerations[0]",
            "cel",
        ),
        case(
            "additionalParams-key-not-identifier",
            {"spec.hyperparameters.additionalParams": {"weight-decay": "0.01"}},
            "spec.hyperparameters.additionalParams",
            "cel",
        ),
        case(
            "additionalParams-key-too-long",
            {"spec.hyperparameters.additionalParams": {"k" * 129: "0.01"}},
            "spec.hyperparameters.additionalParams",
            "cel",
        ),
    ]


MANAGED_BY = "spec.managedBy"


def _transition_cases() -> list[InvalidCase]:
    return [
        transition("model-changed", {}, {"spec.model": "resnet50"}, "spec.model"),
        transition("dataset-changed", {}, {"spec.dataset": "cifar10"}, "spec.dataset"),
        transition("framework-changed", {}, {"spec.framework": "jax"}, "spec.framework"),
        transition("gpusPerWorker-changed", {}, {"spec.gpusPerWorker": 2}, "spec.gpusPerWorker"),
        transition("image-added", {}, {"spec.image": "python:3.11-slim"}, "spec.image"),
        transition(
            "image-changed",
            {"spec.image": "python:3.11-slim"},
            {"spec.image": "python:3.12-slim"},
            "spec.image",
        ),
        transition(
            "command-changed",
            {"spec.command": ["python", "a.py"]},
            {"spec.command": ["python", "b.py"]},
            "spec.command",
        ),
        transition("args-removed", {"spec.args": ["--fast"]}, {}, "spec.args"),
        transition(
            "env-changed",
            {"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}]},
            {"spec.env": [{"name": "NCCL_DEBUG", "value": "WARN"}]},
            "spec.env",
        ),
        transition(
            "env-valueFrom-changed",
            {"spec.env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "a", "key": "k"}}}]},
            {"spec.env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "b", "key": "k"}}}]},
            "spec.env",
        ),
        transition(
            "resources-changed",
            {"spec.resources.limits": {"memory": "8Gi"}},
            {"spec.resources.limits": {"memory": "16Gi"}},
            "spec.resources",
        ),
        transition(
            "hyperparameters-changed",
            {"spec.hyperparameters.epochs": 10},
            {"spec.hyperparameters.epochs": 20},
            "spec.hyperparameters",
        ),
        transition("hyperparameters-added", {}, {"spec.hyperparameters.epochs": 20}, "spec.hyperparameters"),
        transition(
            "storage-changed",
            {"spec.checkpoint.enabled": True},
            {"spec.checkpoint.enabled": True, f"{S3}.type": "s3", f"{S3}.s3Bucket": "b"},
            S3,
        ),
        transition("networking-changed", {}, {"spec.networking.masterPort": 29600}, "spec.networking"),
        transition("backend-set", {}, {"spec.networking.backend": "gloo"}, "spec.networking"),
        transition("managedBy-added", {}, {MANAGED_BY: contract.MULTIKUEUE_CONTROLLER}, MANAGED_BY),
        transition("managedBy-removed", {MANAGED_BY: contract.MULTIKUEUE_CONTROLLER}, {}, MANAGED_BY),
        case("managedBy-unknown", {MANAGED_BY: "example.com/other-controller"}, MANAGED_BY, "schema"),
    ]


def invalid_cases() -> list[InvalidCase]:
    return [
        *schema_cases(),
        *_list_cases(),
        *_unknown_field_cases(),
        *_cel_cases(),
        *_transition_cases(),
        *embedded_type_cases(),
        *elastic_invalid_cases(),
        *tensorflow_invalid_cases(),
        *frameworks_invalid_cases(),
        *mpi_invalid_cases(),
    ]


def example_manifests() -> dict[str, dict[str, Any]]:
    """The TrainingJob of each example of examples/, by file name (a file may hold the objects the job
    uses before it)."""
    return {
        path.name: next(
            doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == contract.KIND
        )
        for path in sorted(EXAMPLES_DIR.glob("trainingjob-*.yaml"))
    }


def valid_manifests() -> dict[str, dict[str, Any]]:
    """The examples plus manifests exercising each storage form and policy the examples leave out."""
    extra = {
        "cpu-only-gloo": job({"spec.gpusPerWorker": 0, "spec.networking.backend": "gloo"}),
        "restart-in-place": job({"spec.failurePolicy.restartStrategy": "InPlace"}),
        "name-at-limit": job({"spec.numWorkers": contract.MAX_WORKERS}, name="a" * contract.MAX_JOB_NAME),
        "mig-slices-nccl": job(
            {
                "spec.gpusPerWorker": 0,
                "spec.networking.backend": "nccl",
                "spec.resources.limits": {"nvidia.com/mig-1g.5gb": 1},
            }
        ),
        "pvc-existing-claim": job({"spec.checkpoint.enabled": True, f"{S3}.pvc": {"claimName": "shared"}}),
        "pvc-short-form": job({"spec.checkpoint.enabled": True, f"{S3}.pvcName": "shared"}),
        "pvc-created": job(
            {
                "spec.checkpoint.enabled": True,
                f"{S3}.pvc": {
                    "create": {"size": "50Gi", "storageClassName": "fast", "accessModes": ["ReadWriteOnce"]}
                },
            }
        ),
        "s3-block-with-credentials": job(
            {
                "spec.checkpoint.enabled": True,
                f"{S3}.type": "s3",
                f"{S3}.s3": {
                    "bucket": "ckpt",
                    "prefix": "runs/a",
                    "endpoint": "http://minio.storage:9000",
                    "region": "us-east-1",
                    "credentialsSecret": "s3-credentials",
                },
            }
        ),
        "gcs-short-form": job(
            {"spec.checkpoint.enabled": True, f"{S3}.type": "gcs", f"{S3}.gcsBucket": "ckpt"}
        ),
        "nfs-block": job(
            {
                "spec.checkpoint.enabled": True,
                f"{S3}.type": "nfs",
                f"{S3}.nfs": {"server": "10.0.0.2", "path": "/exports"},
            }
        ),
        "nfs-short-form": job(
            {
                "spec.checkpoint.enabled": True,
                f"{S3}.type": "nfs",
                f"{S3}.nfsServer": "nfs",
                f"{S3}.nfsPath": "/x",
            }
        ),
        "exit-code-policy": job(
            {
                "spec.failurePolicy.restartPolicy": "ExitCode",
                "spec.failurePolicy.retryableExitCodes": [1],
                "spec.failurePolicy.permanentExitCodes": [137],
            }
        ),
        "env-sources": job(
            {
                "spec.env": [
                    {"name": "NCCL_DEBUG", "value": "INFO"},
                    {"name": "PYTHONUNBUFFERED", "value": "0"},
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                    {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                    {"name": "EMPTY"},
                ]
            }
        ),
        "stall-restart": job(
            {"spec.monitoring.progressDeadlineSeconds": 600, "spec.monitoring.restartOnStall": True}
        ),
        "gang-scheduling": job(
            {"spec.scheduling.gangScheduling": True, "spec.scheduling.scheduleTimeoutSeconds": 300}
        ),
    }
    return {
        **example_manifests(),
        **extra,
        **podtemplate_manifests(),
        **elastic_valid_manifests(),
        **tensorflow_valid_manifests(),
        **frameworks_valid_manifests(),
        **mpi_valid_manifests(),
    }


def valid_updates() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(id, before, after) pairs the API server must accept: the mutable fields."""
    return [
        ("numWorkers-scaled", job(), job({"spec.numWorkers": 4})),
        ("suspended", job(), job({"spec.suspend": True})),
        (
            "resumeFrom-changed",
            job({"spec.checkpoint.enabled": True}),
            job({"spec.checkpoint.enabled": True, "spec.checkpoint.resumeFrom": "epoch-3"}),
        ),
        ("checkpoint-enabled", job(), job({"spec.checkpoint.enabled": True, "spec.checkpoint.frequency": 2})),
        ("nodeSelector-added", job(), job({"spec.scheduling.nodeSelector": {"pool": "a100"}})),
        ("backoffLimit-raised", job(), job({"spec.failurePolicy.backoffLimit": 10})),
        ("ttl-set", job(), job({"spec.ttlSecondsAfterFinished": 3600})),
        ("monitoring-enabled", job(), job({"spec.monitoring.enabled": True})),
        *elastic_valid_updates(),
        *tensorflow_valid_updates(),
    ]


__all__ = ["InvalidCase", "base_job", "example_manifests", "invalid_cases", "job", "valid_manifests"]
