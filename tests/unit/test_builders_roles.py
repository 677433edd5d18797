"""The pods of a TensorFlow job with replica roles (spec.tensorflow), as the builders make them: their
names, labels and DNS names, the TF_CONFIG each role gets, the shared rendezvous variables counted in
slot order, the master Service's selector, the PodGroup and the Kueue Workload; and that a job of
workers only is built exactly as before roles existed."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from builders.env import distributed_env, tf_config
from builders.names import pod_name, pod_names
from builders.podgroup import build_pod_group
from builders.pods import build_pod
from builders.services import build_master_service
from builders.workload import pod_set
from crd import contract
from crd.contract import ReplicaType
from crd.replicas import Replica, Replicas
from crd.spec import TrainingJob, parse
from tests.cluster import REPO
from tests.unit.builders_support import defaulted

# ParameterServerStrategy: a chief, two workers, one parameter server, and an evaluator.
ROLES = {
    "spec.framework": "tensorflow",
    "spec.numWorkers": 2,
    "spec.gpusPerWorker": 0,
    "spec.networking.masterPort": 2222,
    "spec.tensorflow": {"chief": 1, "ps": 1, "evaluator": 1},
}
NAMES = [
    "case-job-chief-0",
    "case-job-worker-0",
    "case-job-worker-1",
    "case-job-ps-0",
    "case-job-evaluator-0",
]
CLUSTER = {
    "chief": ["case-job-chief-0.case-job-headless:2222"],
    "worker": ["case-job-worker-0.case-job-headless:2222", "case-job-worker-1.case-job-headless:2222"],
    "ps": ["case-job-ps-0.case-job-headless:2222"],
}


def tf_job(changes: dict[str, Any] | None = None) -> TrainingJob:
    return parse(defaulted({**ROLES, **(changes or {})}))


def env_of(job: TrainingJob, slot: int) -> dict[str, Any]:
    return {entry["name"]: entry.get("value") for entry in distributed_env(job, slot)}


def test_the_slots_go_chief_workers_ps_evaluator() -> None:
    replicas = tf_job().spec.replicas
    assert replicas == Replicas(chief=1, workers=2, ps=1, evaluator=1)
    assert [(r.type, r.index, r.slot) for r in replicas.all] == [
        (ReplicaType.CHIEF, 0, 0),
        (ReplicaType.WORKER, 0, 1),
        (ReplicaType.WORKER, 1, 2),
        (ReplicaType.PS, 0, 3),
        (ReplicaType.EVALUATOR, 0, 4),
    ]
    assert replicas.training == (0, 1, 2, 3)
    assert replicas.slot(ReplicaType.PS, 0) == 3
    assert replicas.slot(ReplicaType.PS, 1) is None
    assert replicas.has_roles


def test_a_job_of_workers_only_has_a_worker_in_every_slot() -> None:
    replicas = parse(defaulted({"spec.numWorkers": 3})).spec.replicas
    assert not replicas.has_roles
    assert [(r.type, r.index, r.slot) for r in replicas.all] == [(ReplicaType.WORKER, i, i) for i in range(3)]
    # A pod past the last worker (numWorkers was larger) is still a worker of that index.
    assert replicas.at(7) == Replica(ReplicaType.WORKER, 7, 7)
    # An empty tensorflow block adds no role: MultiWorkerMirroredStrategy's workers.
    assert not tf_job({"spec.tensorflow": {}}).spec.replicas.has_roles


def test_every_role_has_its_pods_named_after_it() -> None:
    job = tf_job()
    assert pod_names(job) == NAMES
    pods = [build_pod(job, slot, attempt=2, resume_from=None) for slot in range(5)]
    assert [pod["metadata"]["name"] for pod in pods] == NAMES
    labels = [pod["metadata"]["labels"] for pod in pods]
    assert [(lb[contract.REPLICA_TYPE_LABEL], lb[contract.REPLICA_INDEX_LABEL]) for lb in labels] == [
        ("chief", "0"),
        ("worker", "0"),
        ("worker", "1"),
        ("ps", "0"),
        ("evaluator", "0"),
    ]
    assert {lb[contract.ATTEMPT_LABEL] for lb in labels} == {"2"}
    # The training cluster's pods have stable DNS names; the evaluator is not in TF_CONFIG's cluster.
    assert [pod["spec"].get("hostname") for pod in pods] == [*NAMES[:4], None]
    assert {pod["spec"]["subdomain"] for pod in pods} == {"case-job-headless"}


def test_each_role_gets_the_cluster_and_its_own_task() -> None:
    job = tf_job()
    configs = [json.loads(tf_config(job, slot)) for slot in range(5)]
    assert all(config["cluster"] == CLUSTER for config in configs)
    assert [config["task"] for config in configs] == [
        {"type": "chief", "index": 0},
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
        {"type": "ps", "index": 0},
        {"type": "evaluator", "index": 0},
    ]
    assert env_of(job, 3)["TF_CONFIG"] == tf_config(job, 3)


def test_multi_worker_mirrored_gets_the_workers_only() -> None:
    job = tf_job({"spec.tensorflow": {}, "spec.numWorkers": 3})
    assert json.loads(tf_config(job, 2)) == {
        "cluster": {"worker": [f"case-job-worker-{i}.case-job-headless:2222" for i in range(3)]},
        "task": {"type": "worker", "index": 2},
    }
    # A chief without parameter servers (MultiWorkerMirroredStrategy with a chief).
    chief = tf_job({"spec.tensorflow": {"chief": 1}})
    assert json.loads(tf_config(chief, 0))["cluster"] == {
        "chief": CLUSTER["chief"],
        "worker": CLUSTER["worker"],
    }


def test_shared_variables_count_every_role_in_slot_order() -> None:
    job = tf_job()
    envs = [env_of(job, slot) for slot in range(5)]
    assert [env["RANK"] for env in envs] == ["0", "1", "2", "3", "4"]
    assert {env["WORLD_SIZE"] for env in envs} == {"5"}
    assert [(env["TRAININGJOB_REPLICA_TYPE"], env["TRAININGJOB_REPLICA_INDEX"]) for env in envs] == [
        ("chief", "0"),
        ("worker", "0"),
        ("worker", "1"),
        ("ps", "0"),
        ("evaluator", "0"),
    ]
    assert {env["TRAININGJOB_NUM_WORKERS"] for env in envs} == {"2"}
    assert {env["MASTER_ADDR"] for env in envs} == {"case-job-master"}


def test_the_master_service_selects_the_chief() -> None:
    selector = build_master_service(tf_job())["spec"]["selector"]
    assert selector[contract.REPLICA_TYPE_LABEL] == "chief"
    assert selector[contract.REPLICA_INDEX_LABEL] == "0"
    without_chief = build_master_service(tf_job({"spec.tensorflow": {"evaluator": 1}}))["spec"]["selector"]
    assert without_chief[contract.REPLICA_TYPE_LABEL] == "worker"
    # A job of workers only keeps the selector it always had (pods made before the replica-type label).
    plain = build_master_service(parse(defaulted()))["spec"]["selector"]
    assert contract.REPLICA_TYPE_LABEL not in plain
    assert plain[contract.REPLICA_INDEX_LABEL] == "0"


@pytest.mark.parametrize(
    ("roles", "members", "pods"), [({"chief": 1, "ps": 1, "evaluator": 1}, 4, 5), ({}, 2, 2)]
)
def test_gang_and_queue_count_the_roles(roles: dict[str, int], members: int, pods: int) -> None:
    job = tf_job({"spec.tensorflow": roles})
    assert build_pod_group(job, "coscheduling")["spec"]["minMember"] == members
    assert pod_set(job)["count"] == pods


def test_the_grace_period_is_the_pod_templates_and_the_trainer_is_told() -> None:
    default = build_pod(parse(defaulted()), 0, attempt=0, resume_from=None)
    assert default["spec"]["terminationGracePeriodSeconds"] == contract.TERMINATION_GRACE_SECONDS
    assert env_of(parse(defaulted()), 0)[contract.GRACE_PERIOD_ENV] == str(contract.TERMINATION_GRACE_SECONDS)
    longer = parse(defaulted({"spec.podTemplate": {"spec": {"terminationGracePeriodSeconds": 300}}}))
    assert build_pod(longer, 1, attempt=0, resume_from=None)["spec"]["terminationGracePeriodSeconds"] == 300
    assert env_of(longer, 1)[contract.GRACE_PERIOD_ENV] == "300"


def test_names_of_a_job_without_roles_are_unchanged() -> None:
    job = parse(defaulted({"spec.numWorkers": 2}))
    assert pod_name(job, 1) == "case-job-worker-1"
    pod = build_pod(job, 1, attempt=0, resume_from=None)
    assert pod["spec"]["hostname"] == "case-job-worker-1"
    assert pod["metadata"]["labels"][contract.REPLICA_TYPE_LABEL] == "worker"


def test_the_tf_config_examples_of_the_environment_docs_are_what_the_builders_make() -> None:
    """docs/env.md shows worker 1's TF_CONFIG of a 2-worker job mnist, and the parameter server's of the
    same job with a chief, a parameter server and an evaluator: byte for byte the builders'."""
    docs = (REPO / "docs" / "env.md").read_text(encoding="utf-8")
    shown = [block for block in re.findall(r"```json\n(.*?)\n```", docs, re.DOTALL) if '"task"' in block]
    plain = {"spec.framework": "tensorflow", "spec.numWorkers": 2, "spec.gpusPerWorker": 0}
    workers_only = parse(defaulted(plain, name="mnist"))
    with_roles = parse(
        defaulted({**plain, "spec.tensorflow": {"chief": 1, "ps": 1, "evaluator": 1}}, name="mnist")
    )
    assert shown == [tf_config(workers_only, 1), tf_config(with_roles, 3)]
