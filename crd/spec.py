"""A TrainingJob as the operator reads it: parsed once, defaulted, typed.

The API server hands the operator JSON; the builders and the planner need numbers, flags and names.
`parse(manifest)` applies the defaults (crd/defaults.py: the schema's own, then the operator's) and
reads every field the operator acts on into frozen dataclasses, once per reconcile. No default is
restated here: a field the schema defaults is read as present. The parts copied into the pods as
written (env entries, affinity, tolerations, resource quantities, the pod template, the checkpoint
storage block) stay JSON and are copied where they are used; `manifest` keeps the defaulted object
itself.

A value of the wrong type (possible only if the API server stored it under an older, looser schema)
raises `SpecError` naming the field, which the planner reports as an invalid spec. Each section can
also be read on its own from a JSON fragment (`FailurePolicy.from_json({...})`), with that section's
schema defaults applied. The reading machinery (field types, error paths, sections) is in
crd/spec_fields.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from crd import contract
from crd.defaults import storage_in_use, with_defaults
from crd.replicas import Replicas
from crd.spec_fields import Fields, Section, real_number

JsonDict = dict[str, Any]
TF = "tensorflow"
MPI = "mpi"
# A resource quantity as written in the spec: "32Gi", "8", or a plain number.
Quantity = str | int | float


@dataclass(frozen=True)
class Resources(Section):
    """spec.resources: the trainer container's requests and limits, quantities as written."""

    SCHEMA_PATH: ClassVar = ("spec", "resources")
    requests: Mapping[str, Quantity]
    limits: Mapping[str, Quantity]

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(requests=fields.mapping("requests"), limits=fields.mapping("limits"))

    def names(self) -> set[str]:
        return set(self.requests) | set(self.limits)


@dataclass(frozen=True)
class Hyperparameters(Section):
    """spec.hyperparameters; numbers keep the type they were written with (1 stays 1, not 1.0)."""

    SCHEMA_PATH: ClassVar = ("spec", "hyperparameters")
    learning_rate: int | float | None
    batch_size: int | None
    epochs: int | None
    optimizer: str | None
    warmup_steps: int | None
    gradient_accumulation_steps: int | None
    mixed_precision: bool | None
    additional_params: Mapping[str, str]

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            learning_rate=fields.optional_number("learningRate"),
            batch_size=fields.optional_integer("batchSize"),
            epochs=fields.optional_integer("epochs"),
            optimizer=fields.optional_text("optimizer"),
            warmup_steps=fields.optional_integer("warmupSteps"),
            gradient_accumulation_steps=fields.optional_integer("gradientAccumulationSteps"),
            mixed_precision=fields.optional_flag("mixedPrecision"),
            additional_params=fields.mapping("additionalParams"),
        )


@dataclass(frozen=True)
class Checkpoint(Section):
    """spec.checkpoint; `storage` is the block as written (builders/storage.py resolves its spellings)."""

    SCHEMA_PATH: ClassVar = ("spec", "checkpoint")
    enabled: bool
    frequency: int
    retention: int
    mount_path: str
    resume_from: str | None
    storage: Mapping[str, Any]
    # Whether checkpoint storage is wired into the pods (crd.defaults.storage_in_use).
    in_use: bool

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            enabled=fields.flag("enabled"),
            frequency=fields.integer("frequency"),
            retention=fields.integer("retention"),
            mount_path=fields.text("mountPath"),
            resume_from=fields.optional_text("resumeFrom") or None,
            storage=fields.mapping("storage"),
            in_use=storage_in_use({"checkpoint": fields.raw}),
        )


@dataclass(frozen=True)
class Topology:
    """spec.scheduling.topology: the gang in one domain of `level` (Required), or as few as fit."""

    level: str
    mode: str

    @property
    def required(self) -> bool:
        return self.mode == contract.TopologyMode.REQUIRED

    @classmethod
    def read(cls, fields: Fields) -> Topology | None:
        if not fields.raw:
            return None
        mode = fields.optional_text("mode") or contract.TopologyMode.REQUIRED.value
        return cls(level=fields.text("level"), mode=mode)


@dataclass(frozen=True)
class Scheduling(Section):
    """spec.scheduling; affinity and tolerations are copied into the pods as written."""

    SCHEMA_PATH: ClassVar = ("spec", "scheduling")
    priority: str | None
    node_selector: Mapping[str, str]
    affinity: Mapping[str, Any]
    tolerations: tuple[Mapping[str, Any], ...]
    scheduler_name: str | None
    gang_scheduling: bool
    schedule_timeout_seconds: int | None
    queue: str | None
    topology: Topology | None

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            priority=fields.optional_text("priority") or None,
            topology=Topology.read(fields.section("topology")),
            node_selector=fields.mapping("nodeSelector"),
            affinity=fields.mapping("affinity"),
            tolerations=fields.objects("tolerations"),
            scheduler_name=fields.optional_text("schedulerName") or None,
            gang_scheduling=fields.flag("gangScheduling"),
            schedule_timeout_seconds=fields.optional_integer("scheduleTimeoutSeconds"),
            queue=fields.optional_text("queue") or None,
        )


@dataclass(frozen=True)
class Monitoring(Section):
    SCHEMA_PATH: ClassVar = ("spec", "monitoring")
    enabled: bool
    metrics_port: int
    tensorboard_enabled: bool
    tensorboard_log_dir: str | None
    mlflow_tracking_uri: str | None
    mlflow_experiment: str | None
    wandb_project: str | None
    wandb_entity: str | None
    progress_deadline_seconds: int | None
    restart_on_stall: bool

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            enabled=fields.flag("enabled"),
            metrics_port=fields.integer("metricsPort"),
            tensorboard_enabled=fields.flag("tensorboardEnabled"),
            tensorboard_log_dir=fields.optional_text("tensorboardLogDir") or None,
            mlflow_tracking_uri=fields.optional_text("mlflowTrackingUri") or None,
            mlflow_experiment=fields.optional_text("mlflowExperiment") or None,
            wandb_project=fields.optional_text("wandbProject") or None,
            wandb_entity=fields.optional_text("wandbEntity") or None,
            progress_deadline_seconds=fields.optional_integer("progressDeadlineSeconds"),
            restart_on_stall=fields.flag("restartOnStall"),
        )


@dataclass(frozen=True)
class Networking(Section):
    SCHEMA_PATH: ClassVar = ("spec", "networking")
    backend: str
    master_port: int
    rdma_enabled: bool
    socket_interface: str | None

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            backend=fields.text("backend"),
            master_port=fields.integer("masterPort"),
            rdma_enabled=fields.flag("rdmaEnabled"),
            socket_interface=fields.optional_text("socketInterface") or None,
        )


@dataclass(frozen=True)
class RestartBackoff(Section):
    SCHEMA_PATH: ClassVar = ("spec", "failurePolicy", "restartBackoff")
    initial_delay_seconds: float
    max_delay_seconds: float
    multiplier: float

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            initial_delay_seconds=real_number(fields.number("initialDelaySeconds")),
            max_delay_seconds=real_number(fields.number("maxDelaySeconds")),
            multiplier=real_number(fields.number("multiplier")),
        )


@dataclass(frozen=True)
class FailurePolicy(Section):
    SCHEMA_PATH: ClassVar = ("spec", "failurePolicy")
    restart_policy: str
    backoff_limit: int
    max_disruption_restarts: int
    active_deadline_seconds: int | None
    retryable_exit_codes: frozenset[int]
    permanent_exit_codes: frozenset[int]
    restart_backoff: RestartBackoff
    restart_strategy: str

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            restart_strategy=fields.text("restartStrategy"),
            restart_policy=fields.text("restartPolicy"),
            backoff_limit=fields.integer("backoffLimit"),
            max_disruption_restarts=fields.integer("maxDisruptionRestarts"),
            active_deadline_seconds=fields.optional_integer("activeDeadlineSeconds"),
            retryable_exit_codes=fields.integers("retryableExitCodes"),
            permanent_exit_codes=fields.integers("permanentExitCodes"),
            restart_backoff=RestartBackoff.read(fields.section("restartBackoff")),
        )


@dataclass(frozen=True)
class SuccessPolicy(Section):
    SCHEMA_PATH: ClassVar = ("spec", "successPolicy")
    mode: str
    target_accuracy: float | None
    metric: str
    metric_mode: str
    early_stopping_patience: int | None
    min_delta: float

    @classmethod
    def read(cls, fields: Fields) -> Self:
        target = fields.optional_number("targetAccuracy")
        return cls(
            mode=fields.text("mode"),
            target_accuracy=None if target is None else real_number(target),
            metric=fields.text("metric"),
            metric_mode=fields.text("metricMode"),
            early_stopping_patience=fields.optional_integer("earlyStoppingPatience"),
            min_delta=real_number(fields.number("minDelta")),
        )

    @property
    def minimize(self) -> bool:
        return self.metric_mode == "min"


@dataclass(frozen=True)
class Rendezvous(Section):
    """spec.elastic.rendezvous: torchrun's c10d rendezvous."""

    SCHEMA_PATH: ClassVar = ("spec", "elastic", "rendezvous")
    port: int
    join_timeout_seconds: int
    last_call_timeout_seconds: int

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            port=fields.integer("port"),
            join_timeout_seconds=fields.integer("joinTimeoutSeconds"),
            last_call_timeout_seconds=fields.integer("lastCallTimeoutSeconds"),
        )


@dataclass(frozen=True)
class Elastic(Section):
    """spec.elastic: the bounds of an elastic job's world, in pods (torchrun nodes)."""

    SCHEMA_PATH: ClassVar = ("spec", "elastic")
    min_workers: int
    max_workers: int
    max_restarts: int
    rendezvous: Rendezvous

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            min_workers=fields.integer("minWorkers"),
            max_workers=fields.integer("maxWorkers"),
            max_restarts=fields.integer("maxRestarts"),
            rendezvous=Rendezvous.read(fields.section("rendezvous")),
        )

    @property
    def nnodes(self) -> str:
        """torchrun's --nnodes for this range: MIN:MAX."""
        return f"{self.min_workers}:{self.max_workers}"


@dataclass(frozen=True)
class Tensorflow(Section):
    """spec.tensorflow: TensorFlow's replica roles besides the workers (crd/schema_tensorflow.py)."""

    SCHEMA_PATH: ClassVar = ("spec", "tensorflow")
    chief: int
    ps: int
    evaluator: int

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            chief=fields.integer("chief"), ps=fields.integer("ps"), evaluator=fields.integer("evaluator")
        )


@dataclass(frozen=True)
class Mpi(Section):
    """spec.mpi: an MPI job's settings (crd/schema_mpi.py); slots are resolved against the GPUs."""

    SCHEMA_PATH: ClassVar = ("spec", "mpi")
    slots_per_worker: int | None
    implementation: str
    ssh_port: int

    @classmethod
    def read(cls, fields: Fields) -> Self:
        return cls(
            slots_per_worker=fields.optional_integer("slotsPerWorker"),
            implementation=fields.text("implementation"),
            ssh_port=fields.integer("sshPort"),
        )


@dataclass(frozen=True)
class Spec:
    model: str
    dataset: str
    num_workers: int
    gpus_per_worker: int
    framework: str
    image: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: tuple[Mapping[str, Any], ...]
    resources: Resources
    service_account_name: str | None
    suspend: bool
    ttl_seconds_after_finished: int | None
    clean_pod_policy: str
    hyperparameters: Hyperparameters
    checkpoint: Checkpoint
    scheduling: Scheduling
    monitoring: Monitoring
    networking: Networking
    failure_policy: FailurePolicy
    success_policy: SuccessPolicy
    # spec.podTemplate as written (merged onto every worker pod by builders/podtemplate.py), or None.
    pod_template: Mapping[str, Any] | None
    # spec.elastic, or None for a job whose world is fixed while it runs.
    elastic: Elastic | None = None
    # spec.tensorflow, or None for a job of workers only.
    tensorflow: Tensorflow | None = None
    # spec.mpi with its defaults, for a job with framework mpi (even without the block); else None.
    mpi: Mpi | None = None
    managed_by: str | None = None  # spec.managedBy

    @classmethod
    def read(cls, fields: Fields) -> Spec:
        return cls(
            model=fields.text("model"),
            dataset=fields.text("dataset"),
            num_workers=fields.integer("numWorkers"),
            gpus_per_worker=fields.integer("gpusPerWorker"),
            framework=fields.text("framework"),
            image=fields.text("image"),
            command=fields.texts("command"),
            args=fields.texts("args"),
            env=fields.objects("env"),
            resources=Resources.read(fields.section("resources")),
            service_account_name=fields.optional_text("serviceAccountName") or None,
            suspend=fields.flag("suspend"),
            ttl_seconds_after_finished=fields.optional_integer("ttlSecondsAfterFinished"),
            clean_pod_policy=fields.text("cleanPodPolicy"),
            hyperparameters=Hyperparameters.read(fields.section("hyperparameters")),
            checkpoint=Checkpoint.read(fields.section("checkpoint")),
            scheduling=Scheduling.read(fields.section("scheduling")),
            monitoring=Monitoring.read(fields.section("monitoring")),
            networking=Networking.read(fields.section("networking")),
            failure_policy=FailurePolicy.read(fields.section("failurePolicy")),
            success_policy=SuccessPolicy.read(fields.section("successPolicy")),
            pod_template=fields.mapping("podTemplate") or None,
            elastic=None if fields.raw.get("elastic") is None else Elastic.read(fields.section("elastic")),
            tensorflow=(
                None
                if fields.raw.get("tensorflow") is None
                else Tensorflow.read(fields.section("tensorflow"))
            ),
            # An MPI job without the block has its defaults (the schema defaults only what is written).
            mpi=Mpi.from_json(fields.mapping("mpi")) if fields.raw.get("framework") == MPI else None,
            managed_by=fields.optional_text("managedBy") or None,
        )

    @property
    def processes_per_pod(self) -> int:
        """One trainer process per GPU, or one per pod without GPUs; an MPI worker's slots."""
        if self.mpi is not None and self.mpi.slots_per_worker is not None:
            return self.mpi.slots_per_worker
        return max(self.gpus_per_worker, 1)

    @property
    def replicas(self) -> Replicas:
        """The job's pods by role: numWorkers workers, and spec.tensorflow's chief, ps and evaluator, or
        an XGBoost job's master."""
        roles = self.tensorflow
        if self.mpi is not None:
            return Replicas(workers=self.num_workers, launcher=1)
        if self.framework in contract.MASTER_FRAMEWORKS:
            return Replicas(master=1, workers=self.num_workers)
        if roles is None:
            return Replicas(workers=self.num_workers)
        return Replicas(chief=roles.chief, workers=self.num_workers, ps=roles.ps, evaluator=roles.evaluator)

    @property
    def world_size(self) -> int:
        """Processes across the gang (WORLD_SIZE): torch.distributed counts processes, not pods; a job
        with TensorFlow roles counts every role's pods; an MPI job its workers' slots (the launcher
        runs mpirun, not a rank)."""
        if self.mpi is not None:
            return self.num_workers * self.processes_per_pod
        return self.replicas.size * self.processes_per_pod


@dataclass(frozen=True)
class TrainingJob:
    """A stored TrainingJob: its identity, its typed spec, and the defaulted object it was read from."""

    name: str
    namespace: str | None
    uid: str
    generation: int | None
    spec: Spec
    manifest: Mapping[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def queue_name(self) -> str | None:
        """The Kueue LocalQueue the job waits in (label kueue.x-k8s.io/queue-name), if it is queued."""
        return self.labels.get(contract.QUEUE_NAME_LABEL) or None

    @property
    def managed_elsewhere(self) -> str | None:
        """The controller that runs the job when it is not this operator (spec.managedBy), else None."""
        return None if self.spec.managed_by == contract.CONTROLLER_NAME else self.spec.managed_by

    @property
    def prebuilt_workload(self) -> str | None:
        """The Workload Kueue made for the job (MultiKueue's copy on a worker cluster), if any."""
        return self.labels.get(contract.PREBUILT_WORKLOAD_LABEL) or None

    @property
    def workload_priority_class(self) -> str | None:
        """The WorkloadPriorityClass its Workload gets (label kueue.x-k8s.io/priority-class), if any."""
        return self.labels.get(contract.WORKLOAD_PRIORITY_CLASS_LABEL) or None

    @property
    def spec_json(self) -> Mapping[str, Any]:
        """The defaulted spec as JSON."""
        return self.manifest["spec"]  # type: ignore[no-any-return]


def parse(manifest: Mapping[str, Any]) -> TrainingJob:
    """Defaults `manifest` (left untouched) and reads it; SpecError names a field it cannot read."""
    defaulted = with_defaults(dict(manifest))
    metadata = Fields(defaulted.get("metadata") or {}, "metadata")
    labels = metadata.mapping("labels")
    return TrainingJob(
        name=metadata.text("name"),
        namespace=metadata.optional_text("namespace") or None,
        uid=metadata.optional_text("uid") or "",
        generation=metadata.optional_integer("generation"),
        spec=Spec.read(Fields(defaulted.get("spec") or {}, "spec")),
        manifest=defaulted,
        labels={str(key): str(value) for key, value in labels.items()},
    )
