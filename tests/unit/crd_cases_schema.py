"""The schema-level cases of tests/unit/crd_cases.py: manifests OpenAPI validation must reject (types,
bounds, enums, patterns, required), each with the field its error must name.

Split out of tests/unit/crd_cases.py (which puts every table together: `invalid_cases()`) because
this table alone is as long as the others together.
"""

from __future__ import annotations

from tests.unit.crd_case_model import DELETE, InvalidCase, case

S3 = "spec.checkpoint.storage"


def schema_cases() -> list[InvalidCase]:
    return [
        case("numWorkers-zero", {"spec.numWorkers": 0}, "spec.numWorkers", "schema"),
        case("numWorkers-above-100", {"spec.numWorkers": 101}, "spec.numWorkers", "schema"),
        case("numWorkers-string", {"spec.numWorkers": "two"}, "spec.numWorkers", "schema"),
        case("numWorkers-missing", {"spec.numWorkers": DELETE}, "spec.numWorkers", "schema"),
        case("model-missing", {"spec.model": DELETE}, "spec.model", "schema"),
        case("model-empty", {"spec.model": ""}, "spec.model", "schema"),
        case("dataset-missing", {"spec.dataset": DELETE}, "spec.dataset", "schema"),
        case("gpusPerWorker-above-16", {"spec.gpusPerWorker": 17}, "spec.gpusPerWorker", "schema"),
        case("gpusPerWorker-negative", {"spec.gpusPerWorker": -1}, "spec.gpusPerWorker", "schema"),
        case("framework-unknown", {"spec.framework": "caffe"}, "spec.framework", "schema"),
        case(
            "volcano-queue-not-a-name",
            {"spec.scheduling.gangScheduling": True, "spec.scheduling.queue": "Team A"},
            "spec.scheduling.queue",
            "schema",
        ),
        case("suspend-string", {"spec.suspend": "yes"}, "spec.suspend", "schema"),
        case("cleanPodPolicy-unknown", {"spec.cleanPodPolicy": "Some"}, "spec.cleanPodPolicy", "schema"),
        case("ttl-negative", {"spec.ttlSecondsAfterFinished": -1}, "spec.ttlSecondsAfterFinished", "schema"),
        # Numbers the operator computes times with are bounded: a TTL of 1e12 s is past year 9999.
        case("ttl-huge", {"spec.ttlSecondsAfterFinished": 10**12}, "spec.ttlSecondsAfterFinished", "schema"),
        case(
            "activeDeadline-huge",
            {"spec.failurePolicy.activeDeadlineSeconds": 2**31},
            "spec.failurePolicy.activeDeadlineSeconds",
            "schema",
        ),
        case(
            "backoff-initial-huge",
            {"spec.failurePolicy.restartBackoff": {"initialDelaySeconds": 10**12}},
            "spec.failurePolicy.restartBackoff.initialDelaySeconds",
            "schema",
        ),
        case(
            "backoff-multiplier-huge",
            {"spec.failurePolicy.restartBackoff": {"multiplier": 1e308}},
            "spec.failurePolicy.restartBackoff.multiplier",
            "schema",
        ),
        case(
            "scheduleTimeout-huge",
            {"spec.scheduling.scheduleTimeoutSeconds": 2**40},
            "spec.scheduling.scheduleTimeoutSeconds",
            "schema",
        ),
        case(
            "mountPath-double-slash",
            {"spec.checkpoint.mountPath": "/dev//shm"},
            "spec.checkpoint.mountPath",
            "schema",
        ),
        case(
            "mountPath-trailing-slash",
            {"spec.checkpoint.mountPath": "/data/"},
            "spec.checkpoint.mountPath",
            "schema",
        ),
        case("command-not-list", {"spec.command": "python train.py"}, "spec.command", "schema"),
        # Found by make fuzz: the Pod API refuses these, so the job could only fail after admission.
        case("image-empty", {"spec.image": ""}, "spec.image", "schema"),
        case("image-surrounding-space", {"spec.image": " pytorch/pytorch "}, "spec.image", "schema"),
        case(
            "learningRate-zero",
            {"spec.hyperparameters.learningRate": 0},
            "spec.hyperparameters.learningRate",
            "schema",
        ),
        case(
            "batchSize-zero",
            {"spec.hyperparameters.batchSize": 0},
            "spec.hyperparameters.batchSize",
            "schema",
        ),
        case("epochs-zero", {"spec.hyperparameters.epochs": 0}, "spec.hyperparameters.epochs", "schema"),
        case(
            "optimizer-unknown",
            {"spec.hyperparameters.optimizer": "adagrad"},
            "spec.hyperparameters.optimizer",
            "schema",
        ),
        case(
            "additionalParams-number",
            {"spec.hyperparameters.additionalParams": {"dropout": 0.1}},
            "spec.hyperparameters.additionalParams.dropout",
            "schema",
        ),
        case(
            "checkpoint-frequency-zero",
            {"spec.checkpoint.frequency": 0},
            "spec.checkpoint.frequency",
            "schema",
        ),
        case(
            "checkpoint-retention-zero",
            {"spec.checkpoint.retention": 0},
            "spec.checkpoint.retention",
            "schema",
        ),
        case(
            "mountPath-relative", {"spec.checkpoint.mountPath": "ckpt"}, "spec.checkpoint.mountPath", "schema"
        ),
        case("storage-type-unknown", {f"{S3}.type": "ftp"}, f"{S3}.type", "schema"),
        case(
            "s3-endpoint-not-url",
            {f"{S3}.type": "s3", f"{S3}.s3": {"bucket": "b", "endpoint": "minio:9000"}},
            f"{S3}.s3.endpoint",
            "schema",
        ),
        case(
            "memory-not-quantity",
            {"spec.resources.limits": {"memory": "lots"}},
            "spec.resources.limits.memory",
            "schema",
        ),
        case(
            "cpu-negative",
            {"spec.resources.requests": {"cpu": "-1"}},
            "spec.resources.requests.cpu",
            "schema",
        ),
        case(
            "env-name-invalid", {"spec.env": [{"name": "1=BAD", "value": "x"}]}, "spec.env[0].name", "schema"
        ),
        case("env-name-missing", {"spec.env": [{"value": "x"}]}, "spec.env[0].name", "schema"),
        case(
            "toleration-operator-unknown",
            {"spec.scheduling.tolerations": [{"key": "k", "operator": "In"}]},
            "spec.scheduling.tolerations[0].operator",
            "schema",
        ),
        case(
            "toleration-effect-unknown",
            {"spec.scheduling.tolerations": [{"key": "k", "operator": "Exists", "effect": "NoRun"}]},
            "spec.scheduling.tolerations[0].effect",
            "schema",
        ),
        case(
            "priority-not-dns",
            {"spec.scheduling.priority": "High_Priority"},
            "spec.scheduling.priority",
            "schema",
        ),
        case(
            "scheduleTimeout-zero",
            {"spec.scheduling.scheduleTimeoutSeconds": 0},
            "spec.scheduling.scheduleTimeoutSeconds",
            "schema",
        ),
        case(
            "metricsPort-too-high",
            {"spec.monitoring.metricsPort": 70000},
            "spec.monitoring.metricsPort",
            "schema",
        ),
        # An MLflow URI the trainer could not log to: refused at admission, not found out in the pod.
        *(
            case(
                f"mlflowTrackingUri-{label}",
                {"spec.monitoring.mlflowTrackingUri": uri},
                "spec.monitoring.mlflowTrackingUri",
                "schema",
            )
            for label, uri in (
                ("no-scheme", "mlflow.ml-infra:5000"),
                ("other-scheme", "ftp://mlflow:5000"),
                ("space", "http://mlflow :5000"),
                ("no-host", "http:///experiments"),
            )
        ),
        case(
            "masterPort-privileged",
            {"spec.networking.masterPort": 80},
            "spec.networking.masterPort",
            "schema",
        ),
        case("backend-unknown", {"spec.networking.backend": "nccl2"}, "spec.networking.backend", "schema"),
        case(
            "restartPolicy-unknown",
            {"spec.failurePolicy.restartPolicy": "Always"},
            "spec.failurePolicy.restartPolicy",
            "schema",
        ),
        case(
            "restartStrategy-unknown",
            {"spec.failurePolicy.restartStrategy": "Rolling"},
            "spec.failurePolicy.restartStrategy",
            "schema",
        ),
        case(
            "backoffLimit-above-100",
            {"spec.failurePolicy.backoffLimit": 101},
            "spec.failurePolicy.backoffLimit",
            "schema",
        ),
        case(
            "exit-code-above-255",
            {"spec.failurePolicy.restartPolicy": "ExitCode", "spec.failurePolicy.retryableExitCodes": [256]},
            "spec.failurePolicy.retryableExitCodes[0]",
            "schema",
        ),
        case(
            "backoff-multiplier-below-1",
            {"spec.failurePolicy.restartBackoff": {"multiplier": 0.5}},
            "spec.failurePolicy.restartBackoff.multiplier",
            "schema",
        ),
        case(
            "targetAccuracy-above-1",
            {"spec.successPolicy.targetAccuracy": 1.5},
            "spec.successPolicy.targetAccuracy",
            "schema",
        ),
        case(
            "successPolicy-mode-unknown",
            {"spec.successPolicy.mode": "Majority"},
            "spec.successPolicy.mode",
            "schema",
        ),
        case(
            "earlyStoppingPatience-zero",
            {"spec.successPolicy.earlyStoppingPatience": 0},
            "spec.successPolicy.earlyStoppingPatience",
            "schema",
        ),
    ]
