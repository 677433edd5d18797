"""The real operator runs TrainingJobs on the local cluster as docs/architecture.md and docs/env.md say.

Each test starts the operator for its own namespace (tests/e2e/conftest.py), applies jobs with the
project's kubectl and plays the kubelet with tests/cluster.py's `end_pod`. Covered: a job's pods
(names, labels, owner, DNS identity, GPUs, environment), Services, ConfigMap and RBAC; status and
Events through Pending -> Running -> Completed or Failed; the scheduler's reason on the job when
GPUs run out; garbage collection through ownerReferences; refusing to adopt a foreign pod; one pod
per rank across a gang restart; no status write when nothing changed; and bad input the schema
cannot catch (a missing PriorityClass or claim, an invalid affinity) reported on the job while the
operator keeps serving other jobs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from builders.configmap import TRAINER_SOURCES, TRAINER_SOURCES_NAME
from crd import contract
from testbed import Kubectl, end_pod
from tests.e2e import reconcile_support
from tests.e2e.jobs import (
    condition,
    event_messages,
    events_of,
    extra_nodes,
    job_manifest,
    pods_of,
    status_of,
    wait,
    wait_for_events,
    wait_for_state,
)
from tests.e2e.reconcile_support import JsonDict, env_of, owned_by, value

# The shared fixtures, bound here so that pytest finds them for this module's tests.
kubectl = reconcile_support.kubectl
running_job = reconcile_support.running_job

GPU = contract.GPU_RESOURCE


# ------------------------------------------------------------------------------------- a running job


def test_running_job_has_one_pod_per_rank(kubectl: Kubectl, namespace: str, running_job: JsonDict) -> None:
    pods = pods_of(kubectl, namespace, "bert")

    assert [pod["metadata"]["name"] for pod in pods] == ["bert-worker-0", "bert-worker-1", "bert-worker-2"]
    for index, pod in enumerate(pods):
        labels = pod["metadata"]["labels"]
        assert labels[contract.JOB_NAME_LABEL] == "bert"
        assert labels[contract.MANAGED_BY_LABEL] == contract.MANAGED_BY_VALUE
        assert labels[contract.REPLICA_INDEX_LABEL] == str(index)
        assert labels[contract.ATTEMPT_LABEL] == "0"
        assert owned_by(pod, running_job)
        spec = pod["spec"]
        assert spec["hostname"] == f"bert-worker-{index}"
        assert spec["subdomain"] == "bert-headless"
        assert spec["restartPolicy"] == "Never"
        assert spec["serviceAccountName"] == contract.TRAINER_ACCOUNT
        resources = spec["containers"][0]["resources"]
        assert resources["limits"][GPU] == "2"
        assert resources["requests"][GPU] == "2"
        assert pod["status"]["phase"] == "Running"


def test_running_job_pods_get_the_distributed_environment(
    kubectl: Kubectl, namespace: str, running_job: JsonDict
) -> None:
    """docs/env.md: 3 pods x 2 GPUs, so WORLD_SIZE 6 processes, RANK = index * 2, PET_* count pods."""
    for index, pod in enumerate(pods_of(kubectl, namespace, "bert")):
        env = env_of(pod)
        expected = {
            "MASTER_ADDR": "bert-master",
            "MASTER_PORT": "29600",
            "WORLD_SIZE": "6",
            "RANK": str(index * 2),
            "LOCAL_WORLD_SIZE": "2",
            "PET_NNODES": "3",
            "PET_NODE_RANK": str(index),
            "PET_NPROC_PER_NODE": "2",
            "PET_MASTER_ADDR": "bert-master",
            "PET_MASTER_PORT": "29600",
            "TORCH_DISTRIBUTED_BACKEND": "nccl",
            "TRAININGJOB_NAME": "bert",
            "TRAININGJOB_REPLICA_INDEX": str(index),
            "TRAININGJOB_NUM_WORKERS": "3",
            "TRAININGJOB_ATTEMPT": "0",
            "TRAININGJOB_PROGRESS_ANNOTATION": contract.PROGRESS_ANNOTATION,
            "MODEL_NAME": "cnn",
            "DATASET_NAME": "mnist",
            "FRAMEWORK": "pytorch",
            "PYTHONUNBUFFERED": "1",
            "NCCL_IB_DISABLE": "1",
            "LEARNING_RATE": "0.0005",
            "BATCH_SIZE": "32",
            "EPOCHS": "3",
        }
        assert {name: value(env, name) for name in expected} == expected
        assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["TRAININGJOB_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        # Only the chosen framework's family.
        assert not [name for name in env if name == "TF_CONFIG" or name.startswith("JAX_")]
        ports = pod["spec"]["containers"][0]["ports"]
        assert {"name": "dist", "containerPort": 29600, "protocol": "TCP"} in ports


def test_running_job_has_services_configmap_and_rbac(
    kubectl: Kubectl, namespace: str, running_job: JsonDict
) -> None:
    headless = kubectl.get_json("service", "bert-headless", "-n", namespace)
    master = kubectl.get_json("service", "bert-master", "-n", namespace)
    selector = {contract.JOB_NAME_LABEL: "bert", contract.MANAGED_BY_LABEL: contract.MANAGED_BY_VALUE}
    for service in (headless, master):
        assert owned_by(service, running_job)
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["publishNotReadyAddresses"] is True
        assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
            ("dist", 29600, 29600)
        ]
    assert headless["spec"]["selector"] == selector
    assert master["spec"]["selector"] == {**selector, contract.REPLICA_INDEX_LABEL: "0"}

    # The master Service resolves to rank 0's pod IP, and only to it.
    rank0 = kubectl.get_json("pod", "bert-worker-0", "-n", namespace)

    def master_endpoints() -> list[JsonDict] | None:
        slices = kubectl.items(
            "endpointslices", "-n", namespace, "-l", "kubernetes.io/service-name=bert-master"
        )
        endpoints = [endpoint for item in slices for endpoint in item.get("endpoints") or []]
        return endpoints or None

    endpoints = wait("EndpointSlice of bert-master", master_endpoints)
    assert [e["targetRef"]["name"] for e in endpoints] == ["bert-worker-0"]
    assert endpoints[0]["addresses"] == [rank0["status"]["podIP"]]

    # No ConfigMap per job: the job's configuration is in the pods' environment.
    assert kubectl.get_or_none("configmap", "bert-config", "-n", namespace) is None
    mounts = rank0["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "config", "mountPath": "/etc/trainingjob", "readOnly": True} in mounts

    # The namespace's shared trainer identity and trainer sources: no owner, not this job's. The
    # trainers' rights are the shipped ClusterRole (crd/trainer-clusterrole.yaml), bound here: no Role.
    account = kubectl.get_json("serviceaccount", contract.TRAINER_ACCOUNT, "-n", namespace)
    binding = kubectl.get_json("rolebinding", contract.TRAINER_ACCOUNT, "-n", namespace)
    sources = kubectl.get_json("configmap", TRAINER_SOURCES_NAME, "-n", namespace)
    for obj in (account, binding, sources):
        assert "ownerReferences" not in obj["metadata"]
        assert obj["metadata"]["labels"][contract.COMPONENT_LABEL] == contract.SHARED_COMPONENT
    assert kubectl.items("roles", "-n", namespace) == []
    role = kubectl.get_json("clusterrole", contract.TRAINER_CLUSTER_ROLE)
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
        {"apiGroups": [contract.GROUP], "resources": [contract.PLURAL], "verbs": ["get", "list", "watch"]},
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": contract.TRAINER_CLUSTER_ROLE,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": contract.TRAINER_ACCOUNT, "namespace": namespace}
    ]
    assert sources["data"] == TRAINER_SOURCES

    # What the account may do, as the API server's authorizer sees it (the admission policy then narrows
    # patch to the progress and run annotations of the caller's own pod: test_lifecycle_progress_e2e.py).
    trainer = f"system:serviceaccount:{namespace}:{contract.TRAINER_ACCOUNT}"

    def can(*args: str) -> str:
        result = kubectl.attempt("auth", "can-i", *args, "-n", namespace, f"--as={trainer}")
        return result.stdout.strip()

    assert can("patch", "pod/bert-worker-0") == "yes"
    assert can("get", "pod/bert-worker-2") == "no"
    assert can("delete", "pod/bert-worker-0") == "no"
    assert can("list", "pods") == "no"
    assert can("watch", "trainingjob/bert") == "yes"  # an in-place restart's supervisor watches its job
    assert can("patch", "trainingjob/bert") == "no"


def test_running_job_status_and_events(kubectl: Kubectl, namespace: str, running_job: JsonDict) -> None:
    status = running_job["status"]
    assert status["state"] == "Running"
    assert status["message"] == "3/3 workers running"
    assert status["observedGeneration"] == running_job["metadata"]["generation"]
    assert status["workers"] == {"pending": 0, "active": 3, "succeeded": 0, "failed": 0}
    assert status["resources"] == {"gpus": 6, "workers": 3}
    assert status["startTime"]
    assert status["attempt"] == 0
    assert status["restartCount"] == 0
    for type_, reason in (("Created", "PodsCreated"), ("Running", "AllWorkersRunning")):
        entry = condition(status, type_)
        assert entry is not None, status
        assert (entry["status"], entry["reason"]) == ("True", reason)
        assert entry["observedGeneration"] == running_job["metadata"]["generation"]
        assert entry["lastTransitionTime"]
    assert "completionTime" not in status

    row = kubectl.run("get", "tj", "bert", "-n", namespace, "--no-headers").split()
    assert row[:4] == ["bert", "Running", "3", "0"]  # NAME STATE WORKERS RESTARTS (no progress yet)

    created = (
        f"Created configmap: {TRAINER_SOURCES_NAME}; "
        f"rolebinding: {contract.TRAINER_ACCOUNT}; services: bert-headless, bert-master; "
        f"serviceaccount: {contract.TRAINER_ACCOUNT}; pods: bert-worker-0, bert-worker-1, bert-worker-2"
    )
    events = wait_for_events(
        kubectl,
        namespace,
        "bert",
        {
            "Running": ["Running: 3/3 workers running"],
            "SuccessfulCreate": [created],
        },
    )
    # One Event for everything the first reconcile created, not one per object; it also tells of the
    # new job's first state, Pending, which has no Event of its own (README, "Status").
    assert event_messages(events, "SuccessfulCreate") == {created}
    assert not [event for event in events if event["message"].startswith("Pending")], events
    assert all(event["type"] == "Normal" for event in events), events
    assert all(event["involvedObject"]["uid"] == running_job["metadata"]["uid"] for event in events)
    assert all(event["source"]["component"] == contract.OPERATOR_NAME for event in events)


# ------------------------------------------------------------------------------------ how jobs end


@pytest.mark.usefixtures("operator")
def test_all_workers_succeeding_completes_the_job(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(job_manifest("done", numWorkers=2), "-n", namespace)
    job = wait_for_state(kubectl, namespace, "done", "Running")

    for index in range(2):
        end_pod(kubectl, namespace, f"done-worker-{index}", exit_code=0)

    job = wait_for_state(kubectl, namespace, "done", "Completed")
    status = job["status"]
    assert status["message"] == "all 2 workers succeeded"
    succeeded = condition(status, "Succeeded")
    assert succeeded is not None
    assert (succeeded["status"], succeeded["reason"]) == ("True", "AllWorkersSucceeded")
    running = condition(status, "Running")
    assert running is not None
    assert running["status"] == "False"
    assert condition(status, "Failed") is None
    assert status["completionTime"] >= status["startTime"]
    assert status["duration"].endswith("s")
    assert status["workers"] == {"pending": 0, "active": 0, "succeeded": 2, "failed": 0}
    assert "failureReason" not in status
    wait_for_events(
        kubectl, namespace, "done", {"AllWorkersSucceeded": ["Completed: all 2 workers succeeded"]}
    )
    # cleanPodPolicy Running keeps finished pods for inspection.
    assert [pod["status"]["phase"] for pod in pods_of(kubectl, namespace, "done")] == ["Succeeded"] * 2


@pytest.mark.usefixtures("operator")
def test_a_failure_under_restart_policy_never_fails_the_job(kubectl: Kubectl, namespace: str) -> None:
    manifest = job_manifest("fragile", numWorkers=3, failurePolicy={"restartPolicy": "Never"})
    kubectl.apply(manifest, "-n", namespace)
    wait_for_state(kubectl, namespace, "fragile", "Running")

    end_pod(kubectl, namespace, "fragile-worker-1", exit_code=3)

    job = wait_for_state(kubectl, namespace, "fragile", "Failed")
    status = job["status"]
    for fragment in ("fragile-worker-1", "container trainer", "exit code 3", "restartPolicy Never"):
        assert fragment in status["message"], status["message"]
    assert status["failureReason"] == "PodFailed"
    failed = condition(status, "Failed")
    assert failed is not None
    assert (failed["status"], failed["reason"]) == ("True", "PodFailed")
    assert status["completionTime"]
    assert status["restartCount"] == 0
    wait_for_events(kubectl, namespace, "fragile", {"PodFailed": ["Failed: pod fragile-worker-1"]})
    warnings = [e for e in events_of(kubectl, namespace, "fragile") if e["reason"] == "PodFailed"]
    assert warnings
    assert all(e["type"] == "Warning" for e in warnings)
    # The still-running workers are stopped (cleanPodPolicy Running); the failed one is kept.
    wait(
        "only the failed pod left",
        lambda: (
            [p["metadata"]["name"] for p in pods_of(kubectl, namespace, "fragile")] == ["fragile-worker-1"]
        ),
    )
    # Their deletes are one Event naming both, with the reason.
    deleted = "Deleted pods: fragile-worker-0, fragile-worker-2 ("
    events = wait_for_events(kubectl, namespace, "fragile", {"SuccessfulDelete": [deleted]})
    assert len(event_messages(events, "SuccessfulDelete")) == 1, events


@pytest.fixture
def two_node_pool(kubectl: Kubectl, namespace: str) -> Iterator[tuple[str, JsonDict]]:
    """Two extra 8-GPU nodes only this test's pods can use: (pool label value, toleration)."""
    taint = {"key": "tj-e2e/pool", "value": namespace, "effect": "NoSchedule"}
    with extra_nodes(kubectl, 2, gpus=8, labels={"tj-e2e/pool": namespace}, taint=taint):
        yield (
            namespace,
            {"key": "tj-e2e/pool", "operator": "Equal", "value": namespace, "effect": "NoSchedule"},
        )


@pytest.mark.usefixtures("operator")
def test_insufficient_gpus_show_the_schedulers_reason(
    kubectl: Kubectl, namespace: str, two_node_pool: tuple[str, JsonDict]
) -> None:
    pool, toleration = two_node_pool
    manifest = job_manifest(
        "greedy",
        numWorkers=4,
        gpusPerWorker=8,
        scheduling={"nodeSelector": {"tj-e2e/pool": pool}, "tolerations": [toleration]},
    )
    kubectl.apply(manifest, "-n", namespace)

    def unschedulable() -> JsonDict | None:
        status = status_of(kubectl, namespace, "greedy")
        message = str(status.get("message", ""))
        return status if message.startswith("2/4 pods unschedulable: ") else None

    status = wait("2 of 4 pods unschedulable", unschedulable)
    assert "Insufficient nvidia.com/gpu" in status["message"], status["message"]
    assert status["state"] == "Pending"
    running = condition(status, "Running")
    assert running is not None
    assert (running["status"], running["reason"]) == ("False", "PodsUnschedulable")
    assert running["message"] == status["message"]
    wait(
        "2 active, 2 pending",
        lambda: (
            status_of(kubectl, namespace, "greedy").get("workers")
            == {"pending": 2, "active": 2, "succeeded": 0, "failed": 0}
        ),
    )


@pytest.mark.usefixtures("operator")
def test_more_gpus_than_any_node_has(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(job_manifest("huge", numWorkers=2, gpusPerWorker=16), "-n", namespace)

    def unschedulable() -> str | None:
        message = str(status_of(kubectl, namespace, "huge").get("message", ""))
        return message if message.startswith("2/2 pods unschedulable: ") else None

    message = wait("both pods unschedulable", unschedulable)
    assert "Insufficient nvidia.com/gpu" in message
