"""Unit tests of builders/: every object built for the README's examples validates against the
Kubernetes 1.34 schemas, carries the job's labels and owner reference, and has the shape the
controller relies on."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest
import yaml

from builders import names
from builders.configmap import (
    MAX_CONFIG_MAP_BYTES,
    PROGRESS_HELPER_FILE,
    TRAINER_FILES,
    TRAINER_SOURCES_NAME,
    build_trainer_sources,
    config_map_key,
)
from builders.podgroup import build_pod_group, pod_decoration
from builders.pods import build_pod
from builders.pvc import build_checkpoint_pvc
from builders.services import build_headless_service, build_master_service
from builders.shared import build_rbac, build_shared, is_shared
from crd import contract
from crd.spec import TrainingJob, parse
from tests.cluster import REPO
from tests.unit import crd_cases
from tests.unit.builders_support import EXAMPLES, STORAGE, defaulted, materialize

KUBE_VERSION = "1.34"
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def all_objects(tj: TrainingJob) -> list[dict[str, Any]]:
    workers = tj.spec.num_workers
    objects = [
        build_headless_service(tj),
        build_master_service(tj),
        *build_shared(tj),
        *(build_pod(tj, i, attempt=0, resume_from=None) for i in {0, workers - 1}),
    ]
    claim = build_checkpoint_pvc(tj)
    if claim is not None:
        objects.append(claim)
    return objects


def when_deleted(tj: dict[str, Any]) -> str:
    return str(tj["spec"]["checkpoint"]["storage"].get("pvc", {}).get("create", {}).get("whenDeleted"))


VALID = crd_cases.valid_manifests()


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_built_object_validates_against_kubernetes(name: str) -> None:
    tj = materialize(VALID[name])
    for obj in all_objects(parse(tj)):
        assert kubernetes_validate.validate(obj, KUBE_VERSION, strict=True) == KUBE_VERSION, obj["kind"]
    for gang in (contract.GANG_COSCHEDULING, contract.GANG_VOLCANO):
        pod = build_pod(parse(tj), 0, attempt=2, resume_from="x", gang=gang)
        kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_object_carries_labels_and_controller_reference(name: str) -> None:
    tj = materialize(VALID[name])
    job_name = tj["metadata"]["name"]
    objects = [
        *all_objects(parse(tj)),
        build_pod_group(parse(tj), "coscheduling"),
        build_pod_group(parse(tj), "volcano"),
    ]
    for obj in objects:
        meta = obj["metadata"]
        assert meta["namespace"] == "ml-training"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "trainingjob-operator"
        if is_shared(obj):  # the namespace's jobs share it: no job, no owner (builders/shared.py)
            assert meta["labels"]["app.kubernetes.io/name"] == "trainingjob"
            assert contract.JOB_NAME_LABEL not in meta["labels"]
            assert "ownerReferences" not in meta
            continue
        assert meta["labels"][contract.JOB_NAME_LABEL] == job_name
        if obj["kind"] == "PersistentVolumeClaim" and when_deleted(tj) == "Retain":
            assert "ownerReferences" not in meta  # tests/unit/test_checkpoint_claims.py
            continue
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "ml.example.com/v1",
                "kind": "TrainingJob",
                "name": job_name,
                "uid": "0f6b6c2e-uid",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def test_builders_do_not_mutate_the_job() -> None:
    tj = parse(materialize(EXAMPLES["trainingjob-advanced.yaml"]))
    snapshot = copy.deepcopy(tj)
    objects = [*all_objects(tj), build_pod_group(tj, "volcano")]
    pod = next(o for o in objects if o["kind"] == "Pod")
    pod["spec"]["affinity"]["podAntiAffinity"].clear()
    pod["spec"]["tolerations"][0]["key"] = "changed"
    assert tj == snapshot


# ---------------------------------------------------------------------------------------------------
# Names


def test_names() -> None:
    tj = defaulted()
    assert names.pod_name(parse(tj), 3) == "case-job-worker-3"
    assert names.pod_names(parse(tj)) == ["case-job-worker-0", "case-job-worker-1"]
    assert names.headless_service_name(parse(tj)) == "case-job-headless"
    assert names.master_service_name(parse(tj)) == "case-job-master"
    assert names.service_account_name(parse(tj)) == contract.TRAINER_ACCOUNT == "trainingjob-trainer"
    assert names.service_account_name(parse(defaulted({"spec.serviceAccountName": "mine"}))) == "mine"
    assert names.pvc_name(parse(tj)) == "case-job-checkpoints"
    assert names.pod_group_name(parse(tj)) == "case-job"
    assert names.pod_dns_name(parse(tj), 1) == "case-job-worker-1.case-job-headless"


def test_names_at_the_job_name_limit_fit_dns_labels() -> None:
    tj = defaulted({"spec.numWorkers": contract.MAX_WORKERS}, name="a" * contract.MAX_JOB_NAME)
    labels = [
        names.pod_name(parse(tj), contract.MAX_WORKERS - 1),
        names.headless_service_name(parse(tj)),
        names.master_service_name(parse(tj)),
    ]
    assert len(labels[0]) == contract.DNS_LABEL_MAX
    assert all(DNS_LABEL.match(n) and len(n) <= contract.DNS_LABEL_MAX for n in labels)
    assert all(
        len(n) <= 253
        for n in (
            names.pvc_name(parse(tj)),
            names.service_account_name(parse(tj)),
        )
    )
    for obj in all_objects(parse(tj)):
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        assert all(len(v) <= 63 for v in obj["metadata"]["labels"].values())


# ---------------------------------------------------------------------------------------------------
# Gang scheduling


def test_coscheduling_pod_group_and_decoration() -> None:
    tj = defaulted({"spec.numWorkers": 4, "spec.scheduling.scheduleTimeoutSeconds": 120})
    group = build_pod_group(parse(tj), "coscheduling")
    assert (group["apiVersion"], group["kind"], group["metadata"]["name"]) == (
        "scheduling.x-k8s.io/v1alpha1",
        "PodGroup",
        "case-job",
    )
    assert group["spec"] == {"minMember": 4, "scheduleTimeoutSeconds": 120}
    pod = build_pod(parse(tj), 1, attempt=0, resume_from=None, gang="coscheduling")
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "case-job"
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


def test_volcano_pod_group_and_decoration() -> None:
    tj = defaulted({"spec.numWorkers": 4, "spec.scheduling.priority": "high"})
    group = build_pod_group(parse(tj), "volcano")
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {
        "minMember": 4,
        "queue": "default",
        "minResources": {"nvidia.com/gpu": "4"},
        "priorityClassName": "high",
    }
    pod = build_pod(parse(tj), 1, attempt=0, resume_from=None, gang="volcano")
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "case-job"
    assert pod["spec"]["schedulerName"] == "volcano"


def test_configured_scheduler_name_wins() -> None:
    tj = defaulted({"spec.scheduling.schedulerName": "coscheduler"})
    assert pod_decoration(parse(tj), "coscheduling").scheduler_name == "coscheduler"
    assert build_pod(parse(tj), 0, attempt=0, resume_from=None)["spec"]["schedulerName"] == "coscheduler"


# ---------------------------------------------------------------------------------------------------
# Services, ConfigMap, RBAC, PVC


def test_headless_service() -> None:
    svc = build_headless_service(parse(defaulted({"spec.networking.masterPort": 23456})))
    assert svc["metadata"]["name"] == "case-job-headless"
    assert svc["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {"training-job": "case-job", "app.kubernetes.io/managed-by": "trainingjob-operator"},
        "ports": [{"name": "dist", "port": 23456, "targetPort": 23456, "protocol": "TCP"}],
    }


def test_master_service_selects_rank_zero_only() -> None:
    tj = defaulted({"spec.monitoring.enabled": True, "spec.monitoring.metricsPort": 9100})
    svc = build_master_service(parse(tj))
    assert svc["metadata"]["name"] == "case-job-master"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"][contract.REPLICA_INDEX_LABEL] == "0"
    assert [p["name"] for p in svc["spec"]["ports"]] == ["dist", "metrics"]
    master = build_pod(parse(tj), 0, attempt=0, resume_from=None)
    worker = build_pod(parse(tj), 1, attempt=0, resume_from=None)
    selects: Callable[[dict[str, Any]], bool] = lambda pod: all(  # noqa: E731
        pod["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items()
    )
    assert selects(master)
    assert not selects(worker)
    headless = build_headless_service(parse(tj))["spec"]["selector"]
    assert all(worker["metadata"]["labels"][k] == v for k, v in headless.items())


def test_the_namespaces_config_map_carries_the_reference_trainer_and_the_progress_helper() -> None:
    tj = materialize(EXAMPLES["trainingjob-advanced.yaml"])
    sources = build_trainer_sources(parse(tj))
    assert set(sources["data"]) == {config_map_key(path) for path in TRAINER_FILES}
    assert {contract.TRAINER_FILE, PROGRESS_HELPER_FILE} <= set(TRAINER_FILES)
    assert sources["metadata"]["name"] == TRAINER_SOURCES_NAME
    assert TRAINER_SOURCES_NAME.startswith(contract.TRAINER_SOURCES_PREFIX)
    assert "ownerReferences" not in sources["metadata"]
    assert is_shared(sources)
    packaged = REPO / "trainer"
    for path in TRAINER_FILES:
        assert sources["data"][config_map_key(path)] == (packaged / path).read_text(encoding="utf-8")
        compile(sources["data"][config_map_key(path)], path, "exec")
    # The default command runs the trainer where the pod mounts the trainer's ConfigMap; the helper
    # sits next to it.
    assert defaulted()["spec"]["command"] == list(contract.DEFAULT_COMMAND)
    script_dir, script = contract.DEFAULT_COMMAND[1].rsplit("/", 1)
    assert (script_dir, script) == (contract.CONFIG_MOUNT_PATH, contract.TRAINER_FILE)
    pod = build_pod(parse(tj), 0, attempt=0, resume_from=None)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == contract.CONFIG_VOLUME)
    assert volume["configMap"]["name"] == TRAINER_SOURCES_NAME
    assert volume["configMap"]["items"] == [{"key": config_map_key(p), "path": p} for p in TRAINER_FILES]
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    assert mount["mountPath"] == contract.CONFIG_MOUNT_PATH
    # The API server refuses ConfigMaps over 1 MiB; keep well clear of it.
    assert len(json.dumps(sources).encode()) < MAX_CONFIG_MAP_BYTES // 4


def test_the_trainers_are_bound_to_the_shipped_cluster_role_and_share_one_account_per_namespace() -> None:
    tj = parse(defaulted({"spec.numWorkers": 3}))
    account, binding = build_rbac(tj)
    assert (account["kind"], account["metadata"]["name"]) == ("ServiceAccount", "trainingjob-trainer")
    # No Role: the ClusterRole of crd/trainer-clusterrole.yaml (patch on pods, narrowed by
    # crd/trainer-progress-policy.yaml to the caller's own pod), bound in the job's namespace.
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "trainingjob-trainer",
    }
    assert binding["metadata"]["namespace"] == "ml-training"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "trainingjob-trainer", "namespace": "ml-training"}
    ]
    assert all(is_shared(obj) and "ownerReferences" not in obj["metadata"] for obj in (account, binding))
    assert all(contract.JOB_NAME_LABEL not in obj["metadata"]["labels"] for obj in (account, binding))
    assert build_rbac(parse(defaulted({"spec.serviceAccountName": "mine"}))) == []
    other = parse(defaulted({"spec.numWorkers": 5}, name="other-job"))
    assert build_rbac(other) == build_rbac(tj)
    # While the admission policy is missing the account is made, its RoleBinding is not.
    assert build_rbac(tj, trainer_rights=False) == [account]


def test_the_trainers_cluster_role_allows_patching_pods_and_reading_training_jobs_only() -> None:
    (role,) = yaml.safe_load_all((REPO / "crd" / "trainer-clusterrole.yaml").read_text(encoding="utf-8"))
    assert role["kind"] == "ClusterRole"
    assert role["metadata"]["name"] == contract.TRAINER_CLUSTER_ROLE
    # No resourceNames and no get on pods: crd/trainer-progress-policy.yaml narrows patch to the caller's
    # own pod. TrainingJobs are readable: an in-place restart's supervisor watches its job.
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
        {"apiGroups": [contract.GROUP], "resources": [contract.PLURAL], "verbs": ["get", "list", "watch"]},
    ]


def test_checkpoint_pvc_only_when_the_operator_creates_it() -> None:
    claim = build_checkpoint_pvc(parse(defaulted({"spec.checkpoint.enabled": True})))
    assert claim is not None
    assert claim["metadata"]["name"] == "case-job-checkpoints"
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}}
    custom = build_checkpoint_pvc(
        parse(
            defaulted(
                {
                    "spec.checkpoint.enabled": True,
                    STORAGE: {
                        "pvc": {
                            "create": {
                                "size": "1Ti",
                                "storageClassName": "fast",
                                "accessModes": ["ReadWriteOnce"],
                            }
                        }
                    },
                }
            )
        )
    )
    assert custom is not None
    assert custom["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Ti"}},
        "storageClassName": "fast",
    }
    assert build_checkpoint_pvc(parse(defaulted())) is None
    assert (
        build_checkpoint_pvc(parse(defaulted({"spec.checkpoint.enabled": True, STORAGE: {"pvcName": "x"}})))
        is None
    )
    s3 = {"spec.checkpoint.enabled": True, STORAGE: {"type": "s3", "s3Bucket": "b"}}
    assert build_checkpoint_pvc(parse(defaulted(s3))) is None


def test_seed_examples_build_the_expected_object_set() -> None:
    kinds = {
        name: sorted(o["kind"] for o in all_objects(parse(materialize(manifest))))
        for name, manifest in EXAMPLES.items()
    }
    base = [
        "ConfigMap",
        "Pod",
        "Pod",
        "RoleBinding",
        "Service",
        "Service",
        "ServiceAccount",
    ]
    assert kinds == {
        "trainingjob-advanced.yaml": sorted([*base, "PersistentVolumeClaim"]),
        "trainingjob-byo.yaml": base,
        "trainingjob-distributed.yaml": base,
        "trainingjob-resume.yaml": base,
        "trainingjob-simple.yaml": base,
        "trainingjob-restricted.yaml": base,
        "trainingjob-elastic.yaml": base,
        "trainingjob-jax.yaml": base,
        "trainingjob-mlflow.yaml": sorted([*base, "PersistentVolumeClaim"]),
        "trainingjob-mpi.yaml": base,
        "trainingjob-xgboost.yaml": base,
        "trainingjob-paddle.yaml": base,
        "trainingjob-preemptible.yaml": base,
        "trainingjob-tensorflow.yaml": sorted([*base, "PersistentVolumeClaim"]),
    }
