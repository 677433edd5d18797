"""Names shared by the CRD, the builders and the controller: API identity, labels, annotations, limits.

Everything another component can observe (label keys users select on, annotations the training code
writes, reserved environment variable names) is defined here once so the schema, the objects the
operator builds and the controller that reads them back cannot drift apart.
"""

from enum import StrEnum
from typing import Final

GROUP: Final = "ml.example.com"
VERSION: Final = "v1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "TrainingJob"
PLURAL: Final = "trainingjobs"
SINGULAR: Final = "trainingjob"
SHORT_NAMES: Final = ("tj",)
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

OPERATOR_NAME: Final = "trainingjob-operator"


class State(StrEnum):
    """status.state: where a job is in its lifecycle (the state machine is controller/planner/decide.py)."""

    QUEUED = "Queued"
    PENDING = "Pending"
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    COMPLETED = "Completed"
    FAILED = "Failed"


FINISHED_STATES: Final = (State.COMPLETED, State.FAILED)


class Condition(StrEnum):
    """status.conditions[].type, in the order they are listed."""

    ADMITTED = "Admitted"
    # A job MultiKueue dispatched (spec.managedBy): False while its worker cluster is unreachable.
    WORKER_REACHABLE = "WorkerReachable"
    CREATED = "Created"
    SCHEDULED = "Scheduled"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    STALLED = "Stalled"
    # Whether the trainers of a job under the namespace's trainer account may report progress: False
    # while the admission policy that narrows their rights is missing (controller/planner/guards.py).
    PROGRESS_REPORTING = "ProgressReporting"
    EVALUATOR_FAILED = "EvaluatorFailed"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


# Labels on every object the operator creates. `training-job` is the key the seed's examples and
# `kubectl logs -l training-job=<name>` use; the informers select on MANAGED_BY_LABEL.
JOB_NAME_LABEL: Final = "training-job"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE: Final = OPERATOR_NAME
REPLICA_INDEX_LABEL: Final = f"{GROUP}/replica-index"
ATTEMPT_LABEL: Final = f"{GROUP}/attempt"
# The replica role a pod plays (spec.tensorflow adds TensorFlow's chief, parameter servers and evaluator
# to the workers); REPLICA_INDEX_LABEL is the pod's index within its role. A pod without this label
# (made by an operator version before it) is a worker.
REPLICA_TYPE_LABEL: Final = f"{GROUP}/replica-type"


class ReplicaType(StrEnum):
    """A pod's role, as TF_CONFIG names its task type (and XGBoost's master, as Kubeflow's XGBoostJob
    names it); the order is the order of the job's pods."""

    CHIEF = "chief"
    MASTER = "master"
    WORKER = "worker"
    PS = "ps"
    EVALUATOR = "evaluator"
    # An MPI job's (framework mpi) pod that runs the user's command (mpirun), after its workers.
    LAUNCHER = "launcher"


MANAGED_SELECTOR: Final = f"{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"

# Annotation rank 0 patches on its own Pod to report progress (JSON object).
PROGRESS_ANNOTATION: Final = f"{GROUP}/progress"
# The key of a progress report's metrics that holds GPU utilisation in percent: the operator exports it
# as trainingjob_gpu_utilization_percent, which the GPU alert and dashboard panel (monitoring/) read.
# trainer/trainingjob_progress/base.py names it too (GPU_UTILIZATION): it cannot import this module.
GPU_UTILIZATION_METRIC: Final = "gpu_utilization"

# In-place gang restarts (spec.failurePolicy.restartStrategy InPlace, docs/progress.md "In-place
# restarts"): the supervisor that runs the trainer's command (trainer/trainingjob_progress/supervise.py)
# patches this annotation on its own Pod, a JSON object {"attempt", "state": Running | Exited,
# "exitCode" (with Exited), "at"}; the operator orders the next attempt through status.inPlaceRestart.
RUN_ANNOTATION: Final = f"{GROUP}/run"
# Set ("true") on a pod whose trainer container the operator built to start under the supervisor: the
# operator's pod cache keeps no spec, and a supervised container that ended before its supervisor ever
# reported means the image cannot run it (status.inPlaceUnavailable).
SUPERVISED_ANNOTATION: Final = f"{GROUP}/supervised"
RESTART_STRATEGIES: Final = ("Recreate", "InPlace")
# The supervisor's module, run as `python3 -m` with the trainer sources' mount on its path.
SUPERVISOR_MODULE: Final = "trainingjob_progress.supervise"
# Seconds past the trainer's termination grace period that every rank has to report its process
# stopped after a Stopping order, and seconds to report the new attempt's process running after a
# Starting order; a rank that misses either makes the operator recreate the gang's pods instead.
IN_PLACE_STOP_MARGIN_SECONDS: Final = 10
IN_PLACE_START_SECONDS: Final = 30

# Kubernetes name limits: pod hostnames and Service names are DNS-1035/1123 labels.
DNS_LABEL_MAX: Final = 63
MAX_WORKERS: Final = 100
WORKER_INFIX: Final = "-worker-"
HEADLESS_SUFFIX: Final = "-headless"
MASTER_SUFFIX: Final = "-master"
# The longest generated DNS label is "<job>-worker-<numWorkers-1>" (pod hostname); with at most 100
# workers a job name of up to 53 characters always fits. Chief ("-chief-0") and parameter servers
# ("-ps-99") are shorter; the evaluator ("-evaluator-0") is not in TF_CONFIG and gets no hostname.
MAX_JOB_NAME: Final = DNS_LABEL_MAX - len(WORKER_INFIX) - len(str(MAX_WORKERS - 1))

GPU_RESOURCE: Final = "nvidia.com/gpu"

# The label of the CRD, the trainers' admission policy and the objects a namespace's jobs share (not of
# a job's own objects: nothing reads it there, and every byte of a pod is paid on each of its writes).
APP_NAME_LABEL: Final = "app.kubernetes.io/name"
APP_NAME_VALUE: Final = "trainingjob"

# The annotation on each Pod recording the numWorkers it was built for, so the controller can tell a
# stale Pod (built for another size) from a current one. An elastic job's pods have none: their size
# changes while they run (a scale or a lost worker never makes a pod stale).
NUM_WORKERS_ANNOTATION: Final = f"{GROUP}/num-workers"
# kubectl's own annotation: `kubectl logs POD` and `kubectl exec POD` pick this container when the pod
# has several (sidecars), so they show the trainer without `-c trainer`. Set only on such pods.
DEFAULT_CONTAINER_ANNOTATION: Final = "kubectl.kubernetes.io/default-container"

# The finalizer on every pod the operator creates (like batch/v1 Job's batch.kubernetes.io/job-tracking):
# the API server keeps a deleted pod, with its last state, until the operator has recorded how it ended
# in the job's status and removed the finalizer (docs/accounting.md).
TRACKING_FINALIZER: Final = f"{GROUP}/trainingjob-tracking"

# Suffixes of the other per-job object names (see builders/names.py).
CHECKPOINTS_SUFFIX: Final = "-checkpoints"
# An MPI job's hostfile and scripts (ConfigMap) and its SSH key (Secret).
MPI_CONFIG_SUFFIX: Final = "-mpi"
MPI_SSH_SUFFIX: Final = "-mpi-ssh"

# The objects one namespace's jobs share (builders/shared.py): the trainers' ServiceAccount and the
# RoleBinding that grants it the ClusterRole TRAINER_CLUSTER_ROLE (crd/trainer-clusterrole.yaml), both
# named TRAINER_ACCOUNT, and the reference trainer's sources in a ConfigMap named
# TRAINER_SOURCES_PREFIX + a hash of their content. They carry COMPONENT_LABEL=SHARED_COMPONENT and no
# owner: the operator deletes them once the namespace has no TrainingJob left.
TRAINER_ACCOUNT: Final = "trainingjob-trainer"
TRAINER_CLUSTER_ROLE: Final = "trainingjob-trainer"
TRAINER_SOURCES_PREFIX: Final = "trainingjob-trainer-"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
SHARED_COMPONENT: Final = "trainer"
# The ValidatingAdmissionPolicy (crd/trainer-progress-policy.yaml) that narrows TRAINER_ACCOUNT to the
# progress annotation of its own pod, and its binding (same name).
TRAINER_POLICY: Final = "trainingjob-trainer-progress"
# The ValidatingAdmissionPolicy (crd/immutable-spec-policy.yaml, from crd/immutability.py) that refuses
# a change of the spec fields that cannot change after create, and its binding (same name).
IMMUTABLE_SPEC_POLICY: Final = "trainingjob-immutable-spec"
# The ValidatingAdmissionPolicy (crd/escalation-policy.yaml, from crd/escalation_policy.py) that keeps
# what a job's pods may do within what its creator may do, and its binding (same name).
ESCALATION_POLICY: Final = "trainingjob-escalation"
# crd/'s admission policies, each with a binding of the same name.
CRD_POLICIES: Final = (TRAINER_POLICY, IMMUTABLE_SPEC_POLICY, ESCALATION_POLICY)

# The operator's container of every worker Pod, and the named ports it exposes.
CONTAINER_NAME: Final = "trainer"
DIST_PORT_NAME: Final = "dist"
METRICS_PORT_NAME: Final = "metrics"
# Elastic jobs: the port of torchrun's c10d rendezvous store, hosted by replica 0's agent.
RDZV_PORT_NAME: Final = "rdzv"
# MPI jobs: the port of the SSH server the operator starts in each worker (builders/mpi.py).
SSH_PORT_NAME: Final = "ssh"
OPERATOR_PORT_NAMES: Final = (DIST_PORT_NAME, METRICS_PORT_NAME, RDZV_PORT_NAME, SSH_PORT_NAME)

# The volumes the operator defines in every worker Pod (checkpoints and gcs-credentials only with
# checkpoint storage that needs them, the token unless spec.podTemplate sets automountServiceAccountToken).
# spec.podTemplate may mount them in its containers but not define volumes of these names.
CONFIG_VOLUME: Final = "config"
SHM_VOLUME: Final = "dshm"
CHECKPOINT_VOLUME: Final = "checkpoints"
GCS_CREDENTIALS_VOLUME: Final = "gcs-credentials"
# The pod's ServiceAccount token, projected as the kubelet's own automount projects it (a token bound to
# the pod, the cluster's CA from the kube-root-ca.crt ConfigMap, the namespace), but mounted into the
# trainer container alone: the pod says automountServiceAccountToken false, so sidecars and init
# containers get no token (docs/security.md, "Trainer pods").
TOKEN_VOLUME: Final = "kube-api-access"  # noqa: S105 - a volume name, not a password
# An MPI job's hostfile, SSH scripts (its ConfigMap) and SSH key (its Secret), in MPI_MOUNT_PATH.
MPI_VOLUME: Final = "mpi"
OPERATOR_VOLUMES: Final = (
    CONFIG_VOLUME,
    SHM_VOLUME,
    CHECKPOINT_VOLUME,
    GCS_CREDENTIALS_VOLUME,
    TOKEN_VOLUME,
    MPI_VOLUME,
)
TOKEN_MOUNT_PATH: Final = "/var/run/secrets/kubernetes.io/serviceaccount"  # noqa: S105 - a path
TOKEN_FILE: Final = "token"  # noqa: S105 - a file name
# The kubelet's own lifetime for the token it projects: the API server may extend a token requested with
# exactly this lifetime (--service-account-extend-token-expiration) and the kubelet renews it at 80%.
TOKEN_EXPIRATION_SECONDS: Final = 3607
# The ConfigMap the kube-controller-manager publishes in every namespace with the cluster's CA.
ROOT_CA_CONFIGMAP: Final = "kube-root-ca.crt"
ROOT_CA_KEY: Final = "ca.crt"
NAMESPACE_FILE: Final = "namespace"

# Where the reference trainer and the progress helper (the namespace's trainer ConfigMap) are mounted,
# read-only.
CONFIG_MOUNT_PATH: Final = "/etc/trainingjob"
TRAINER_FILE: Final = "train.py"
# Without spec.command, pods run the operator's reference trainer from the ConfigMap; elastic jobs run it
# under torchrun's elastic agent (`python -m torch.distributed.run` is torchrun without relying on the
# image's PATH), which reads its settings from the PET_* variables.
DEFAULT_COMMAND: Final = ("python", f"{CONFIG_MOUNT_PATH}/{TRAINER_FILE}")
ELASTIC_DEFAULT_COMMAND: Final = ("python", "-m", "torch.distributed.run", *DEFAULT_COMMAND[1:])
# torchrun's own default port for the c10d rendezvous (--rdzv-endpoint without a port).
DEFAULT_RDZV_PORT: Final = 29400
# The frameworks whose launcher can change the set of processes of a running job (spec.elastic).
ELASTIC_FRAMEWORKS: Final = ("pytorch",)
# Shared memory for PyTorch DataLoader workers (the container runtime's default /dev/shm is 64 MiB).
SHM_MOUNT_PATH: Final = "/dev/shm"  # noqa: S108 - a mount point in the pod, not a temp file
# The GCS service-account key Secret is mounted here; the Secret must hold the key under GCS_KEY_FILE.
GCS_CREDENTIALS_MOUNT_PATH: Final = "/var/run/secrets/trainingjob/gcs"
GCS_KEY_FILE: Final = "key.json"
# MPI jobs: the hostfile, the operator's SSH scripts and the job's SSH key, read-only.
MPI_MOUNT_PATH: Final = "/etc/trainingjob-mpi"
# Mount paths the user's checkpoint.mountPath and the trainer's template mounts must not shadow.
RESERVED_MOUNT_PATHS: Final = (
    CONFIG_MOUNT_PATH,
    MPI_MOUNT_PATH,
    SHM_MOUNT_PATH,
    GCS_CREDENTIALS_MOUNT_PATH,
    TOKEN_MOUNT_PATH,
)

# Public Docker Hub images used when spec.image is absent.
DEFAULT_IMAGES: Final = {
    "pytorch": "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime",
    "tensorflow": "tensorflow/tensorflow:2.19.0-gpu",
    "jax": "python:3.11-slim",
    # Kubeflow MPI Operator's OpenMPI base image (Debian's OpenMPI and an SSH server).
    "mpi": "mpioperator/openmpi:v0.6.0",
    # XGBoost publishes no image of its own: like jax's, a plain Python to build FROM.
    "xgboost": "python:3.11-slim",
    # PaddlePaddle's own CPU image.
    "paddlepaddle": "paddlepaddle/paddle:3.0.0",
}
FRAMEWORKS: Final = tuple(DEFAULT_IMAGES)
# Frameworks refused at admission, each with why and what to use instead (one line).
RETIRED_FRAMEWORKS: Final = {
    "mxnet": "Apache MXNet is retired upstream (moved to the Apache Attic in 2023, no releases since); "
    "port the model to pytorch (or jax or tensorflow)",
}
# The frameworks whose job has a master pod (slot 0, rank 0) besides its numWorkers workers: XGBoost's,
# which runs the tracker the workers join (Kubeflow's XGBoostJob).
MASTER_FRAMEWORKS: Final = ("xgboost",)

# The security settings of the pods the operator builds (builders/pods.py), each kept unless
# spec.podTemplate sets the field: the "restricted" Pod Security Standard wherever it costs the trainer
# nothing (docs/security.md, "Trainer pods"). The admission policy that judges a job's pods against a
# namespace's Pod Security level reads the same values.
# - the pod: the container runtime's default seccomp profile;
SECCOMP_PROFILE_TYPE: Final = "RuntimeDefault"
# - the trainer container, and any container the operator adds: no privilege escalation and no
#   capabilities (networking.rdmaEnabled adds RDMA_CAPABILITIES back, which "baseline" forbids);
ALLOW_PRIVILEGE_ESCALATION: Final = False
DROPPED_CAPABILITIES: Final = ("ALL",)
RDMA_CAPABILITIES: Final = ("IPC_LOCK",)
# - the trainer runs as NON_ROOT_USER:NON_ROOT_GROUP with runAsNonRoot, where the operator knows it works
#   that way: the reference trainer (spec.command one of NON_ROOT_COMMANDS) in a framework's default image
#   (spec.image one of NON_ROOT_IMAGES: they run as root but any user can run their Python), writing only
#   where any user may (the image's /tmp, /dev/shm, emptyDir volumes). So not when the trainer mounts a
#   volume it could write to whose owner the operator cannot know: the checkpoint volume (pvc or nfs
#   storage in use), or a template volume of a type outside NON_ROOT_VOLUME_TYPES mounted without readOnly.
#   Nor when spec.podTemplate states the identity itself (NON_ROOT_POD_FIELDS in the pod's
#   securityContext, NON_ROOT_CONTAINER_FIELDS in the trainer's): then it has all of it, none of these.
NON_ROOT_USER: Final = 1000
NON_ROOT_GROUP: Final = 1000
NON_ROOT_IMAGES: Final = tuple(dict.fromkeys(DEFAULT_IMAGES.values()))
NON_ROOT_COMMANDS: Final = (DEFAULT_COMMAND, ELASTIC_DEFAULT_COMMAND)
# Volume types any user can use as the kubelet makes them: emptyDir is world-writable, the others read-only.
NON_ROOT_VOLUME_TYPES: Final = ("emptyDir", "configMap", "secret", "projected", "downwardAPI", "image")
NON_ROOT_POD_FIELDS: Final = ("runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup")
NON_ROOT_CONTAINER_FIELDS: Final = ("runAsUser", "runAsGroup", "runAsNonRoot")

# A checkpoint claim the operator creates (storage type pvc without claimName) is named
# "<job>-checkpoints" and gets this size unless spec.checkpoint.storage.pvc.create.size says otherwise.
DEFAULT_CHECKPOINT_CLAIM_SIZE: Final = "10Gi"
# spec.checkpoint.storage.pvc.create.whenDeleted (as StatefulSet's persistentVolumeClaimRetentionPolicy):
# a retained claim has no owner reference, so neither the garbage collector nor a TTL deletes it.
CLAIM_RETAIN: Final = "Retain"
CLAIM_DELETE: Final = "Delete"
CLAIM_RETENTION_POLICIES: Final = (CLAIM_RETAIN, CLAIM_DELETE)

# Seconds a worker gets between SIGTERM and SIGKILL: enough to flush a checkpoint on preemption,
# short enough that a gang restart is not held up for long. A job sets its own in
# spec.podTemplate.spec.terminationGracePeriodSeconds; the trainer reads it from GRACE_PERIOD_ENV.
TERMINATION_GRACE_SECONDS: Final = 60
GRACE_PERIOD_ENV: Final = "TRAININGJOB_TERMINATION_GRACE_SECONDS"

# Gang scheduling through a PodGroup (builders/podgroup.py).
GANG_COSCHEDULING: Final = "coscheduling"
GANG_VOLCANO: Final = "volcano"
COSCHEDULING_GROUP_VERSION: Final = "scheduling.x-k8s.io/v1alpha1"
COSCHEDULING_POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
# The scheduler name scheduler-plugins' "as a second scheduler" installation registers.
COSCHEDULING_SCHEDULER_NAME: Final = "scheduler-plugins-scheduler"
VOLCANO_GROUP_VERSION: Final = "scheduling.volcano.sh/v1beta1"
VOLCANO_GROUP_NAME_ANNOTATION: Final = "scheduling.k8s.io/group-name"
VOLCANO_SCHEDULER_NAME: Final = "volcano"

# Environment variables the operator injects and spec.env may NOT set: the job's identity, its
# topology (ranks, world size, rendezvous address), values derived from spec fields, and the
# checkpoint wiring. Admission rejects them (a CEL rule built from these tuples); the pod builder
# also drops them defensively. Framework-specific names are reserved for every framework.
RESERVED_ENV_NAMES: Final = (
    # identity
    "TRAININGJOB_NAME",
    "TRAININGJOB_NAMESPACE",
    "POD_NAME",
    "MODEL_NAME",
    "DATASET_NAME",
    "FRAMEWORK",
    # topology shared by all frameworks
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_WORLD_SIZE",
    # PyTorch / torchrun
    "PET_NNODES",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_RDZV_BACKEND",
    "PET_RDZV_ENDPOINT",
    "PET_RDZV_ID",
    "PET_RDZV_CONF",
    "PET_MAX_RESTARTS",
    "TORCH_DISTRIBUTED_BACKEND",
    # TensorFlow
    "TF_CONFIG",
    # JAX
    "JAX_COORDINATOR_ADDRESS",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    # XGBoost (Kubeflow XGBoostJob's names)
    "WORKER_ADDRS",
    "WORKER_PORT",
    # PaddlePaddle (paddle.distributed.launch's settings)
    "PADDLE_MASTER",
    "PADDLE_NNODES",
    "PADDLE_NPROC_PER_NODE",
    "PADDLE_JOB_ID",
    "PADDLE_RANK",
    # hyperparameters
    "LEARNING_RATE",
    "BATCH_SIZE",
    "EPOCHS",
    "OPTIMIZER",
    "WARMUP_STEPS",
    "GRADIENT_ACCUMULATION_STEPS",
    "MIXED_PRECISION",
    # checkpoints
    "CHECKPOINT_DIR",
    "CHECKPOINT_FREQUENCY",
    "CHECKPOINT_RETENTION",
    "RESUME_FROM",
    # monitoring settings that only the operator defines
    "METRICS_PORT",
    "TENSORBOARD_LOG_DIR",
)
# Whole families: HP_<KEY> carries hyperparameters.additionalParams, TRAININGJOB_* is the operator's.
RESERVED_ENV_PREFIXES: Final = ("HP_", "TRAININGJOB_")
# Injected too, but third-party tools' own settings, which spec.env may override (the user's entry
# replaces the operator's): NCCL/Gloo tuning knobs, Python, experiment trackers, cloud credentials.
OVERRIDABLE_ENV_NAMES: Final = (
    "PYTHONUNBUFFERED",
    # XGBoost's and PaddlePaddle's own address of the pod (downward API), and paddle's log directory.
    "POD_IP",
    "PADDLE_LOG_DIR",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    "NCCL_IB_DISABLE",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME",
    "WANDB_PROJECT",
    "WANDB_ENTITY",
    "WANDB_RUN_GROUP",
    "WANDB_DIR",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_DEFAULT_REGION",
    "GOOGLE_APPLICATION_CREDENTIALS",
    # OpenMPI's settings for mpirun in an MPI job's launcher (builders/mpi.py)
    "OMPI_MCA_plm_rsh_agent",
    "OMPI_MCA_plm_rsh_args",
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_btl_vader_single_copy_mechanism",
)

# Pod labels and annotations the operator sets, which spec.podTemplate.metadata may not: the keys
# that select a job's pods, the gang schedulers' markers, and everything under the API group's prefix
# (replica index, role, attempt, progress reports, the world size and generation a pod was built for).
OPERATOR_KEY_PREFIX: Final = f"{GROUP}/"
OPERATOR_LABELS: Final = (JOB_NAME_LABEL, MANAGED_BY_LABEL, COSCHEDULING_POD_GROUP_LABEL)
OPERATOR_ANNOTATIONS: Final = (VOLCANO_GROUP_NAME_ANNOTATION,)

# Kueue (docs/shared-clusters.md): a TrainingJob labelled with a LocalQueue waits, Queued, until Kueue
# admits the Workload the operator creates for it; the Workload's priority comes from a
# WorkloadPriorityClass label, else from the pods' PriorityClass.
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"
KUEUE_API_VERSION: Final = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
QUEUE_NAME_LABEL: Final = f"{KUEUE_GROUP}/queue-name"
WORKLOAD_PRIORITY_CLASS_LABEL: Final = f"{KUEUE_GROUP}/priority-class"
# Kueue names the job a Workload stands for by this label in its messages ("JobUID: ...").
KUEUE_JOB_UID_LABEL: Final = f"{KUEUE_GROUP}/job-uid"
# The one pod set of a TrainingJob's Workload: numWorkers identical worker pods.
WORKLOAD_POD_SET: Final = "workers"
# Workload.spec.priorityClassRef: the (group, kind) of the class a Workload's priority comes from.
POD_PRIORITY_CLASS_REF: Final = ("scheduling.k8s.io", "PriorityClass")
WORKLOAD_PRIORITY_CLASS_REF: Final = (KUEUE_GROUP, "WorkloadPriorityClass")
# spec.managedBy: which controller runs the job. Unset or CONTROLLER_NAME: this operator; MULTIKUEUE:
# Kueue's MultiKueue, which copies the job (without the field) to a worker cluster, where this operator
# runs it, and mirrors the copy's status back. The job's Workload carries the prebuilt-workload label on
# the worker: the copy runs in the Workload MultiKueue made there.
CONTROLLER_NAME: Final = f"{GROUP}/{OPERATOR_NAME}"
MULTIKUEUE_CONTROLLER: Final = f"{KUEUE_GROUP}/multikueue"
MANAGED_BY_VALUES: Final = (CONTROLLER_NAME, MULTIKUEUE_CONTROLLER)
PREBUILT_WORKLOAD_LABEL: Final = f"{KUEUE_GROUP}/prebuilt-workload-name"
# Topology-aware scheduling (spec.scheduling.topology): the Workload's pod set asks Kueue for its gang
# in one domain of a topology level; its pods carry the annotation Kueue reads on the pods of its own
# integrations, by which Kueue counts them as the topology's (not as other usage of the nodes).
PODSET_REQUIRED_TOPOLOGY_ANNOTATION: Final = f"{KUEUE_GROUP}/podset-required-topology"
PODSET_PREFERRED_TOPOLOGY_ANNOTATION: Final = f"{KUEUE_GROUP}/podset-preferred-topology"


class TopologyMode(StrEnum):
    """spec.scheduling.topology.mode: the whole gang in one domain of the level, or as few as fit."""

    REQUIRED = "Required"
    PREFERRED = "Preferred"
