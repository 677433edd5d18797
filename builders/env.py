"""The environment of a worker's trainer container: topology, configuration and wiring.

Distributed training frameworks find their peers through environment variables whose meaning users'
scripts already depend on (docs/env.md). The arithmetic lives here, in one place, because getting it
wrong (WORLD_SIZE counting pods instead of processes, a rank off by a GPU count) makes jobs hang
rather than fail.

Counting: numWorkers counts pods (torchrun "nodes"); each pod runs max(gpusPerWorker, 1) processes.
WORLD_SIZE and RANK count processes, PET_NNODES/PET_NODE_RANK and JAX_* count pods. A job with
TensorFlow roles (spec.tensorflow) counts every role's pods in WORLD_SIZE and RANK, in slot order
(crd/replicas.py: chief, workers, parameter servers, evaluator), so the chief is rank 0; its TF_CONFIG
has a cluster of chief, workers and parameter servers and each pod's own task.

Only the chosen framework's family (PET_* for pytorch, TF_CONFIG for tensorflow, JAX_* for jax,
WORKER_ADDRS for xgboost, PADDLE_* for paddlepaddle) is injected: TF_CONFIG in particular changes the
behaviour of any TensorFlow code in the process. An XGBoost job's master is slot 0, so rank 0.

An elastic job (spec.elastic, pytorch only) gets torchrun's dynamic rendezvous instead of a fixed
world: PET_NNODES=MIN:MAX, the c10d rendezvous on worker 0 behind the master Service, an id per gang
attempt, and no WORLD_SIZE, RANK or PET_NODE_RANK, which torchrun assigns to each process of each round.
"""

from __future__ import annotations

import copy
import json
import posixpath
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

from builders.mpi import HOSTFILE_PATH, SSH_CONFIG
from builders.names import master_service_name, pod_dns_name
from builders.storage import CheckpointStorage, checkpoint_storage, resume_path
from crd import contract
from crd.spec import Elastic, TrainingJob

EnvVar: TypeAlias = dict[str, Any]

TENSORBOARD_FALLBACK_DIR = "/tmp/tensorboard"  # noqa: S108 - a log directory inside the container


def var(name: str, value: object) -> EnvVar:
    return {"name": name, "value": env_text(value)}


def field_ref(name: str, field_path: str) -> EnvVar:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def secret_ref(name: str, secret: str, *, optional: bool = False) -> EnvVar:
    ref: dict[str, Any] = {"name": secret, "key": name}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def env_text(value: object) -> str:
    """Values as the trainer parses them: JSON spelling for booleans, Python's repr for floats."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def is_reserved(name: str) -> bool:
    return name in contract.RESERVED_ENV_NAMES or name.startswith(contract.RESERVED_ENV_PREFIXES)


def workers_env(job: TrainingJob) -> list[EnvVar]:
    """The job's size in pods: numWorkers, or an elastic job's bounds (its numWorkers changes while the
    pods run, so no pod carries it)."""
    elastic = job.spec.elastic
    if elastic is None:
        return [var("TRAININGJOB_NUM_WORKERS", job.spec.num_workers)]
    return [
        var("TRAININGJOB_MIN_WORKERS", elastic.min_workers),
        var("TRAININGJOB_MAX_WORKERS", elastic.max_workers),
    ]


def termination_grace_seconds(job: TrainingJob) -> int:
    """The pods' terminationGracePeriodSeconds: spec.podTemplate.spec's, else the operator's default."""
    template = (job.spec.pod_template or {}).get("spec") or {}
    value = template.get("terminationGracePeriodSeconds")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return contract.TERMINATION_GRACE_SECONDS


def identity_env(job: TrainingJob, slot: int, attempt: int) -> list[EnvVar]:
    spec = job.spec
    replica = spec.replicas.at(slot)
    return [
        var("TRAININGJOB_NAME", job.name),
        field_ref("TRAININGJOB_NAMESPACE", "metadata.namespace"),
        field_ref("POD_NAME", "metadata.name"),
        var("TRAININGJOB_REPLICA_TYPE", replica.type),
        var("TRAININGJOB_REPLICA_INDEX", replica.index),
        *workers_env(job),
        var("TRAININGJOB_ATTEMPT", attempt),
        var("TRAININGJOB_PROGRESS_ANNOTATION", contract.PROGRESS_ANNOTATION),
        var(contract.GRACE_PERIOD_ENV, termination_grace_seconds(job)),
        var("MODEL_NAME", spec.model),
        var("DATASET_NAME", spec.dataset),
        var("FRAMEWORK", spec.framework),
        var("PYTHONUNBUFFERED", "1"),
    ]


def topology_env(job: TrainingJob, slot: int) -> list[EnvVar]:
    """Rendezvous variables every framework gets, with torch.distributed's process counting (an elastic
    job's WORLD_SIZE and RANK come from torchrun, per process and per rendezvous round)."""
    spec = job.spec
    world = [var("WORLD_SIZE", spec.world_size), var("RANK", slot * spec.processes_per_pod)]
    if spec.elastic is not None:
        world = []
    elif spec.mpi is not None:
        # mpirun gives each rank its own (OMPI_COMM_WORLD_RANK): a RANK per pod would be wrong for all
        # but one process of a worker.
        world = world[:1]
    return [
        var("MASTER_ADDR", master_service_name(job)),
        var("MASTER_PORT", spec.networking.master_port),
        *world,
        var("LOCAL_WORLD_SIZE", spec.processes_per_pod),
    ]


def pytorch_env(job: TrainingJob, index: int) -> list[EnvVar]:
    spec = job.spec
    backend = spec.networking.backend
    return [
        var("PET_NNODES", spec.num_workers),
        var("PET_NODE_RANK", index),
        var("PET_NPROC_PER_NODE", spec.processes_per_pod),
        var("PET_MASTER_ADDR", master_service_name(job)),
        var("PET_MASTER_PORT", spec.networking.master_port),
        var("TORCH_DISTRIBUTED_BACKEND", backend),
    ]


def rendezvous_id(job: TrainingJob, attempt: int) -> str:
    """torchrun's --rdzv-id: one per gang attempt, so agents of an attempt never join an older round."""
    return f"{job.uid or job.name}-{attempt}"


def elastic_env(job: TrainingJob, elastic: Elastic, index: int, attempt: int) -> list[EnvVar]:
    """torchrun's elastic launch: worker 0's agent hosts the c10d store (is_host, reached through the
    master Service, which resolves to worker 0); every other agent connects to it, waiting as long as a
    round may take to join (read_timeout), since pods start at different times."""
    spec = job.spec
    rendezvous = elastic.rendezvous
    conf = {
        "is_host": "true" if index == 0 else "false",
        "join_timeout": rendezvous.join_timeout_seconds,
        "last_call_timeout": rendezvous.last_call_timeout_seconds,
        "read_timeout": rendezvous.join_timeout_seconds,
    }
    backend = spec.networking.backend
    return [
        var("PET_NNODES", elastic.nnodes),
        var("PET_NPROC_PER_NODE", spec.processes_per_pod),
        var("PET_RDZV_BACKEND", "c10d"),
        var("PET_RDZV_ENDPOINT", f"{master_service_name(job)}:{rendezvous.port}"),
        var("PET_RDZV_ID", rendezvous_id(job, attempt)),
        var("PET_RDZV_CONF", ",".join(f"{key}={value}" for key, value in conf.items())),
        var("PET_MAX_RESTARTS", elastic.max_restarts),
        var("TORCH_DISTRIBUTED_BACKEND", backend),
        # torchrun's own switch: the processes of each round get a store of their own, set up anew for
        # that round. Shared with the agent (torch's default since 2.4), an agent that joins a running
        # world waits forever for the address of a store that is announced only in the first round.
        var("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1"),
    ]


def tf_cluster(job: TrainingJob) -> dict[str, list[str]]:
    """TF_CONFIG's cluster: the chief, the workers and the parameter servers by their stable DNS names
    (the evaluator is not part of the training cluster, as in Kubeflow's TFJob), each role present only
    when the job has pods of it."""
    replicas = job.spec.replicas
    port = job.spec.networking.master_port
    return {
        str(role): [f"{pod_dns_name(job, slot)}:{port}" for slot in replicas.slots(role)]
        for role in replicas.cluster_roles
    }


def tf_config(job: TrainingJob, slot: int) -> str:
    replica = job.spec.replicas.at(slot)
    config = {"cluster": tf_cluster(job), "task": {"type": str(replica.type), "index": replica.index}}
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def tensorflow_env(job: TrainingJob, slot: int) -> list[EnvVar]:
    return [var("TF_CONFIG", tf_config(job, slot))]


def jax_env(job: TrainingJob, index: int) -> list[EnvVar]:
    return [
        var("JAX_COORDINATOR_ADDRESS", f"{master_service_name(job)}:{job.spec.networking.master_port}"),
        var("JAX_NUM_PROCESSES", job.spec.num_workers),
        var("JAX_PROCESS_ID", index),
    ]


def mpi_env(job: TrainingJob, slot: int) -> list[EnvVar]:
    """What mpirun in the launcher needs (builders/mpi.py makes the hostfile and the ssh_config), and
    the operator's own names of the same, which Intel MPI's and MPICH's users pass on (docs/env.md)."""
    mpi = job.spec.mpi
    port = mpi.ssh_port if mpi is not None else 0
    return [
        var("TRAININGJOB_MPI_HOSTFILE", HOSTFILE_PATH),
        var("TRAININGJOB_MPI_SSH_CONFIG", SSH_CONFIG),
        var("TRAININGJOB_MPI_SSH_PORT", port),
        var("TRAININGJOB_MPI_SLOTS", job.spec.processes_per_pod),
        var("OMPI_MCA_orte_default_hostfile", HOSTFILE_PATH),
        var("OMPI_MCA_plm_rsh_agent", "ssh"),
        var("OMPI_MCA_plm_rsh_args", f"-F {SSH_CONFIG}"),
        var("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
        # Cross-memory attach needs ptrace rights the pods' dropped capabilities do not give.
        var("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
    ]


def xgboost_env(job: TrainingJob, slot: int) -> list[EnvVar]:
    """Kubeflow XGBoostJob's contract besides MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK (the master
    is slot 0, rank 0; worker i is rank i + 1): the workers' addresses, their port, and the pod's IP,
    on which the master's tracker listens. xgboost reads none of these by itself (its collective API
    takes the tracker's address as arguments: docs/env.md)."""
    replicas = job.spec.replicas
    workers = [pod_dns_name(job, worker) for worker in replicas.slots(contract.ReplicaType.WORKER)]
    return [
        field_ref("POD_IP", "status.podIP"),
        var("WORKER_ADDRS", ",".join(workers)),
        var("WORKER_PORT", job.spec.networking.master_port),
    ]


PADDLE_LOG_DIR = "/tmp/paddle-log"  # noqa: S108 - a log directory inside the container


def paddle_env(job: TrainingJob, index: int) -> list[EnvVar]:
    """What `python -m paddle.distributed.launch` reads from the environment (its args_envs.py), for
    collective training as Kubeflow's PaddleJob starts it. The launcher's store (an HTTP key-value
    server) starts on the pod whose POD_IP PADDLE_MASTER names: worker 0 gets its own IP (the kubelet
    expands $(POD_IP)), the others the master Service, which resolves to worker 0."""
    port = job.spec.networking.master_port
    master = "$(POD_IP)" if index == 0 else master_service_name(job)
    return [
        field_ref("POD_IP", "status.podIP"),
        var("PADDLE_MASTER", f"{master}:{port}"),
        var("PADDLE_NNODES", job.spec.num_workers),
        var("PADDLE_NPROC_PER_NODE", job.spec.processes_per_pod),
        var("PADDLE_RANK", index),
        var("PADDLE_JOB_ID", job.name),
        var("PADDLE_LOG_DIR", PADDLE_LOG_DIR),
    ]


FRAMEWORK_ENV = {
    "pytorch": pytorch_env,
    "mpi": mpi_env,
    "tensorflow": tensorflow_env,
    "jax": jax_env,
    "xgboost": xgboost_env,
    "paddlepaddle": paddle_env,
}


def framework_env(job: TrainingJob, slot: int, attempt: int) -> list[EnvVar]:
    elastic = job.spec.elastic
    if elastic is not None:
        return elastic_env(job, elastic, slot, attempt)
    return FRAMEWORK_ENV[job.spec.framework](job, slot)


def communication_env(job: TrainingJob) -> list[EnvVar]:
    networking = job.spec.networking
    env = [] if networking.rdma_enabled else [var("NCCL_IB_DISABLE", "1")]
    interface = networking.socket_interface
    if interface:
        env += [var("NCCL_SOCKET_IFNAME", interface), var("GLOO_SOCKET_IFNAME", interface)]
    return env


def hyperparameter_env(job: TrainingJob) -> list[EnvVar]:
    hp = job.spec.hyperparameters
    known = [
        ("LEARNING_RATE", hp.learning_rate),
        ("BATCH_SIZE", hp.batch_size),
        ("EPOCHS", hp.epochs),
        ("OPTIMIZER", hp.optimizer),
        ("WARMUP_STEPS", hp.warmup_steps),
        ("GRADIENT_ACCUMULATION_STEPS", hp.gradient_accumulation_steps),
        ("MIXED_PRECISION", hp.mixed_precision),
    ]
    env = [var(name, value) for name, value in known if value is not None]
    extra = hp.additional_params
    env += [var(f"HP_{key.upper()}", extra[key]) for key in sorted(extra)]
    return env


def tensorboard_log_dir(job: TrainingJob, storage: CheckpointStorage | None) -> str:
    configured = job.spec.monitoring.tensorboard_log_dir
    if configured:
        return configured
    if storage is not None and storage.is_volume:
        return posixpath.join(storage.mount_path, "tensorboard")
    return TENSORBOARD_FALLBACK_DIR


def monitoring_env(job: TrainingJob, storage: CheckpointStorage | None) -> list[EnvVar]:
    monitoring = job.spec.monitoring
    env: list[EnvVar] = []
    if monitoring.enabled:
        env.append(var("METRICS_PORT", monitoring.metrics_port))
    if monitoring.tensorboard_enabled:
        env.append(var("TENSORBOARD_LOG_DIR", tensorboard_log_dir(job, storage)))
    if monitoring.mlflow_tracking_uri:
        env.append(var("MLFLOW_TRACKING_URI", monitoring.mlflow_tracking_uri))
        env.append(var("MLFLOW_EXPERIMENT_NAME", monitoring.mlflow_experiment or job.name))
    if monitoring.wandb_project:
        env.append(var("WANDB_PROJECT", monitoring.wandb_project))
        if monitoring.wandb_entity:
            env.append(var("WANDB_ENTITY", monitoring.wandb_entity))
        env.append(var("WANDB_RUN_GROUP", job.name))
        if storage is not None and storage.is_volume:
            # W&B's files (wandb/ with its run directories) on the claim: an offline run outlives the
            # pod, and the next attempt finds what the earlier ones logged.
            env.append(var("WANDB_DIR", storage.mount_path))
    if monitoring.mlflow_tracking_uri or monitoring.wandb_project:
        # What the trainer tags its run with and finds it again by on a later attempt: one run per job,
        # not per name (a job deleted and created again under its name gets a run of its own).
        env.append(var("TRAININGJOB_UID", job.uid))
    return env


def credentials_env(storage: CheckpointStorage) -> list[EnvVar]:
    env: list[EnvVar] = []
    if storage.type == "s3":
        if storage.credentials_secret:
            env += [
                secret_ref("AWS_ACCESS_KEY_ID", storage.credentials_secret),
                secret_ref("AWS_SECRET_ACCESS_KEY", storage.credentials_secret),
                secret_ref("AWS_SESSION_TOKEN", storage.credentials_secret, optional=True),
            ]
        if storage.endpoint:
            env.append(var("AWS_ENDPOINT_URL", storage.endpoint))
        if storage.region:
            env.append(var("AWS_DEFAULT_REGION", storage.region))
    if storage.type == "gcs" and storage.credentials_secret:
        key_file = f"{contract.GCS_CREDENTIALS_MOUNT_PATH}/{contract.GCS_KEY_FILE}"
        env.append(var("GOOGLE_APPLICATION_CREDENTIALS", key_file))
    return env


def checkpoint_env(
    job: TrainingJob, storage: CheckpointStorage | None, resume_from: str | None
) -> list[EnvVar]:
    checkpoint = job.spec.checkpoint
    env: list[EnvVar] = []
    if storage is not None and checkpoint.enabled:
        env += [
            var("CHECKPOINT_DIR", storage.directory),
            var("CHECKPOINT_FREQUENCY", checkpoint.frequency),
            var("CHECKPOINT_RETENTION", checkpoint.retention),
        ]
    if resume_from:
        env.append(var("RESUME_FROM", resume_path(storage, resume_from)))
    if storage is not None:
        env += credentials_env(storage)
    return env


def merge_user_env(operator_env: list[EnvVar], user_env: Iterable[Mapping[str, Any]]) -> list[EnvVar]:
    """The operator's variables, then the user's. A user entry replaces an overridable operator entry of
    the same name; reserved names from the user are dropped (admission rejects them anyway)."""
    user = [copy.deepcopy(dict(entry)) for entry in user_env if not is_reserved(str(entry["name"]))]
    overridden = {entry["name"] for entry in user}
    return [entry for entry in operator_env if entry["name"] not in overridden] + user


def distributed_env(
    job: TrainingJob, slot: int, *, attempt: int = 0, resume_from: str | None = None
) -> list[EnvVar]:
    """The full environment of the pod in `slot` of a defaulted job (the worker of that index, for a job
    without TensorFlow roles), user entries last."""
    storage = checkpoint_storage(job)
    operator_env = [
        *identity_env(job, slot, attempt),
        *topology_env(job, slot),
        *framework_env(job, slot, attempt),
        *communication_env(job),
        *hyperparameter_env(job),
        *monitoring_env(job, storage),
        *checkpoint_env(job, storage, resume_from),
    ]
    return merge_user_env(operator_env, job.spec.env)
