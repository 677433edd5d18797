"""What the pod builder makes of a TrainingJob: identity, runtime settings, resources, volumes and
mounts, scheduling, the service account and its token, RESUME_FROM.

Split out of tests/unit/test_builders.py (the other builders and what every built object shares).
"""

from __future__ import annotations

from typing import Any

import pytest

from builders.configmap import TRAINER_SOURCES_NAME, trainer_sources_projection
from builders.pods import build_pod
from crd import contract
from crd.spec import parse
from tests.unit.builders_support import EXAMPLES, STORAGE, defaulted, materialize

# ---------------------------------------------------------------------------------------------------
# Pods


def container(pod: dict[str, Any]) -> dict[str, Any]:
    (trainer,) = pod["spec"]["containers"]
    assert trainer["name"] == "trainer"
    return dict(trainer)


def env_names(pod: dict[str, Any]) -> list[str]:
    return [e["name"] for e in container(pod)["env"]]


def test_pod_identity_labels_and_annotations() -> None:
    tj = defaulted({"spec.numWorkers": 3, "spec.gpusPerWorker": 2})
    master = build_pod(parse(tj), 0, attempt=5, resume_from=None)
    worker = build_pod(parse(tj), 2, attempt=5, resume_from=None)
    assert master["metadata"]["name"] == master["spec"]["hostname"] == "case-job-worker-0"
    assert master["spec"]["subdomain"] == "case-job-headless"
    assert master["metadata"]["labels"][contract.REPLICA_INDEX_LABEL] == "0"
    assert worker["metadata"]["labels"] == {
        contract.JOB_NAME_LABEL: "case-job",
        contract.MANAGED_BY_LABEL: contract.MANAGED_BY_VALUE,
        contract.REPLICA_TYPE_LABEL: "worker",
        contract.REPLICA_INDEX_LABEL: "2",
        contract.ATTEMPT_LABEL: "5",
    }
    # Only what the operator reads back; one container, so kubectl needs no default-container.
    assert worker["metadata"]["annotations"] == {contract.NUM_WORKERS_ANNOTATION: "3"}


def test_a_pod_with_sidecars_names_the_trainer_as_kubectls_default_container() -> None:
    sidecar = {"name": "log-shipper", "image": "busybox"}
    tj = defaulted({"spec.podTemplate": {"spec": {"containers": [sidecar]}}})
    pod = build_pod(parse(tj), 0, attempt=0, resume_from=None)
    assert pod["metadata"]["annotations"][contract.DEFAULT_CONTAINER_ANNOTATION] == "trainer"
    chosen = {"metadata": {"annotations": {contract.DEFAULT_CONTAINER_ANNOTATION: "log-shipper"}}}
    tj = defaulted({"spec.podTemplate": {**chosen, "spec": {"containers": [sidecar]}}})
    pod = build_pod(parse(tj), 0, attempt=0, resume_from=None)
    assert pod["metadata"]["annotations"][contract.DEFAULT_CONTAINER_ANNOTATION] == "log-shipper"


def test_pod_runtime_settings() -> None:
    pod = build_pod(parse(defaulted()), 0, attempt=0, resume_from=None)
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["enableServiceLinks"] is False
    assert spec["terminationGracePeriodSeconds"] == contract.TERMINATION_GRACE_SECONDS
    trainer = container(pod)
    assert trainer["image"] == contract.DEFAULT_IMAGES["pytorch"]
    assert trainer["command"] == ["python", "/etc/trainingjob/train.py"]
    assert "args" not in trainer
    # The reference trainer in the framework's default image, writing nowhere but /tmp and /dev/shm:
    # "restricted" as a whole (tests/unit/test_builders_podsecurity.py has each default and override).
    assert trainer["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": contract.NON_ROOT_USER,
        "runAsGroup": contract.NON_ROOT_GROUP,
    }
    assert spec["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert trainer["ports"] == [{"name": "dist", "containerPort": 29500, "protocol": "TCP"}]


def test_pod_resources_merge_gpus_into_spec_resources() -> None:
    tj = materialize(EXAMPLES["trainingjob-distributed.yaml"])
    resources = container(build_pod(parse(tj), 1, attempt=0, resume_from=None))["resources"]
    assert resources == {
        "requests": {"memory": "32Gi", "cpu": "8", "nvidia.com/gpu": "2"},
        "limits": {"memory": "64Gi", "cpu": "16", "nvidia.com/gpu": "2"},
    }
    cpu_only = container(
        build_pod(parse(defaulted({"spec.gpusPerWorker": 0})), 0, attempt=0, resume_from=None)
    )
    assert "resources" not in cpu_only
    ints = container(
        build_pod(parse(defaulted({"spec.resources.limits": {"cpu": 4}})), 0, attempt=0, resume_from=None)
    )
    assert ints["resources"]["limits"] == {"cpu": "4", "nvidia.com/gpu": "1"}


def volumes_by_name(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def mounts_by_path(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container(pod)["volumeMounts"]}


def test_pod_always_mounts_config_and_shared_memory() -> None:
    pod = build_pod(parse(defaulted()), 0, attempt=0, resume_from=None)
    volumes = volumes_by_name(pod)
    assert volumes["config"] == {"name": "config", "configMap": trainer_sources_projection()}
    assert volumes["config"]["configMap"]["name"] == TRAINER_SOURCES_NAME
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    mounts = mounts_by_path(pod)
    assert mounts["/etc/trainingjob"]["readOnly"] is True
    assert mounts["/dev/shm"]["name"] == "dshm"
    assert "checkpoints" not in volumes


@pytest.mark.parametrize(
    ("storage", "volume"),
    [
        ({}, {"persistentVolumeClaim": {"claimName": "case-job-checkpoints"}}),
        ({"pvcName": "shared"}, {"persistentVolumeClaim": {"claimName": "shared"}}),
        ({"pvc": {"claimName": "team"}}, {"persistentVolumeClaim": {"claimName": "team"}}),
        (
            {"type": "nfs", "nfs": {"server": "10.0.0.2", "path": "/exports"}},
            {"nfs": {"server": "10.0.0.2", "path": "/exports"}},
        ),
        ({"type": "nfs", "nfsServer": "nfs", "nfsPath": "/x"}, {"nfs": {"server": "nfs", "path": "/x"}}),
    ],
)
def test_checkpoint_volume(storage: dict[str, Any], volume: dict[str, Any]) -> None:
    pod = build_pod(
        parse(defaulted({"spec.checkpoint.enabled": True, STORAGE: storage})), 0, attempt=0, resume_from=None
    )
    assert volumes_by_name(pod)["checkpoints"] == {"name": "checkpoints", **volume}
    assert mounts_by_path(pod)["/checkpoints"]["name"] == "checkpoints"


def test_object_storage_mounts_no_volume_but_gcs_credentials() -> None:
    s3 = build_pod(
        parse(defaulted({"spec.checkpoint.enabled": True, STORAGE: {"type": "s3", "s3Bucket": "b"}})),
        0,
        attempt=0,
        resume_from=None,
    )
    assert set(volumes_by_name(s3)) == {"config", "dshm", contract.TOKEN_VOLUME}
    gcs = build_pod(
        parse(
            defaulted(
                {
                    "spec.checkpoint.enabled": True,
                    STORAGE: {"type": "gcs", "gcs": {"bucket": "g", "credentialsSecret": "sa"}},
                }
            )
        ),
        0,
        attempt=0,
        resume_from=None,
    )
    assert volumes_by_name(gcs)["gcs-credentials"]["secret"] == {"secretName": "sa", "defaultMode": 0o440}
    assert mounts_by_path(gcs)[contract.GCS_CREDENTIALS_MOUNT_PATH]["readOnly"] is True


def test_pod_scheduling_from_the_advanced_example() -> None:
    tj = materialize(EXAMPLES["trainingjob-advanced.yaml"])
    spec = build_pod(parse(tj), 7, attempt=0, resume_from=None)["spec"]
    assert spec["priorityClassName"] == "high-priority"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "A100-SXM4-80GB", "node-type": "gpu-large"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["affinity"] == tj["spec"]["scheduling"]["affinity"]
    assert "schedulerName" not in spec


def test_advanced_example_container() -> None:
    tj = materialize(EXAMPLES["trainingjob-advanced.yaml"])
    pod = build_pod(parse(tj), 0, attempt=0, resume_from="epoch-50")
    trainer = container(pod)
    assert trainer["image"] == "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"
    # torchrun runs the reference trainer the ConfigMap mounts, one process per GPU from PET_*.
    assert trainer["command"] == ["torchrun"]
    assert trainer["args"] == [f"{contract.CONFIG_MOUNT_PATH}/{contract.TRAINER_FILE}"]
    assert trainer["ports"][1] == {"name": "metrics", "containerPort": 8080, "protocol": "TCP"}
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["WORLD_SIZE"] == "32"
    assert env["PET_NPROC_PER_NODE"] == "4"
    assert env["CHECKPOINT_DIR"] == "/checkpoints"
    assert env["RESUME_FROM"] == "/checkpoints/epoch-50"
    assert env["TENSORBOARD_LOG_DIR"] == "/checkpoints/tensorboard"
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "advanced-training-checkpoints"}
    assert env["HP_WEIGHT_DECAY"] == "0.01"
    assert env["NCCL_DEBUG"] == "INFO"
    assert env_names(pod).count("NCCL_IB_DISABLE") == 1
    assert env["MLFLOW_EXPERIMENT_NAME"] == "advanced-training"


def test_service_account_and_token() -> None:
    """Whichever the account, its token is the trainer's alone (test_builders_podsecurity.py)."""
    own = build_pod(parse(defaulted()), 0, attempt=0, resume_from=None)["spec"]
    assert own["serviceAccountName"] == "trainingjob-trainer"
    users = build_pod(
        parse(defaulted({"spec.serviceAccountName": "ml-runner"})), 0, attempt=0, resume_from=None
    )["spec"]
    assert users["serviceAccountName"] == "ml-runner"
    explicit = build_pod(parse(defaulted()), 0, attempt=0, resume_from=None, service_account="other")["spec"]
    assert explicit["serviceAccountName"] == "other"
    for spec in (own, users, explicit):
        assert spec["automountServiceAccountToken"] is False
        assert contract.TOKEN_VOLUME in {volume["name"] for volume in spec["volumes"]}


def test_rdma_adds_ipc_lock() -> None:
    trainer = container(
        build_pod(parse(defaulted({"spec.networking.rdmaEnabled": True})), 0, attempt=0, resume_from=None)
    )
    assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


def test_resume_from_reaches_the_container() -> None:
    pod = build_pod(parse(defaulted({"spec.checkpoint.enabled": True})), 1, attempt=1, resume_from="epoch-4")
    env = {e["name"]: e.get("value") for e in container(pod)["env"]}
    assert env["RESUME_FROM"] == "/checkpoints/epoch-4"
    assert env["TRAININGJOB_ATTEMPT"] == "1"
