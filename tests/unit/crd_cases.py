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
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from crd import contract

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
Layer = Literal["schema", "list", "unknown-field", "cel", "transition"]


def base_job(name: str = "case-job") -> dict[str, Any]:
    """A minimal valid TrainingJob."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": {"model": "cnn", "dataset": "mnist", "numWorkers": 2, "gpusPerWorker": 1},
    }


def _set(manifest: dict[str, Any], path: str, value: Any) -> None:
    node = manifest
    *parents, last = path.split(".")
    for name in parents:
        node = node.setdefault(name, {})
    if value is _DELETE:
        node.pop(last, None)
    else:
        node[last] = copy.deepcopy(value)


_DELETE = object()


def job(changes: dict[str, Any] | None = None, *, name: str = "case-job") -> dict[str, Any]:
    """base_job with dotted-path changes applied, e.g. {"spec.checkpoint.enabled": True}."""
    manifest = base_job(name)
    for path, value in (changes or {}).items():
        _set(manifest, path, value)
    return manifest


@dataclass(frozen=True)
class InvalidCase:
    id: str
    manifest: dict[str, Any]
    field: str
    layer: Layer
    before: dict[str, Any] | None = None


def _case(id_: str, changes: dict[str, Any], path: str, layer: Layer) -> InvalidCase:
    return InvalidCase(id_, job(changes), path, layer)


def _transition(id_: str, before: dict[str, Any], after: dict[str, Any], path: str) -> InvalidCase:
    return InvalidCase(id_, job(after), path, "transition", before=job(before))


LONG_NAME = "a" * (contract.MAX_JOB_NAME + 1)
S3 = "spec.checkpoint.storage"


def _schema_cases() -> list[InvalidCase]:
    return [
        _case("numWorkers-zero", {"spec.numWorkers": 0}, "spec.numWorkers", "schema"),
        _case("numWorkers-above-100", {"spec.numWorkers": 101}, "spec.numWorkers", "schema"),
        _case("numWorkers-string", {"spec.numWorkers": "two"}, "spec.numWorkers", "schema"),
        _case("numWorkers-missing", {"spec.numWorkers": _DELETE}, "spec.numWorkers", "schema"),
        _case("model-missing", {"spec.model": _DELETE}, "spec.model", "schema"),
        _case("model-empty", {"spec.model": ""}, "spec.model", "schema"),
        _case("dataset-missing", {"spec.dataset": _DELETE}, "spec.dataset", "schema"),
        _case("gpusPerWorker-above-16", {"spec.gpusPerWorker": 17}, "spec.gpusPerWorker", "schema"),
        _case("gpusPerWorker-negative", {"spec.gpusPerWorker": -1}, "spec.gpusPerWorker", "schema"),
        _case("framework-unknown", {"spec.framework": "mxnet"}, "spec.framework", "schema"),
        _case("suspend-string", {"spec.suspend": "yes"}, "spec.suspend", "schema"),
        _case("cleanPodPolicy-unknown", {"spec.cleanPodPolicy": "Some"}, "spec.cleanPodPolicy", "schema"),
        _case("ttl-negative", {"spec.ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished", "schema"),
        # Numbers the operator computes times with are bounded: a TTL of 1e12 s is past year 9999.
        _case("ttl-huge", {"spec.ttlSecondsAfterFinished": 10**12}, "spec.ttlSecondsAfterFinished", "schema"),
        _case(
            "activeDeadline-huge",
            {"spec.failurePolicy.activeDeadlineSeconds": 2**31},
            "spec.failurePolicy.activeDeadlineSeconds",
            "schema",
        ),
        _case(
            "backoff-initial-huge",
            {"spec.failurePolicy.restartBackoff": {"initialDelaySeconds": 10**12}},
            "spec.failurePolicy.restartBackoff.initialDelaySeconds",
            "schema",
        ),
        _case(
            "backoff-multiplier-huge",
            {"spec.failurePolicy.restartBackoff": {"multiplier": 1e308}},
            "spec.failurePolicy.restartBackoff.multiplier",
            "schema",
        ),
        _case(
            "scheduleTimeout-huge",
            {"spec.scheduling.scheduleTimeoutSeconds": 2**40},
            "spec.scheduling.scheduleTimeoutSeconds",
            "schema",
        ),
        _case(
            "mountPath-double-slash",
            {"spec.checkpoint.mountPath": "/dev//shm"},
            "spec.checkpoint.mountPath",
            "schema",
        ),
        _case(
            "mountPath-trailing-slash",
            {"spec.checkpoint.mountPath": "/data/"},
            "spec.checkpoint.mountPath",
            "schema",
        ),
        _case("command-not-list", {"spec.command": "python train.py"}, "spec.command", "schema"),
        _case(
            "learningRate-zero",
            {"spec.hyperparameters.learningRate": 0},
            "spec.hyperparameters.learningRate",
            "schema",
        ),
        _case(
            "batchSize-zero",
            {"spec.hyperparameters.batchSize": 0},
            "spec.hyperparameters.batchSize",
            "schema",
        ),
        _case("epochs-zero", {"spec.hyperparameters.epochs": 0}, "spec.hyperparameters.epochs", "schema"),
        _case(
            "optimizer-unknown",
            {"spec.hyperparameters.optimizer": "adagrad"},
            "spec.hyperparameters.optimizer",
            "schema",
        ),
        _case(
            "additionalParams-number",
            {"spec.hyperparameters.additionalParams": {"dropout": 0.1}},
            "spec.hyperparameters.additionalParams.dropout",
            "schema",
        ),
        _case(
            "checkpoint-frequency-zero",
            {"spec.checkpoint.frequency": 0},
            "spec.checkpoint.frequency",
            "schema",
        ),
        _case(
            "checkpoint-retention-zero",
            {"spec.checkpoint.retention": 0},
            "spec.checkpoint.retention",
            "schema",
        ),
        _case(
            "mountPath-relative", {"spec.checkpoint.mountPath": "ckpt"}, "spec.checkpoint.mountPath", "schema"
        ),
        _case("storage-type-unknown", {f"{S3}.type": "ftp"}, f"{S3}.type", "schema"),
        _case(
            "s3-endpoint-not-url",
            {f"{S3}.type": "s3", f"{S3}.s3": {"bucket": "b", "endpoint": "minio:9000"}},
            f"{S3}.s3.endpoint",
            "schema",
        ),
        _case(
            "memory-not-quantity",
            {"spec.resources.limits": {"memory": "lots"}},
            "spec.resources.limits.memory",
            "schema",
        ),
        _case(
            "cpu-negative",
            {"spec.resources.requests": {"cpu": "-1"}},
            "spec.resources.requests.cpu",
            "schema",
        ),
        _case(
            "env-name-invalid", {"spec.env": [{"name": "1=BAD", "value": "x"}]}, "spec.env[0].name", "schema"
        ),
        _case("env-name-missing", {"spec.env": [{"value": "x"}]}, "spec.env[0].name", "schema"),
        _case(
            "toleration-operator-unknown",
            {"spec.scheduling.tolerations": [{"key": "k", "operator": "In"}]},
            "spec.scheduling.tolerations[0].operator",
            "schema",
        ),
        _case(
            "toleration-effect-unknown",
            {"spec.scheduling.tolerations": [{"key": "k", "operator": "Exists", "effect": "NoRun"}]},
            "spec.scheduling.tolerations[0].effect",
            "schema",
        ),
        _case(
            "priority-not-dns",
            {"spec.scheduling.priority": "High_Priority"},
            "spec.scheduling.priority",
            "schema",
        ),
        _case(
            "scheduleTimeout-zero",
            {"spec.scheduling.scheduleTimeoutSeconds": 0},
            "spec.scheduling.scheduleTimeoutSeconds",
            "schema",
        ),
        _case(
            "metricsPort-too-high",
            {"spec.monitoring.metricsPort": 70000},
            "spec.monitoring.metricsPort",
            "schema",
        ),
        _case(
            "masterPort-privileged",
            {"spec.networking.masterPort": 80},
            "spec.networking.masterPort",
            "schema",
        ),
        _case("backend-unknown", {"spec.networking.backend": "nccl2"}, "spec.networking.backend", "schema"),
        _case(
            "restartPolicy-unknown",
            {"spec.failurePolicy.restartPolicy": "Always"},
            "spec.failurePolicy.restartPolicy",
            "schema",
        ),
        _case(
            "backoffLimit-above-100",
            {"spec.failurePolicy.backoffLimit": 101},
            "spec.failurePolicy.backoffLimit",
            "schema",
        ),
        _case(
            "exit-code-above-255",
            {"spec.failurePolicy.restartPolicy": "ExitCode", "spec.failurePolicy.retryableExitCodes": [256]},
            "spec.failurePolicy.retryableExitCodes[0]",
            "schema",
        ),
        _case(
            "backoff-multiplier-below-1",
            {"spec.failurePolicy.restartBackoff": {"multiplier": 0.5}},
            "spec.failurePolicy.restartBackoff.multiplier",
            "schema",
        ),
        _case(
            "targetAccuracy-above-1",
            {"spec.successPolicy.targetAccuracy": 1.5},
            "spec.successPolicy.targetAccuracy",
            "schema",
        ),
        _case(
            "successPolicy-mode-unknown",
            {"spec.successPolicy.mode": "Majority"},
            "spec.successPolicy.mode",
            "schema",
        ),
        _case(
            "earlyStoppingPatience-zero",
            {"spec.successPolicy.earlyStoppingPatience": 0},
            "spec.successPolicy.earlyStoppingPatience",
            "schema",
        ),
    ]


def _list_cases() -> list[InvalidCase]:
    return [
        _case(
            "env-duplicate-name",
            {"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG", "value": "WARN"}]},
            "spec.env[1]",
            "list",
        ),
        _case(
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
        _case("spec-unknown-field", {"spec.numGPUs": 2}, "spec.numGPUs", "unknown-field"),
        _case(
            "hyperparameters-snake-case",
            {"spec.hyperparameters.learning_rate": 0.1},
            "spec.hyperparameters.learning_rate",
            "unknown-field",
        ),
        _case(
            "s3-misspelled",
            {f"{S3}.type": "s3", f"{S3}.s3": {"bucket": "b", "bukket": "c"}},
            f"{S3}.s3.bukket",
            "unknown-field",
        ),
    ]


def _cel_cases() -> list[InvalidCase]:
    return [
        InvalidCase("name-too-long", job(name=LONG_NAME), "metadata.name", "cel"),
        InvalidCase("name-starts-with-digit", job(name="1-training"), "metadata.name", "cel"),
        InvalidCase("name-with-dot", job(name="bert.v2"), "metadata.name", "cel"),
        _case(
            "env-reserved-name", {"spec.env": [{"name": "WORLD_SIZE", "value": "8"}]}, "spec.env[0]", "cel"
        ),
        _case(
            "env-reserved-tf-config",
            {"spec.env": [{"name": "TF_CONFIG", "value": "{}"}]},
            "spec.env[0]",
            "cel",
        ),
        _case(
            "env-reserved-prefix",
            {"spec.env": [{"name": "HP_DROPOUT", "value": "0.1"}]},
            "spec.env[0]",
            "cel",
        ),
        _case(
            "env-value-and-valueFrom",
            {
                "spec.env": [
                    {"name": "TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
                ]
            },
            "spec.env[0]",
            "cel",
        ),
        _case(
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
        _case(
            "gpu-limit-mismatch",
            {"spec.gpusPerWorker": 2, "spec.resources.limits": {contract.GPU_RESOURCE: "4"}},
            "spec.resources.limits",
            "cel",
        ),
        _case(
            "gpu-request-mismatch",
            {"spec.gpusPerWorker": 0, "spec.resources.requests": {contract.GPU_RESOURCE: 1}},
            "spec.resources.requests",
            "cel",
        ),
        _case(
            "requests-above-limits",
            {"spec.resources.requests": {"cpu": "8"}, "spec.resources.limits": {"cpu": "4"}},
            "spec.resources.requests",
            "cel",
        ),
        _case(
            "exit-codes-overlap",
            {
                "spec.failurePolicy.restartPolicy": "ExitCode",
                "spec.failurePolicy.retryableExitCodes": [137, 1],
                "spec.failurePolicy.permanentExitCodes": [1, 2],
            },
            "spec.failurePolicy.permanentExitCodes",
            "cel",
        ),
        _case(
            "exit-codes-without-ExitCode-policy",
            {"spec.failurePolicy.retryableExitCodes": [137]},
            "spec.failurePolicy.restartPolicy",
            "cel",
        ),
        _case(
            "backoff-max-below-initial",
            {"spec.failurePolicy.restartBackoff": {"initialDelaySeconds": 60, "maxDelaySeconds": 30}},
            "spec.failurePolicy.restartBackoff.maxDelaySeconds",
            "cel",
        ),
        _case("s3-without-bucket", {f"{S3}.type": "s3"}, S3, "cel"),
        _case("s3-block-without-bucket", {f"{S3}.type": "s3", f"{S3}.s3": {"prefix": "runs"}}, S3, "cel"),
        _case("gcs-without-bucket", {f"{S3}.type": "gcs"}, S3, "cel"),
        _case("nfs-without-path", {f"{S3}.type": "nfs", f"{S3}.nfsServer": "nfs.example"}, S3, "cel"),
        _case(
            "s3-bucket-twice",
            {f"{S3}.type": "s3", f"{S3}.s3Bucket": "a", f"{S3}.s3": {"bucket": "b"}},
            S3,
            "cel",
        ),
        _case("pvcName-and-pvc", {f"{S3}.pvcName": "a", f"{S3}.pvc": {"claimName": "b"}}, S3, "cel"),
        _case("s3-settings-with-pvc-type", {f"{S3}.type": "pvc", f"{S3}.s3Bucket": "a"}, S3, "cel"),
        _case(
            "pvc-claim-and-create",
            {f"{S3}.pvc": {"claimName": "a", "create": {"size": "1Gi"}}},
            f"{S3}.pvc",
            "cel",
        ),
        _case(
            "mountPath-shadows-config",
            {"spec.checkpoint.mountPath": contract.CONFIG_MOUNT_PATH},
            "spec.checkpoint.mountPath",
            "cel",
        ),
        _case(
            "mountPath-dot-dot-into-config",
            {"spec.checkpoint.mountPath": "/checkpoints/../etc/trainingjob"},
            "spec.checkpoint.mountPath",
            "cel",
        ),
        _case(
            "mountPath-dot-segment",
            {"spec.checkpoint.mountPath": "/data/./ckpt"},
            "spec.checkpoint.mountPath",
            "cel",
        ),
        _case(
            "mountPath-under-shm",
            {"spec.checkpoint.mountPath": "/dev/shm/ckpt"},
            "spec.checkpoint.mountPath",
            "cel",
        ),
        _case(
            "metricsPort-equals-masterPort",
            {"spec.monitoring.enabled": True, "spec.monitoring.metricsPort": 29500},
            "spec.monitoring.metricsPort",
            "cel",
        ),
        _case(
            "restartOnStall-without-deadline",
            {"spec.monitoring.restartOnStall": True},
            "spec.monitoring.restartOnStall",
            "cel",
        ),
        _case(
            "toleration-exists-with-value",
            {"spec.scheduling.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
            "spec.scheduling.tolerations[0]",
            "cel",
        ),
        _case(
            "toleration-empty-key-equal",
            {"spec.scheduling.tolerations": [{"operator": "Equal", "value": "v"}]},
            "spec.scheduling.tolerations[0]",
            "cel",
        ),
        _case(
            "toleration-seconds-without-NoExecute",
            {"spec.scheduling.tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 30}]},
            "spec.scheduling.tolerations[0]",
            "cel",
        ),
        _case(
            "additionalParams-key-not-identifier",
            {"spec.hyperparameters.additionalParams": {"weight-decay": "0.01"}},
            "spec.hyperparameters.additionalParams",
            "cel",
        ),
    ]


def _transition_cases() -> list[InvalidCase]:
    return [
        _transition("model-changed", {}, {"spec.model": "resnet50"}, "spec.model"),
        _transition("dataset-changed", {}, {"spec.dataset": "cifar10"}, "spec.dataset"),
        _transition("framework-changed", {}, {"spec.framework": "jax"}, "spec.framework"),
        _transition("gpusPerWorker-changed", {}, {"spec.gpusPerWorker": 2}, "spec.gpusPerWorker"),
        _transition("image-added", {}, {"spec.image": "python:3.11-slim"}, "spec.image"),
        _transition(
            "image-changed",
            {"spec.image": "python:3.11-slim"},
            {"spec.image": "python:3.12-slim"},
            "spec.image",
        ),
        _transition(
            "command-changed",
            {"spec.command": ["python", "a.py"]},
            {"spec.command": ["python", "b.py"]},
            "spec.command",
        ),
        _transition("args-removed", {"spec.args": ["--fast"]}, {}, "spec.args"),
        _transition(
            "env-changed",
            {"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}]},
            {"spec.env": [{"name": "NCCL_DEBUG", "value": "WARN"}]},
            "spec.env",
        ),
        _transition(
            "env-valueFrom-changed",
            {"spec.env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "a", "key": "k"}}}]},
            {"spec.env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "b", "key": "k"}}}]},
            "spec.env",
        ),
        _transition(
            "resources-changed",
            {"spec.resources.limits": {"memory": "8Gi"}},
            {"spec.resources.limits": {"memory": "16Gi"}},
            "spec.resources",
        ),
        _transition(
            "hyperparameters-changed",
            {"spec.hyperparameters.epochs": 10},
            {"spec.hyperparameters.epochs": 20},
            "spec.hyperparameters",
        ),
        _transition("hyperparameters-added", {}, {"spec.hyperparameters.epochs": 20}, "spec.hyperparameters"),
        _transition(
            "storage-changed",
            {"spec.checkpoint.enabled": True},
            {"spec.checkpoint.enabled": True, f"{S3}.type": "s3", f"{S3}.s3Bucket": "b"},
            S3,
        ),
        _transition("networking-changed", {}, {"spec.networking.masterPort": 29600}, "spec.networking"),
        _transition("backend-set", {}, {"spec.networking.backend": "gloo"}, "spec.networking"),
    ]


def invalid_cases() -> list[InvalidCase]:
    return [*_schema_cases(), *_list_cases(), *_unknown_field_cases(), *_cel_cases(), *_transition_cases()]


def example_manifests() -> dict[str, dict[str, Any]]:
    """The product README's four examples, by file name."""
    return {
        path.name: yaml.safe_load(path.read_text())
        for path in sorted(EXAMPLES_DIR.glob("trainingjob-*.yaml"))
    }


def valid_manifests() -> dict[str, dict[str, Any]]:
    """The examples plus manifests exercising each storage form and policy the examples leave out."""
    extra = {
        "cpu-only-gloo": job({"spec.gpusPerWorker": 0, "spec.networking.backend": "gloo"}),
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
    return {**example_manifests(), **extra}


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
    ]
