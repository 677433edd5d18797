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

import json
from collections.abc import Iterator
from typing import Any

import pytest

from builders.configmap import TRAINER_FILES, TRAINER_SOURCES_NAME
from crd import contract
from tests.cluster import Kubectl, end_pod
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    PatientKubectl,
    PodWatch,
    assert_healthy,
    condition,
    event_messages,
    events_of,
    extra_nodes,
    get_job,
    job_manifest,
    pods_of,
    reconciled_versions,
    status_of,
    wait,
    wait_for_events,
    wait_for_state,
    wait_until_quiet,
    write_requests,
)
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]
GPU = contract.GPU_RESOURCE
# Tests that watch the operator's "reconciled" lines need them whatever TJ_TEST_LOG_LEVEL says.
DEBUG = "--log-level=DEBUG"


@pytest.fixture
def kubectl(cluster: Kubectl) -> Kubectl:
    """The project's kubectl, riding out the restarts of the shared API server other tests make."""
    return PatientKubectl.of(cluster)


SUPPORTING_KINDS = ("configmap", "service", "serviceaccount", "role", "rolebinding")


def env_of(pod: JsonDict) -> dict[str, JsonDict]:
    container = pod["spec"]["containers"][0]
    return {entry["name"]: entry for entry in container.get("env", [])}


def value(env: dict[str, JsonDict], name: str) -> str:
    assert name in env, f"{name} missing from {sorted(env)}"
    assert "value" in env[name], env[name]
    return str(env[name]["value"])


def owned_by(obj: JsonDict, job: JsonDict) -> bool:
    owners = obj["metadata"].get("ownerReferences") or []
    return owners == [
        {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND,
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


# ------------------------------------------------------------------------------------- a running job


@pytest.fixture
def running_job(kubectl: Kubectl, namespace: str, operator: OperatorProcess) -> JsonDict:
    """A three-worker PyTorch job with two GPUs per worker and a non-default master port, Running."""
    manifest = job_manifest(
        "bert",
        numWorkers=3,
        gpusPerWorker=2,
        networking={"masterPort": 29600},
        hyperparameters={"learningRate": 0.0005, "batchSize": 32, "epochs": 3},
    )
    kubectl.apply(manifest, "-n", namespace)
    return wait_for_state(kubectl, namespace, "bert", "Running")


def test_running_job_has_one_pod_per_rank(kubectl: Kubectl, namespace: str, running_job: JsonDict) -> None:
    pods = pods_of(kubectl, namespace, "bert")

    assert [pod["metadata"]["name"] for pod in pods] == ["bert-worker-0", "bert-worker-1", "bert-worker-2"]
    for index, pod in enumerate(pods):
        labels = pod["metadata"]["labels"]
        assert labels[contract.JOB_NAME_LABEL] == "bert"
        assert labels[contract.MANAGED_BY_LABEL] == contract.MANAGED_BY_VALUE
        assert labels[contract.REPLICA_INDEX_LABEL] == str(index)
        assert labels[contract.ROLE_LABEL] == ("master" if index == 0 else "worker")
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
            "DIST_BACKEND": "nccl",
            "TRAININGJOB_NAME": "bert",
            "TRAININGJOB_REPLICA_INDEX": str(index),
            "TRAININGJOB_NUM_WORKERS": "3",
            "TRAININGJOB_ATTEMPT": "0",
            "TRAININGJOB_CONFIG": "/etc/trainingjob/config.json",
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

    config_map = kubectl.get_json("configmap", "bert-config", "-n", namespace)
    assert owned_by(config_map, running_job)
    config = json.loads(config_map["data"]["config.json"])
    assert config["name"] == "bert"
    assert config["numWorkers"] == 3
    assert config["hyperparameters"]["learningRate"] == 0.0005
    mounts = rank0["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "config", "mountPath": "/etc/trainingjob", "readOnly": True} in mounts

    # The namespace's shared trainer identity and trainer sources: no owner, not this job's.
    account = kubectl.get_json("serviceaccount", contract.TRAINER_ACCOUNT, "-n", namespace)
    role = kubectl.get_json("role", contract.TRAINER_ACCOUNT, "-n", namespace)
    binding = kubectl.get_json("rolebinding", contract.TRAINER_ACCOUNT, "-n", namespace)
    sources = kubectl.get_json("configmap", TRAINER_SOURCES_NAME, "-n", namespace)
    for obj in (account, role, binding, sources):
        assert "ownerReferences" not in obj["metadata"]
        assert obj["metadata"]["labels"][contract.COMPONENT_LABEL] == contract.SHARED_COMPONENT
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": contract.TRAINER_ACCOUNT,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": contract.TRAINER_ACCOUNT, "namespace": namespace}
    ]
    assert set(sources["data"]) == set(TRAINER_FILES) >= {"train.py", "trainingjob_progress.py"}

    # What the account may do, as the API server's authorizer sees it (the admission policy then
    # narrows patch to the progress annotation of the caller's own pod: test_lifecycle_progress_e2e.py).
    trainer = f"system:serviceaccount:{namespace}:{contract.TRAINER_ACCOUNT}"

    def can(*args: str) -> str:
        result = kubectl.attempt("auth", "can-i", *args, "-n", namespace, f"--as={trainer}")
        return result.stdout.strip()

    assert can("patch", "pod/bert-worker-0") == "yes"
    assert can("get", "pod/bert-worker-2") == "no"
    assert can("delete", "pod/bert-worker-0") == "no"
    assert can("list", "pods") == "no"


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
        f"Created configmaps: bert-config, {TRAINER_SOURCES_NAME}; role: {contract.TRAINER_ACCOUNT}; "
        f"rolebinding: {contract.TRAINER_ACCOUNT}; services: bert-headless, bert-master; "
        f"serviceaccount: {contract.TRAINER_ACCOUNT}; pods: bert-worker-0, bert-worker-1, bert-worker-2"
    )
    events = wait_for_events(
        kubectl,
        namespace,
        "bert",
        {
            "Pending": ["Pending: "],
            "Running": ["Running: 3/3 workers running"],
            "SuccessfulCreate": [created],
        },
    )
    # One Event for everything the first reconcile created, not one per object.
    assert event_messages(events, "SuccessfulCreate") == {created}
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


# --------------------------------------------------------------------------------- ownership


def test_deleting_the_job_deletes_what_it_owns(
    kubectl: Kubectl, namespace: str, running_job: JsonDict
) -> None:
    assert not running_job["metadata"].get("finalizers")
    selector = f"{contract.JOB_NAME_LABEL}=bert"
    kinds = ",".join(("pods", *SUPPORTING_KINDS))
    before = kubectl.items(kinds, "-n", namespace, "-l", selector)
    assert sorted({item["kind"] for item in before}) == ["ConfigMap", "Pod", "Service"]
    assert all(owned_by(item, running_job) for item in before)
    shared_selector = f"{contract.COMPONENT_LABEL}={contract.SHARED_COMPONENT}"
    shared = kubectl.items(kinds, "-n", namespace, "-l", shared_selector)
    assert sorted(item["kind"] for item in shared) == ["ConfigMap", "Role", "RoleBinding", "ServiceAccount"]

    kubectl.run("delete", "trainingjob", "bert", "-n", namespace, "--wait=false")

    wait("the job gone", lambda: kubectl.get_or_none("trainingjob", "bert", "-n", namespace) is None)
    wait(
        "the garbage collector to delete the job's objects",
        lambda: not kubectl.items(kinds, "-n", namespace, "-l", selector),
        timeout=90,
    )
    # The namespace's last job is gone: the operator deletes the shared objects (30 s later).
    if not kubectl.items("trainingjobs", "-n", namespace):
        wait(
            "the operator to delete the namespace's shared objects",
            lambda: not kubectl.items(kinds, "-n", namespace, "-l", shared_selector),
            timeout=120,
        )


def test_a_foreign_pod_is_never_adopted(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    foreign = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "owned-worker-0",
            "labels": {
                contract.JOB_NAME_LABEL: "owned",
                contract.MANAGED_BY_LABEL: contract.MANAGED_BY_VALUE,
                contract.REPLICA_INDEX_LABEL: "0",
            },
        },
        "spec": {"containers": [{"name": "impostor", "image": "busybox"}]},
    }
    operator = start_operator(DEBUG)
    kubectl.apply(foreign, "-n", namespace)
    before = kubectl.get_json("pod", "owned-worker-0", "-n", namespace)

    kubectl.apply(job_manifest("owned", numWorkers=2), "-n", namespace)

    expected = "Pod owned-worker-0 already exists and is not owned by this TrainingJob"

    def blocked() -> JsonDict | None:
        job = get_job(kubectl, namespace, "owned")
        created = condition(job.get("status") or {}, "Created")
        return job if created and created.get("reason") == "FailedCreate" else None

    job = wait("the job blocked", blocked)
    status = job["status"]
    assert status["message"] == expected
    created = condition(status, "Created")
    assert created is not None
    assert (created["status"], created["message"]) == ("False", expected)
    assert status["state"] == "Pending"
    events = wait_for_events(kubectl, namespace, "owned", {"FailedCreate": [expected]})
    assert all(e["type"] == "Warning" for e in events if e["reason"] == "FailedCreate")

    # The operator keeps retrying (with backoff) without rewriting the status each time.
    job = wait_until_quiet(kubectl, operator, namespace, "owned")
    assert job["status"]["message"] == expected

    after = kubectl.get_json("pod", "owned-worker-0", "-n", namespace)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert not after["metadata"].get("ownerReferences")
    assert after["spec"]["containers"][0]["name"] == "impostor"
    # The rank it does own is created; no second pod appears for rank 0.
    pods = pods_of(kubectl, namespace, "owned")
    assert [pod["metadata"]["name"] for pod in pods] == ["owned-worker-0", "owned-worker-1"]
    assert owned_by(pods[1], job)
    assert_healthy(operator)


@pytest.mark.usefixtures("operator")
def test_never_two_pods_for_one_rank_across_a_gang_restart(kubectl: Kubectl, namespace: str) -> None:
    manifest = job_manifest(
        "gang",
        numWorkers=3,
        failurePolicy={"restartBackoff": {"initialDelaySeconds": 0, "maxDelaySeconds": 1}},
    )
    kubectl.apply(manifest, "-n", namespace)
    wait_for_state(kubectl, namespace, "gang", "Running")
    watch = PodWatch(kubectl, namespace, "gang")
    try:
        wait("the watch to list the pods", lambda: len(watch.events()) >= 3)

        kubectl.run("delete", "pod", "gang-worker-1", "-n", namespace, "--wait=false")

        def restarted() -> JsonDict | None:
            job = get_job(kubectl, namespace, "gang")
            status = job.get("status") or {}
            done = status.get("state") == "Running" and status.get("attempt") == 1
            return job if done else None

        job = wait("attempt 1 Running", restarted, timeout=90)
    finally:
        events = watch.stop()

    status = job["status"]
    assert status["restartCount"] == 1
    assert status["lastRestartReason"] == "PodDeleted"
    pods = pods_of(kubectl, namespace, "gang")
    assert [(p["metadata"]["name"], p["metadata"]["labels"][contract.ATTEMPT_LABEL]) for p in pods] == [
        (f"gang-worker-{index}", "1") for index in range(3)
    ]
    # Replay the watch: a rank's next pod is added only after its previous pod is gone.
    live: dict[str, str] = {}
    added: dict[str, list[str]] = {}
    for kind, pod in events:
        rank = pod["metadata"]["labels"][contract.REPLICA_INDEX_LABEL]
        uid = pod["metadata"]["uid"]
        assert pod["metadata"]["name"] == f"gang-worker-{rank}"
        if kind == "ADDED":
            assert rank not in live or live[rank] == uid, f"two pods for rank {rank}: {live[rank]}, {uid}"
            live[rank] = uid
            added.setdefault(rank, []).append(uid)
        elif kind == "DELETED":
            assert live.get(rank) == uid
            del live[rank]
    assert sorted(live) == ["0", "1", "2"]
    assert all(len(uids) == 2 for uids in added.values()), added


# ----------------------------------------------------------------------------- quiet when nothing happens


def test_no_status_write_when_nothing_changed(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """A watch event that changes nothing the operator cares about (a label) is reconciled without
    any write: the job's resourceVersion stays what the label change made it, and the operator's
    POST/PUT/PATCH/DELETE counters stand still. Leader election is off so that no Lease renewal
    counts as a write."""
    operator = start_operator("--leader-elect=false", DEBUG)
    kubectl.apply(job_manifest("steady", numWorkers=2), "-n", namespace)
    wait_for_state(kubectl, namespace, "steady", "Running")
    wait_for_events(kubectl, namespace, "steady", {"Running": ["Running: 2/2 workers running"]})

    def touch(value: str) -> str:
        """Changes a label (a watch event, no spec change); the server's new resourceVersion.
        (`kubectl label -o json` would print the object before the server saw it.)"""
        patch = json.dumps({"metadata": {"labels": {"touched": value}}})
        out = kubectl.run(
            "patch", "trainingjob", "steady", "-n", namespace, "--type=merge", "-p", patch, "-o", "json"
        )
        return str(json.loads(out)["metadata"]["resourceVersion"])

    def reconcile_of(version: str) -> None:
        wait(
            f"the operator to reconcile resourceVersion {version}",
            lambda: version in reconciled_versions(operator, namespace, "steady"),
        )

    first = touch("1")
    reconcile_of(first)
    writes = write_requests(operator)
    assert get_job(kubectl, namespace, "steady")["metadata"]["resourceVersion"] == first

    second = touch("2")
    reconcile_of(second)

    assert get_job(kubectl, namespace, "steady")["metadata"]["resourceVersion"] == second
    assert write_requests(operator) == writes
    assert_healthy(operator)


# ---------------------------------------------------------------------- bad input reaching the operator


def test_missing_priority_class_blocks_only_that_job(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator(DEBUG)
    missing = f"no-such-class-{namespace}"[:63]
    kubectl.apply(job_manifest("vip", scheduling={"priority": missing}), "-n", namespace)
    kubectl.apply(job_manifest("ordinary"), "-n", namespace)

    wait_for_state(kubectl, namespace, "ordinary", "Running")

    def blocked() -> JsonDict | None:
        job = get_job(kubectl, namespace, "vip")
        created = condition(job.get("status") or {}, "Created")
        return job if created and created.get("reason") == "FailedCreate" else None

    job = wait("vip blocked", blocked)
    status = job["status"]
    assert f"no PriorityClass with name {missing} was found" in status["message"], status["message"]
    assert status["state"] == "Pending"
    assert not pods_of(kubectl, namespace, "vip")
    events = wait_for_events(
        kubectl, namespace, "vip", {"FailedCreate": [f"no PriorityClass with name {missing}"]}
    )
    assert all(e["type"] == "Warning" for e in events if e["reason"] == "FailedCreate")

    # Retried with backoff, without rewriting the status each time.
    job = wait_until_quiet(kubectl, operator, namespace, "vip")
    assert job["status"]["message"] == status["message"]
    assert status_of(kubectl, namespace, "ordinary")["state"] == "Running"
    assert_healthy(operator)


def test_missing_claim_leaves_pods_pending_with_the_schedulers_reason(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    manifest = job_manifest(
        "unclaimed", checkpoint={"enabled": True, "storage": {"pvc": {"claimName": "missing-claim"}}}
    )
    kubectl.apply(manifest, "-n", namespace)

    def reported() -> str | None:
        message = str(status_of(kubectl, namespace, "unclaimed").get("message", ""))
        return message if message.startswith("2/2 pods unschedulable: ") else None

    message = wait("the scheduler's reason on the job", reported)
    assert 'persistentvolumeclaim "missing-claim" not found' in message
    status = status_of(kubectl, namespace, "unclaimed")
    assert status["state"] == "Pending"
    running = condition(status, "Running")
    assert running is not None
    assert running["reason"] == "PodsUnschedulable"
    assert [pod["status"]["phase"] for pod in pods_of(kubectl, namespace, "unclaimed")] == ["Pending"] * 2
    assert_healthy(operator)


def test_an_affinity_the_api_server_refuses_fails_the_job(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    """scheduling.affinity has Kubernetes' schema, but not every rule of the Pod API's validation: an
    In expression without values gets past admission, the pods' validation refuses it, and the job
    fails with InvalidSpec instead of retrying forever."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": []}]}]
            }
        }
    }
    kubectl.apply(job_manifest("picky", scheduling={"affinity": affinity}), "-n", namespace)
    kubectl.apply(job_manifest("easy"), "-n", namespace)

    job = wait_for_state(kubectl, namespace, "picky", "Failed")

    status = job["status"]
    assert status["failureReason"] == "InvalidSpec"
    assert status["message"].startswith("invalid spec: ")
    assert "spec.affinity.nodeAffinity" in status["message"]
    assert "values: Required value" in status["message"]
    failed = condition(status, "Failed")
    assert failed is not None
    assert (failed["status"], failed["reason"]) == ("True", "InvalidSpec")
    running = condition(status, "Running")
    assert running is not None
    assert (running["status"], running["reason"]) == ("False", "InvalidSpec")
    # Finished like any failed job: completion time and duration, the deadline clock stopped.
    assert status["completionTime"]
    assert status["duration"].endswith("s")
    assert "runningSince" not in status
    wait_for_events(kubectl, namespace, "picky", {"InvalidSpec": ["invalid spec: "]})
    assert not pods_of(kubectl, namespace, "picky")
    wait_for_state(kubectl, namespace, "easy", "Running")
    assert_healthy(operator)


def _deep_json(opening: str, closing: str, depth: int, leaf: str) -> str:
    return opening * depth + leaf + closing * depth


@pytest.mark.parametrize(
    ("field", "deep"),
    [
        pytest.param(
            "scheduling",
            '{"affinity": {"nodeAffinity": ' + _deep_json('{"k": [', "]}", 500, "1") + "}}",
            id="affinity-500-levels",
        ),
        pytest.param(
            "env",
            '[{"name": "DEEP", "valueFrom": ' + _deep_json('{"fieldRef": ', "}", 2000, '"x"') + "}]",
            id="env-valueFrom-2000-levels",
        ),
    ],
)
def test_a_deeply_nested_spec_cannot_stop_the_operator(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, field: str, deep: str
) -> None:
    """A value nested hundreds of levels deep is refused at admission or isolated: that job fails with
    InvalidSpec, the watch goes on, and a job created after it runs (issue: one tenant's object used to
    stop the TrainingJob watch for every namespace)."""
    # Written by hand: Python's own encoder cannot nest this deep.
    head, _, tail = json.dumps(job_manifest("deep")).rpartition('"spec": {')
    manifest = f'{head}"spec": {{"{field}": {deep}, {tail}'
    applied = kubectl.attempt("apply", "-n", namespace, "-f", "-", stdin=manifest)
    kubectl.apply(job_manifest("canary"), "-n", namespace)

    wait_for_state(kubectl, namespace, "canary", "Running")
    if applied.returncode == 0:
        # Only the status is read back: the test's own JSON decoder could not read the whole job.
        def failed() -> JsonDict | None:
            status: JsonDict = json.loads(
                kubectl.run("get", "trainingjob", "deep", "-n", namespace, "-o", "jsonpath={.status}") or "{}"
            )
            return status if status.get("state") == "Failed" else None

        status = wait("the deep job Failed", failed)
        assert status["failureReason"] == "InvalidSpec"
        assert f"spec.{field}" in status["message"], status["message"]
        assert not pods_of(kubectl, namespace, "deep")
    else:
        assert f"spec.{field}" in applied.stderr, applied.stderr
    assert_healthy(operator)
    assert not [entry for entry in operator.logs() if "Traceback" in str(entry.get("exc_info", ""))]
