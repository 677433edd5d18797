"""Unit tests of builders/env.py: rank and world-size arithmetic, framework families, TF_CONFIG, and the
rules for user-supplied variables."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from builders.env import distributed_env, is_reserved
from crd import contract
from crd.defaults import with_defaults
from crd.spec import parse
from tests.unit.crd_cases import job

REPO = Path(__file__).resolve().parents[2]
STORAGE = "spec.checkpoint.storage"


def defaulted(changes: dict[str, Any] | None = None, *, name: str = "case-job") -> dict[str, Any]:
    manifest = job(changes, name=name)
    manifest["metadata"].update({"namespace": "ml", "uid": "uid-1", "generation": 1})
    return with_defaults(manifest)


def env_of(
    changes: dict[str, Any] | None = None, index: int = 0, *, resume_from: str | None = None, attempt: int = 0
) -> dict[str, Any]:
    entries = distributed_env(parse(defaulted(changes)), index, attempt=attempt, resume_from=resume_from)
    names = [e["name"] for e in entries]
    assert len(names) == len(set(names)), names
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in entries}


@pytest.mark.parametrize(
    "case",
    [
        (1, 0, 0, 1, 0, 1),
        (4, 0, 3, 4, 3, 1),
        (2, 1, 1, 2, 1, 1),
        (2, 2, 1, 4, 2, 2),
        (8, 4, 7, 32, 28, 4),
        (100, 16, 99, 1600, 1584, 16),
    ],
)
def test_rank_and_world_size_count_processes(case: tuple[int, int, int, int, int, int]) -> None:
    workers, gpus, index, world, rank, procs = case
    env = env_of({"spec.numWorkers": workers, "spec.gpusPerWorker": gpus}, index)
    assert env["WORLD_SIZE"] == str(world)
    assert env["RANK"] == str(rank)
    assert env["LOCAL_WORLD_SIZE"] == str(procs)
    assert env["PET_NNODES"] == str(workers)
    assert env["PET_NODE_RANK"] == str(index)
    assert env["PET_NPROC_PER_NODE"] == str(procs)
    assert env["TRAININGJOB_REPLICA_INDEX"] == str(index)
    assert env["TRAININGJOB_NUM_WORKERS"] == str(workers)


def test_rendezvous_points_at_the_master_service() -> None:
    env = env_of({"spec.networking.masterPort": 23456}, 1)
    assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "case-job-master"
    assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == "23456"


def test_tf_config() -> None:
    env = env_of(
        {"spec.framework": "tensorflow", "spec.numWorkers": 3, "spec.networking.masterPort": 2222}, 2
    )
    config = json.loads(env["TF_CONFIG"])
    assert config == {
        "cluster": {
            "worker": [
                "case-job-worker-0.case-job-headless:2222",
                "case-job-worker-1.case-job-headless:2222",
                "case-job-worker-2.case-job-headless:2222",
            ]
        },
        "task": {"type": "worker", "index": 2},
    }
    assert " " not in env["TF_CONFIG"]


def test_jax_counts_one_process_per_pod() -> None:
    env = env_of({"spec.framework": "jax", "spec.numWorkers": 4, "spec.gpusPerWorker": 8}, 3)
    assert env["JAX_COORDINATOR_ADDRESS"] == "case-job-master:29500"
    assert env["JAX_NUM_PROCESSES"] == "4"
    assert env["JAX_PROCESS_ID"] == "3"
    assert env["WORLD_SIZE"] == "32"


FAMILIES = {
    "pytorch": {
        "PET_NNODES",
        "PET_NODE_RANK",
        "PET_NPROC_PER_NODE",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "TORCH_DISTRIBUTED_BACKEND",
    },
    "tensorflow": {"TF_CONFIG"},
    "jax": {"JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"},
}


@pytest.mark.parametrize("framework", sorted(FAMILIES))
def test_only_the_chosen_framework_family_is_injected(framework: str) -> None:
    names = set(env_of({"spec.framework": framework}))
    assert FAMILIES[framework] <= names
    for other, family in FAMILIES.items():
        if other != framework:
            assert not family & names, other
    assert {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE"} <= names
    assert env_of({"spec.framework": framework})["FRAMEWORK"] == framework


@pytest.mark.parametrize(
    ("gpus", "backend", "expected"), [(1, None, "nccl"), (0, None, "gloo"), (1, "mpi", "mpi")]
)
def test_backend(gpus: int, backend: str | None, expected: str) -> None:
    changes: dict[str, Any] = {"spec.gpusPerWorker": gpus}
    if backend:
        changes["spec.networking.backend"] = backend
    env = env_of(changes)
    assert env["TORCH_DISTRIBUTED_BACKEND"] == expected
    assert "DIST_BACKEND" not in env  # the same fact once (docs/env.md)


def test_code_that_reads_dist_backend_gets_it_back_from_spec_env() -> None:
    """docs/env.md's replacement: a spec.env entry referring to TORCH_DISTRIBUTED_BACKEND, which the
    kubelet expands because user entries come after the operator's (a reference to a later or
    unknown variable would stay as written)."""
    assert not is_reserved("DIST_BACKEND")
    entries = distributed_env(
        parse(defaulted({"spec.env": [{"name": "DIST_BACKEND", "value": "$(TORCH_DISTRIBUTED_BACKEND)"}]})), 0
    )
    names = [entry["name"] for entry in entries]
    assert names.index("TORCH_DISTRIBUTED_BACKEND") < names.index("DIST_BACKEND")


def test_nccl_knobs() -> None:
    assert env_of()["NCCL_IB_DISABLE"] == "1"
    rdma = env_of({"spec.networking.rdmaEnabled": True, "spec.networking.socketInterface": "ib0"})
    assert "NCCL_IB_DISABLE" not in rdma
    assert rdma["NCCL_SOCKET_IFNAME"] == rdma["GLOO_SOCKET_IFNAME"] == "ib0"
    assert "NCCL_SOCKET_IFNAME" not in env_of()


def test_identity_and_downward_api() -> None:
    env = env_of({"spec.model": "bert-base", "spec.dataset": "wiki text"}, 1, attempt=4)
    assert env["TRAININGJOB_NAME"] == "case-job"
    assert env["TRAININGJOB_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["TRAININGJOB_ATTEMPT"] == "4"
    assert "TRAININGJOB_CONFIG" not in env  # the configuration is the environment itself
    assert env["TRAININGJOB_PROGRESS_ANNOTATION"] == contract.PROGRESS_ANNOTATION
    assert (env["MODEL_NAME"], env["DATASET_NAME"]) == ("bert-base", "wiki text")
    assert env["PYTHONUNBUFFERED"] == "1"


def test_hyperparameters_only_those_set() -> None:
    env = env_of(
        {
            "spec.hyperparameters": {
                "learningRate": 0.00005,
                "batchSize": 16,
                "mixedPrecision": True,
                "additionalParams": {"weight_decay": "0.01", "Label_Smoothing": "0.1"},
            }
        }
    )
    assert env["LEARNING_RATE"] == "5e-05"
    assert float(env["LEARNING_RATE"]) == 0.00005
    assert env["BATCH_SIZE"] == "16"
    assert env["MIXED_PRECISION"] == "true"
    assert env["HP_WEIGHT_DECAY"] == "0.01"
    assert env["HP_LABEL_SMOOTHING"] == "0.1"
    assert "EPOCHS" not in env
    assert "OPTIMIZER" not in env
    assert "WARMUP_STEPS" not in env


def test_monitoring_variables() -> None:
    assert not {"METRICS_PORT", "TENSORBOARD_LOG_DIR", "MLFLOW_TRACKING_URI", "WANDB_PROJECT"} & set(env_of())
    env = env_of(
        {
            "spec.monitoring": {
                "enabled": True,
                "metricsPort": 9100,
                "tensorboardEnabled": True,
                "mlflowTrackingUri": "http://mlflow:5000",
                "wandbProject": "p",
                "wandbEntity": "team",
            }
        }
    )
    assert env["METRICS_PORT"] == "9100"
    assert env["TENSORBOARD_LOG_DIR"] == "/tmp/tensorboard"
    assert (env["MLFLOW_TRACKING_URI"], env["MLFLOW_EXPERIMENT_NAME"]) == ("http://mlflow:5000", "case-job")
    assert (env["WANDB_PROJECT"], env["WANDB_ENTITY"], env["WANDB_RUN_GROUP"]) == ("p", "team", "case-job")


def test_tensorboard_dir_follows_checkpoint_volume_or_setting() -> None:
    on_volume = env_of({"spec.monitoring.tensorboardEnabled": True, "spec.checkpoint.enabled": True})
    assert on_volume["TENSORBOARD_LOG_DIR"] == "/checkpoints/tensorboard"
    configured = env_of(
        {"spec.monitoring.tensorboardEnabled": True, "spec.monitoring.tensorboardLogDir": "/logs"}
    )
    assert configured["TENSORBOARD_LOG_DIR"] == "/logs"


def test_wandb_files_go_to_the_checkpoint_volume_when_there_is_one() -> None:
    on_volume = env_of({"spec.monitoring.wandbProject": "p", "spec.checkpoint.enabled": True})
    assert on_volume["WANDB_DIR"] == "/checkpoints"
    assert on_volume["TRAININGJOB_UID"]
    assert "WANDB_DIR" not in env_of({"spec.monitoring.wandbProject": "p"})
    in_bucket = {"spec.checkpoint.enabled": True, STORAGE: {"type": "s3", "s3Bucket": "b"}}
    assert "WANDB_DIR" not in env_of({"spec.monitoring.wandbProject": "p", **in_bucket})


CHECKPOINT_NAMES = {"CHECKPOINT_DIR", "CHECKPOINT_FREQUENCY", "CHECKPOINT_RETENTION", "RESUME_FROM"}


def test_no_checkpoint_variables_without_checkpointing() -> None:
    assert not CHECKPOINT_NAMES & set(env_of())


@pytest.mark.parametrize(
    ("storage", "directory"),
    [
        ({}, "/checkpoints"),
        ({"pvcName": "shared"}, "/checkpoints"),
        ({"type": "nfs", "nfsServer": "n", "nfsPath": "/x"}, "/checkpoints"),
        ({"type": "s3", "s3Bucket": "ml-checkpoints"}, "s3://ml-checkpoints/case-job"),
        ({"type": "s3", "s3": {"bucket": "b", "prefix": "/runs/a/"}}, "s3://b/runs/a"),
        ({"type": "gcs", "gcsBucket": "g"}, "gs://g/case-job"),
    ],
)
def test_checkpoint_dir_per_storage(storage: dict[str, Any], directory: str) -> None:
    env = env_of({"spec.checkpoint.enabled": True, "spec.checkpoint.frequency": 2, STORAGE: storage})
    assert env["CHECKPOINT_DIR"] == directory
    assert (env["CHECKPOINT_FREQUENCY"], env["CHECKPOINT_RETENTION"]) == ("2", "3")


def test_custom_mount_path() -> None:
    env = env_of({"spec.checkpoint.enabled": True, "spec.checkpoint.mountPath": "/ckpt"}, resume_from="e3")
    assert (env["CHECKPOINT_DIR"], env["RESUME_FROM"]) == ("/ckpt", "/ckpt/e3")


def test_resume_from_is_the_controllers_choice() -> None:
    assert "RESUME_FROM" not in env_of({"spec.checkpoint.enabled": True})
    assert (
        env_of({"spec.checkpoint.enabled": True}, resume_from="epoch-2")["RESUME_FROM"]
        == "/checkpoints/epoch-2"
    )
    assert (
        env_of({"spec.checkpoint.enabled": True}, resume_from="/checkpoints/e")["RESUME_FROM"]
        == "/checkpoints/e"
    )
    s3 = {"spec.checkpoint.enabled": True, STORAGE: {"type": "s3", "s3Bucket": "b"}}
    assert env_of(s3, resume_from="s3://b/case-job/e9")["RESUME_FROM"] == "s3://b/case-job/e9"
    # resumeFrom alone (checkpointing off) still resumes, without saving.
    env = env_of({"spec.checkpoint.resumeFrom": "e1"}, resume_from="e1")
    assert env["RESUME_FROM"] == "/checkpoints/e1"
    assert "CHECKPOINT_DIR" not in env


def test_s3_credentials_from_secret() -> None:
    env = env_of(
        {
            "spec.checkpoint.enabled": True,
            STORAGE: {
                "type": "s3",
                "s3": {
                    "bucket": "b",
                    "endpoint": "http://minio:9000",
                    "region": "eu-1",
                    "credentialsSecret": "aws",
                },
            },
        }
    )
    assert env["AWS_ACCESS_KEY_ID"] == {"secretKeyRef": {"name": "aws", "key": "AWS_ACCESS_KEY_ID"}}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"secretKeyRef": {"name": "aws", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert env["AWS_SESSION_TOKEN"] == {
        "secretKeyRef": {"name": "aws", "key": "AWS_SESSION_TOKEN", "optional": True}
    }
    assert (env["AWS_ENDPOINT_URL"], env["AWS_DEFAULT_REGION"]) == ("http://minio:9000", "eu-1")
    ambient = env_of({"spec.checkpoint.enabled": True, STORAGE: {"type": "s3", "s3Bucket": "b"}})
    assert not any(name.startswith("AWS_") for name in ambient)


def test_gcs_credentials_file() -> None:
    env = env_of(
        {
            "spec.checkpoint.enabled": True,
            STORAGE: {"type": "gcs", "gcs": {"bucket": "g", "credentialsSecret": "sa"}},
        }
    )
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == "/var/run/secrets/trainingjob/gcs/key.json"


def test_user_env_comes_last_and_overrides_only_overridable_names() -> None:
    manifest = defaulted(
        {
            "spec.env": [
                {"name": "NCCL_DEBUG", "value": "INFO"},
                {"name": "NCCL_IB_DISABLE", "value": "0"},
                {"name": "PYTHONUNBUFFERED", "value": "0"},
                {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            ]
        }
    )
    entries = distributed_env(parse(manifest), 0)
    names = [e["name"] for e in entries]
    assert names[-4:] == ["NCCL_DEBUG", "NCCL_IB_DISABLE", "PYTHONUNBUFFERED", "SECRET"]
    assert names.count("NCCL_IB_DISABLE") == names.count("PYTHONUNBUFFERED") == 1
    assert entries[-3]["value"] == "0"


def test_reserved_user_env_is_dropped_not_duplicated() -> None:
    manifest = defaulted()
    manifest["spec"]["env"] = [
        {"name": "WORLD_SIZE", "value": "999"},
        {"name": "HP_LR", "value": "1"},
        {"name": "TRAININGJOB_NAME", "value": "x"},
        {"name": "OK", "value": "1"},
    ]
    entries = distributed_env(parse(manifest), 0)
    names = [e["name"] for e in entries]
    assert names.count("WORLD_SIZE") == 1
    assert "HP_LR" not in names
    assert next(e for e in entries if e["name"] == "WORLD_SIZE")["value"] == "2"
    assert next(e for e in entries if e["name"] == "TRAININGJOB_NAME")["value"] == "case-job"
    assert names[-1] == "OK"


MAXIMAL = {
    "spec.numWorkers": 2,
    "spec.gpusPerWorker": 2,
    "spec.hyperparameters": {
        "learningRate": 0.1,
        "batchSize": 8,
        "epochs": 3,
        "optimizer": "sgd",
        "warmupSteps": 10,
        "gradientAccumulationSteps": 2,
        "mixedPrecision": False,
        "additionalParams": {"wd": "1"},
    },
    "spec.networking.socketInterface": "eth0",
    "spec.monitoring": {
        "enabled": True,
        "tensorboardEnabled": True,
        "mlflowTrackingUri": "http://m",
        "wandbProject": "p",
        "wandbEntity": "e",
    },
    "spec.checkpoint.enabled": True,
}


def _maximal_names(framework: str, storage: dict[str, Any], elastic: bool = False) -> set[str]:
    changes = {**MAXIMAL, "spec.framework": framework, STORAGE: storage}
    if elastic:
        changes["spec.elastic"] = {"minWorkers": 1, "maxWorkers": 4}
    return set(env_of(changes, 1, resume_from="s3://b/x" if storage.get("type") == "s3" else "gs://b/x"))


def test_every_injected_name_is_reserved_or_overridable_and_every_reserved_name_is_injected() -> None:
    s3 = {
        "type": "s3",
        "s3": {"bucket": "b", "endpoint": "http://m", "region": "r", "credentialsSecret": "c"},
    }
    gcs = {"type": "gcs", "gcs": {"bucket": "b", "credentialsSecret": "c"}}
    injected = set().union(
        *(_maximal_names(fw, st) for fw in contract.FRAMEWORKS for st in (s3, gcs)),
        *(_maximal_names(fw, st, elastic=True) for fw in contract.ELASTIC_FRAMEWORKS for st in (s3, gcs)),
        _maximal_names("pytorch", {"type": "pvc"}),
    )
    assert {n for n in injected if not is_reserved(n)} == set(contract.OVERRIDABLE_ENV_NAMES)
    assert set(contract.RESERVED_ENV_NAMES) <= injected
    assert not set(contract.RESERVED_ENV_NAMES) & set(contract.OVERRIDABLE_ENV_NAMES)


def test_docs_list_every_injected_name() -> None:
    docs = (REPO / "docs" / "env.md").read_text(encoding="utf-8")
    for name in (*contract.RESERVED_ENV_NAMES, *contract.OVERRIDABLE_ENV_NAMES):
        assert f"`{name}`" in docs, name
    for prefix in contract.RESERVED_ENV_PREFIXES:
        assert f"`{prefix}" in docs, prefix


def test_env_builder_does_not_mutate_the_job() -> None:
    manifest = parse(
        defaulted({"spec.env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]})
    )
    snapshot = copy.deepcopy(manifest)
    entries = distributed_env(manifest, 0)
    entries[-1]["valueFrom"]["secretKeyRef"]["name"] = "changed"
    assert manifest == snapshot


# ---------------------------------------------------------------------------------------------------
# Elastic PyTorch: torchrun's c10d rendezvous instead of a fixed world

ELASTIC: dict[str, Any] = {
    "spec.numWorkers": 3,
    "spec.gpusPerWorker": 2,
    "spec.elastic": {"minWorkers": 2, "maxWorkers": 5},
}


def test_an_elastic_job_gets_torchruns_rendezvous_and_no_fixed_world() -> None:
    worker0, worker2 = env_of(ELASTIC, 0, attempt=3), env_of(ELASTIC, 2, attempt=3)
    for env in (worker0, worker2):
        assert env["PET_NNODES"] == "2:5"
        assert env["PET_NPROC_PER_NODE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["PET_RDZV_BACKEND"] == "c10d"
        # The master Service resolves to worker 0, whose agent hosts the store (29400: torchrun's port).
        assert env["PET_RDZV_ENDPOINT"] == "case-job-master:29400"
        assert env["PET_RDZV_ID"] == "uid-1-3"
        assert env["PET_MAX_RESTARTS"] == "3"
        assert (env["TRAININGJOB_MIN_WORKERS"], env["TRAININGJOB_MAX_WORKERS"]) == ("2", "5")
        # torchrun assigns ranks and the world size per round; numWorkers changes under running pods.
        for name in ("WORLD_SIZE", "RANK", "PET_NODE_RANK", "PET_MASTER_ADDR", "TRAININGJOB_NUM_WORKERS"):
            assert name not in env, name
    conf = "join_timeout=600,last_call_timeout=30,read_timeout=600"
    assert worker0["PET_RDZV_CONF"] == f"is_host=true,{conf}"
    assert worker2["PET_RDZV_CONF"] == f"is_host=false,{conf}"


def test_the_rendezvous_settings_reach_torchrun() -> None:
    settings = {"port": 29600, "joinTimeoutSeconds": 120, "lastCallTimeoutSeconds": 5}
    env = env_of(
        {**ELASTIC, "spec.elastic": {**ELASTIC["spec.elastic"], "maxRestarts": 7, "rendezvous": settings}}
    )
    assert env["PET_RDZV_ENDPOINT"] == "case-job-master:29600"
    assert env["PET_RDZV_CONF"] == "is_host=true,join_timeout=120,last_call_timeout=5,read_timeout=120"
    assert env["PET_MAX_RESTARTS"] == "7"


def test_each_attempt_has_its_own_rendezvous_id() -> None:
    ids = {env_of(ELASTIC, 1, attempt=attempt)["PET_RDZV_ID"] for attempt in range(3)}
    assert ids == {"uid-1-0", "uid-1-1", "uid-1-2"}
