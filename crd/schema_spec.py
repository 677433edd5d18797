"""The OpenAPI schema of TrainingJob.spec: every field, its default, its bounds and its CEL rules.

This is the single statement of what a valid TrainingJob looks like. The API server enforces it at
admission (so a bad manifest is rejected by `kubectl apply` with a message naming the field), and
crd/defaults.py reads the same defaults back out of it, so the operator never restates them.

Every list, map and string is bounded (maxItems/maxProperties/maxLength): the API server estimates
the worst-case cost of each CEL rule from those bounds and refuses rules it cannot bound.
"""

from __future__ import annotations

from crd import contract
from crd.kube_schemas import schema
from crd.openapi import (
    Schema,
    array,
    boolean,
    integer,
    number,
    obj,
    quantity_map,
    rule,
    string,
    string_map,
)
from crd.schema_elastic import elastic, elastic_rules
from crd.schema_failures import failure_policy
from crd.schema_frameworks import framework_rules, retired_framework_rules
from crd.schema_mpi import MPI_REFUSAL, mpi, mpi_rules
from crd.schema_parts import (
    DNS_SUBDOMAIN_PATTERN,
    IDENTIFIER_PATTERN,
    LABEL_VALUE_LENGTH,
    MAX_ENV,
    NAME_LENGTH,
    PARAM_KEY_LENGTH,
    PATH_LENGTH,
    URL_LENGTH,
    env_var,
    gpu_rule,
    managed_by,
    not_above,
    parses,
    string_list,
    toleration,
)
from crd.schema_podtemplate import pod_template, spec_rules
from crd.schema_storage import checkpoint
from crd.schema_tensorflow import tensorflow, tensorflow_rules
from crd.schema_topology import topology

# An http or https URL with a host: what an MLflow client in a pod can log to. Anything else (no scheme,
# a typo'd one, a bare path) would only fail inside the trainer, after the job was accepted.
MLFLOW_URI_PATTERN = r"^https?://[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?(:[0-9]{1,5})?(/[^\s]*)?$"


def resources() -> Schema:
    limit = 32
    request, cap = "self.requests[k]", "self.limits[k]"
    within = f"!(k in self.limits) || !{parses(request)} || !{parses(cap)} || {not_above(request, cap)}"
    return obj(
        "Compute resources of each worker's trainer container. nvidia.com/gpu is set from gpusPerWorker "
        "(requests and limits); if given here it must equal gpusPerWorker. Immutable.",
        {
            "requests": quantity_map('Minimum resources, e.g. cpu: "8", memory: 32Gi.', max_properties=limit),
            "limits": quantity_map("Maximum resources, e.g. memory: 64Gi.", max_properties=limit),
        },
        rules=[
            rule(
                f"!has(self.requests) || !has(self.limits) || self.requests.all(k, {within})",
                message="resources.requests must not exceed resources.limits for the same resource",
                field_path=".requests",
            )
        ],
    )


def hyperparameters() -> Schema:
    return obj(
        "Training hyperparameters, passed to the trainer as environment variables (LEARNING_RATE, ..., "
        "HP_<KEY>). Immutable.",
        {
            "learningRate": number("Learning rate.", minimum=0, exclusive_minimum=True),
            "batchSize": integer("Batch size per process.", minimum=1),
            "epochs": integer("Number of epochs; also status.totalEpochs.", minimum=1),
            "optimizer": string("Optimizer.", max_length=16, enum=["adam", "sgd", "adamw", "rmsprop"]),
            "warmupSteps": integer("Learning-rate warmup steps.", minimum=0),
            "gradientAccumulationSteps": integer("Micro-batches accumulated per optimizer step.", minimum=1),
            "mixedPrecision": boolean("Train with mixed precision (fp16/bf16)."),
            "additionalParams": string_map(
                "Further hyperparameters, passed as HP_<KEY upper-cased> environment variables. Keys must "
                f"be identifiers ([A-Za-z_][A-Za-z0-9_]*) of at most {PARAM_KEY_LENGTH} characters.",
                max_properties=64,
                value_max_length=1024,
                rules=[
                    rule(
                        f"self.all(k, k.matches('{IDENTIFIER_PATTERN}'))",
                        message=(
                            f"hyperparameters.additionalParams keys must match {IDENTIFIER_PATTERN}: they "
                            "become HP_<KEY> environment variables"
                        ),
                    ),
                    rule(
                        f"self.all(k, size(k) <= {PARAM_KEY_LENGTH})",
                        message=(
                            f"hyperparameters.additionalParams keys must be at most {PARAM_KEY_LENGTH} "
                            "characters"
                        ),
                    ),
                ],
            ),
        },
    )


def affinity() -> Schema:
    node = schema("Affinity")
    node["description"] = "Pod affinity rules (a core/v1 Affinity), copied to every worker pod."
    return node


def scheduling() -> Schema:
    return obj(
        "Where and how worker pods are scheduled.",
        {
            "priority": string(
                "Name of the PriorityClass of the worker pods (pod spec priorityClassName).",
                max_length=NAME_LENGTH,
                pattern=DNS_SUBDOMAIN_PATTERN,
            ),
            "nodeSelector": string_map(
                "Node labels every worker's node must have.",
                max_properties=64,
                value_max_length=LABEL_VALUE_LENGTH,
            ),
            "affinity": affinity(),
            "tolerations": array("Taints the worker pods tolerate.", toleration(), max_items=64),
            "schedulerName": string(
                "Scheduler for the worker pods. With gang scheduling the operator picks the gang scheduler's "
                "name unless this is set.",
                max_length=NAME_LENGTH,
            ),
            "gangScheduling": boolean(
                "Schedule all workers together through a PodGroup when the cluster runs scheduler-plugins' "
                "coscheduling or Volcano (detected from their CRDs; the operator's --gang-scheduler picks "
                "when both are); otherwise ignored.",
                default=False,
            ),
            "queue": string(
                "Volcano Queue of the job's PodGroup (gang scheduling with Volcano; ignored by "
                "scheduler-plugins). Unset: Volcano's default queue. The job's pods wait while the "
                "queue does not exist or is closed.",
                max_length=NAME_LENGTH,
                pattern=DNS_SUBDOMAIN_PATTERN,
            ),
            "scheduleTimeoutSeconds": integer(
                "If not every worker is scheduled within this time, the operator deletes the pods, backs off "
                "and tries again (counted in status.restarts.scheduling). Unset: wait indefinitely.",
                minimum=1,
            ),
            "topology": topology(),
        },
        default_empty=True,
        rules=[
            rule(
                "!has(self.queue) || self.gangScheduling",
                message="scheduling.queue names the Volcano Queue of the job's PodGroup: it needs "
                "scheduling.gangScheduling: true",
                field_path=".queue",
            )
        ],
    )


def monitoring() -> Schema:
    return obj(
        "Metrics, experiment tracking and stall detection.",
        {
            "enabled": boolean(
                "Expose the trainer's metrics port (METRICS_PORT, port name metrics).", default=False
            ),
            "metricsPort": integer(
                "Port of the trainer's metrics endpoint.", minimum=1, maximum=65535, default=8080
            ),
            "tensorboardEnabled": boolean("Write TensorBoard logs (TENSORBOARD_LOG_DIR).", default=False),
            "tensorboardLogDir": string(
                "TensorBoard log directory. Unset: <checkpoint.mountPath>/tensorboard when pvc or nfs "
                "checkpoint storage is in use, else /tmp/tensorboard.",
                max_length=PATH_LENGTH,
            ),
            "mlflowTrackingUri": string(
                "MLflow tracking server (MLFLOW_TRACKING_URI), an http or https URL. With it the reference "
                "trainer's rank 0 logs the job into one MLflow run across restarts, reported in "
                "status.tracking.",
                max_length=URL_LENGTH,
                pattern=MLFLOW_URI_PATTERN,
            ),
            "mlflowExperiment": string(
                "MLflow experiment (MLFLOW_EXPERIMENT_NAME); the job's name when unset.",
                max_length=NAME_LENGTH,
            ),
            "wandbProject": string("Weights & Biases project (WANDB_PROJECT).", max_length=NAME_LENGTH),
            "wandbEntity": string("Weights & Biases entity (WANDB_ENTITY).", max_length=NAME_LENGTH),
            "progressDeadlineSeconds": integer(
                "A Running job that reports no progress for this long gets condition Stalled.", minimum=1
            ),
            "restartOnStall": boolean(
                "Restart the workers when the job stalls (counted in status.restarts.stall); needs "
                "progressDeadlineSeconds.",
                default=False,
            ),
        },
        default_empty=True,
        rules=[
            rule(
                "!has(self.restartOnStall) || !self.restartOnStall || has(self.progressDeadlineSeconds)",
                message="monitoring.restartOnStall needs monitoring.progressDeadlineSeconds",
                field_path=".restartOnStall",
            )
        ],
    )


def networking() -> Schema:
    return obj(
        "Collective communication between the workers. Immutable.",
        {
            "backend": string(
                "torch.distributed backend (TORCH_DISTRIBUTED_BACKEND). Unset: nccl when "
                "gpusPerWorker > 0, else gloo. nccl needs NVIDIA GPUs (gpusPerWorker, or nvidia.com/* "
                f"resources such as MIG slices). mpi is refused: {MPI_REFUSAL}.",
                max_length=8,
                enum=["nccl", "gloo", "mpi"],
                rules=[
                    rule(
                        "self != 'mpi'",
                        message=f"networking.backend mpi is not supported: {MPI_REFUSAL}; use nccl "
                        "(NVIDIA GPUs) or gloo",
                    )
                ],
            ),
            "masterPort": integer(
                "Port of the rendezvous on rank 0 (MASTER_PORT) and of the TF_CONFIG cluster addresses.",
                minimum=1024,
                maximum=65535,
                default=29500,
            ),
            "rdmaEnabled": boolean(
                "Allow InfiniBand/RoCE: NCCL_IB_DISABLE=1 is injected unless this is true.", default=False
            ),
            "socketInterface": string(
                "Network interface for NCCL and Gloo sockets (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME), e.g. "
                "eth0.",
                max_length=64,
            ),
        },
        default_empty=True,
    )


def success_policy() -> Schema:
    return obj(
        "When the job counts as Completed besides finishing its epochs.",
        {
            "mode": string(
                "AllWorkers: Completed when every worker's trainer container exits 0. RankZero: Completed "
                "when rank 0's exits 0 (the other workers are then stopped). Sidecars do not count.",
                max_length=16,
                enum=["AllWorkers", "RankZero"],
                default="AllWorkers",
            ),
            "targetAccuracy": number(
                "Stop as Completed (reason TargetReached) once the reported metric reaches this value.",
                minimum=0,
                maximum=1,
            ),
            "metric": string(
                "Reported metric compared to targetAccuracy and watched for early stopping.",
                min_length=1,
                max_length=NAME_LENGTH,
                default="accuracy",
            ),
            "metricMode": string(
                "Whether a larger (max) or smaller (min) metric is better.",
                max_length=4,
                enum=["max", "min"],
                default="max",
            ),
            "earlyStoppingPatience": integer(
                "Epochs without improvement of the metric by more than minDelta before the job stops as "
                "Completed (reason EarlyStopped).",
                minimum=1,
            ),
            "minDelta": number("Smallest change that counts as an improvement.", minimum=0, default=0),
        },
        default_empty=True,
    )


def spec() -> Schema:
    return obj(
        "Desired state of the training job.",
        {
            "model": string(
                "Model architecture or identifier to train. Immutable.",
                min_length=1,
                max_length=512,
            ),
            "dataset": string(
                "Dataset name or location. Immutable.",
                min_length=1,
                max_length=512,
            ),
            "numWorkers": integer(
                "Number of worker pods (torchrun nodes; TensorFlow's workers, besides the roles of "
                "tensorflow); the scale subresource's replicas (kubectl scale). "
                "Changing it restarts all workers with the new world size, except in an elastic job, where "
                "it stays within [elastic.minWorkers, elastic.maxWorkers] and workers are added or removed "
                "while the others keep training.",
                minimum=1,
                maximum=contract.MAX_WORKERS,
            ),
            "gpusPerWorker": integer(
                "NVIDIA GPUs per worker pod (nvidia.com/gpu); one process per GPU. 0 runs CPU-only with one "
                "process per pod. Immutable.",
                minimum=0,
                maximum=16,
                default=1,
            ),
            "framework": string(
                "ML framework; selects the default image and the distributed environment (PET_*, TF_CONFIG "
                "or JAX_*; mpi: a launcher running spec.command, mpirun, over SSH to the workers, "
                "see mpi; xgboost: a master pod that runs the tracker besides the numWorkers workers, "
                "MASTER_ADDR and WORKER_ADDRS; paddlepaddle: PADDLE_* for paddle.distributed.launch; "
                "mxnet is refused, retired upstream). Immutable.",
                max_length=16,
                enum=[*contract.FRAMEWORKS, *contract.RETIRED_FRAMEWORKS],
                default="pytorch",
                rules=retired_framework_rules(),
            ),
            "image": string(
                "Trainer container image. Unset: "
                + "; ".join(f"{fw}: {img}" for fw, img in contract.DEFAULT_IMAGES.items())
                + ". Immutable. Not empty and without surrounding whitespace, which the Pod API refuses.",
                min_length=1,
                max_length=512,
                pattern=r"^\S(.*\S)?$",
            ),
            "command": string_list(
                "Container entrypoint. Unset: the operator's reference trainer, "
                f"{' '.join(contract.DEFAULT_COMMAND)}, or with elastic "
                f"{' '.join(contract.ELASTIC_DEFAULT_COMMAND)}. Set it to run the image's own entrypoint. "
                "Immutable."
            ),
            "args": string_list("Arguments to the entrypoint. Immutable."),
            "env": array(
                "Extra environment variables for every worker. Immutable.",
                env_var(),
                max_items=MAX_ENV,
                list_type="map",
                map_keys=["name"],
            ),
            "resources": resources(),
            "serviceAccountName": string(
                "Run the workers under this existing ServiceAccount. Unset: they run under "
                f"{contract.TRAINER_ACCOUNT}, which the operator creates in the namespace and which may "
                "only patch the progress and run annotations of the pod it runs in and read the "
                "namespace's TrainingJobs; when set, that account needs patch on the job's pods for "
                "progress reporting, and get, list and watch on trainingjobs for in-place restarts.",
                max_length=NAME_LENGTH,
                pattern=DNS_SUBDOMAIN_PATTERN,
            ),
            "suspend": boolean(
                "Suspend the job: workers are deleted, deadlines stop; resuming starts them again from the "
                "latest checkpoint.",
                default=False,
            ),
            "managedBy": managed_by(),
            "ttlSecondsAfterFinished": integer(
                "Delete the job this long after it Completed or Failed. Unset: keep it.", minimum=0
            ),
            "cleanPodPolicy": string(
                "Which worker pods are deleted when the job finishes: All, Running (those still running, "
                "including a pod whose trainer is done but whose sidecar runs) or None (keep them all for "
                "inspection, even running ranks of a failed job). Whatever the "
                "policy, running pods are stopped when the job ends by activeDeadlineSeconds, "
                "targetAccuracy, earlyStoppingPatience or rank 0's success in successPolicy.mode RankZero.",
                max_length=8,
                enum=["All", "Running", "None"],
                default="Running",
            ),
            "hyperparameters": hyperparameters(),
            "checkpoint": checkpoint(),
            "scheduling": scheduling(),
            "monitoring": monitoring(),
            "networking": networking(),
            "failurePolicy": failure_policy(),
            "successPolicy": success_policy(),
            "podTemplate": pod_template(),
            "elastic": elastic(),
            "tensorflow": tensorflow(),
            "mpi": mpi(),
        },
        required=["model", "dataset", "numWorkers"],
        rules=[
            gpu_rule("limits"),
            gpu_rule("requests"),
            rule(
                "!has(self.monitoring) || !has(self.monitoring.enabled) || !self.monitoring.enabled || "
                "!has(self.monitoring.metricsPort) || !has(self.networking) || "
                "!has(self.networking.masterPort) || "
                "self.monitoring.metricsPort != self.networking.masterPort",
                message="monitoring.metricsPort must differ from networking.masterPort",
                field_path=".monitoring.metricsPort",
            ),
            *spec_rules(),
            *elastic_rules(),
            *tensorflow_rules(),
            *framework_rules(),
            *mpi_rules(),
        ],
    )
