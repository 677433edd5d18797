"""MultiKueue across two clusters: a TrainingJob submitted to the manager runs on a worker cluster.

The session's cluster, with Kueue, is the manager; the worker is a second, independent control plane
with its own etcd, API server, kwok nodes and Kueue (testbed.start_worker_cluster), started for this
module and taken down after it. The blocks of docs/shared-clusters.md's MultiKueue section are applied
as written: the manager's set-up (MultiKueueCluster, MultiKueueConfig, AdmissionCheck, queues) to the
manager, the worker's queues to the worker, the user's job to the manager. The operator runs on both
clusters (on the manager with the rights deploy/ grants it; on the worker as its admin).

Shown: the job is dispatched and runs on the worker (kwok pods), its status is mirrored to the
manager (Running, then Completed) while the manager's operator writes nothing of its own; deleting it
on the manager deletes the worker's copy; an unknown spec.managedBy and a change of it are refused at
admission; the worker's API server stopped mid-run (the manager's job says so, and nothing is lost when
it returns); MultiKueue taking the copy away (the manager's Workload deactivated: the manager's job
says why, and runs again once reactivated), with another job unaffected throughout; and a worker lost
for longer than MultiKueue's workerLostTimeout (shortened on the manager's Kueue for that test), with a
second worker cluster: Kueue requeues the job and dispatches it to the other worker, and once the lost
worker is back keeps its copy, which Completes.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd import contract
from testbed import (
    Cluster,
    Kubectl,
    KubectlError,
    end_pod,
    kueue_worker_lost_timeout,
    multikueue_cluster,
    start_worker_cluster,
    stop_worker_cluster,
    wait_for,
)
from tests.cluster import SESSION
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    condition,
    events_of,
    get_job,
    pods_of,
    reconciled_versions,
    wait_for_events,
    write_requests,
)
from tests.e2e.lifecycle_support import wait_state, wait_status
from tests.e2e.operator import OperatorProcess
from tests.e2e.test_docs_yaml import SHARED_CLUSTERS, yaml_blocks

JsonDict = dict[str, Any]
SECTION = "## MultiKueue"
JOB = "llama-finetune"
WORKER = "worker1"
WORKER2 = "worker2"
# MultiKueue's workerLostTimeout on the manager while a test loses a worker (Kueue's default: 15 min).
LOST_TIMEOUT = 20


def section_blocks() -> list[str]:
    """The ```yaml blocks of docs/shared-clusters.md's MultiKueue section, in order: the manager's
    set-up, the worker's queues, the user's job."""
    text = SHARED_CLUSTERS.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    return yaml_blocks(section[: section.index("\n## ", len(SECTION))])


def manifests(text: str) -> list[JsonDict]:
    return [document for document in yaml.safe_load_all(text) if document]


MANAGER_SETUP, WORKER_SETUP, USER_JOB = section_blocks()


def job_named(name: str) -> str:
    """The section's job under another name."""
    (job,) = manifests(USER_JOB)
    job["metadata"]["name"] = name
    return json.dumps(job)


@pytest.fixture(scope="module")
def worker_cluster(kueue: Kubectl) -> Iterator[Cluster]:
    """The worker cluster `worker1` with Kueue, its kubeconfig in the manager's Secret; the manager's
    cluster-scoped MultiKueue objects are deleted after the module (the worker goes down)."""
    worker = start_worker_cluster(SESSION, WORKER)
    try:
        yield worker
    finally:
        # Waited for: tests/e2e/test_docs_yaml.py creates the same objects from the same block.
        setup = cluster_scoped(MANAGER_SETUP)
        kueue.run("delete", "-f", "-", "--ignore-not-found", "--timeout=60s", stdin=setup, check=False)
        stop_worker_cluster(SESSION, WORKER)


def worker_active(manager: Kubectl, name: str = WORKER) -> bool:
    """Whether the manager's Kueue is connected to the worker (its MultiKueueCluster Active)."""
    found = manager.get_or_none("multikueuecluster", name) or {}
    active = condition(found.get("status") or {}, "Active") or {}
    return active.get("status") == "True"


def cluster_scoped(text: str) -> str:
    return yaml.safe_dump_all([m for m in manifests(text) if m["kind"] != "LocalQueue"])


class Clusters:
    """The manager and the worker, their operators, and the test's namespace on both."""

    def __init__(self, manager: Kubectl, worker: Cluster, namespace: str, operator: OperatorProcess) -> None:
        self.manager = manager
        self.worker_cluster = worker
        self.worker = worker.kubectl
        self.namespace = namespace
        self.operator = operator
        self.worker_operator: OperatorProcess | None = None

    def start_worker_operator(self, log: Path) -> None:
        ns = self.namespace
        args = (f"--namespace={ns}", f"--lease-namespace={ns}")
        self.worker_operator = OperatorProcess(self.worker_cluster.kubeconfig, log, args).start()
        self.worker_operator.wait_ready()

    def copy(self, name: str, worker: Kubectl | None = None) -> JsonDict | None:
        """The worker's copy of the job `name`."""
        return (worker or self.worker).get_or_none("trainingjob", name, "-n", self.namespace)

    def worker_pods(self, name: str, worker: Kubectl | None = None) -> list[JsonDict]:
        return pods_of(worker or self.worker, self.namespace, name)

    def running_on_worker(self, name: str, worker: Kubectl | None = None) -> list[JsonDict]:
        def probe() -> list[JsonDict] | None:
            pods = self.worker_pods(name, worker)
            return (
                pods if len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods) else None
            )

        return wait_for(f"{name}'s 2 pods Running on the worker", probe, timeout=90)

    def finish_on_worker(self, name: str, worker: Kubectl | None = None) -> None:
        for pod in self.worker_pods(name, worker):
            end_pod(worker or self.worker, self.namespace, pod["metadata"]["name"])


@pytest.fixture
def clusters(
    kueue: Kubectl, worker_cluster: Cluster, namespace: str, start_operator: StartOperator, tmp_path: Path
) -> Iterator[Clusters]:
    """The section's set-up applied to both clusters in the test's namespace, an operator on each."""
    worker = worker_cluster.kubectl
    worker.run("create", "namespace", namespace)
    wait_for(
        f"default ServiceAccount in {namespace} on the worker",
        lambda: worker.get_or_none("serviceaccount", "default", "-n", namespace),
    )
    kueue.run("apply", "-n", namespace, "-f", "-", stdin=MANAGER_SETUP)
    worker.run("apply", "-n", namespace, "-f", "-", stdin=WORKER_SETUP)
    wait_for(f"MultiKueueCluster {WORKER} Active", lambda: worker_active(kueue) or None, timeout=60)
    found = Clusters(kueue, worker_cluster, namespace, start_operator())
    found.start_worker_operator(tmp_path / "worker-operator.log")
    try:
        yield found
    finally:
        if found.worker_operator is not None:
            found.worker_operator.stop()
        worker.run("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)


def touch(clusters: Clusters, value: str) -> None:
    """Changes a label of the manager's job (nothing anyone acts on) and waits until the manager's
    operator has reconciled the version that made."""
    out = clusters.manager.run(
        "label", "trainingjob", JOB, "-n", clusters.namespace, f"touched={value}", "--overwrite", "-o", "json"
    )
    version = str(json.loads(out)["metadata"]["resourceVersion"])
    wait_for(
        f"a reconcile of {JOB} at {version} on the manager",
        lambda: version in reconciled_versions(clusters.operator, clusters.namespace, JOB),
    )


# --------------------------------------------------------------------------------- the tests


def test_a_job_runs_on_the_worker_and_its_status_is_mirrored_to_the_manager(clusters: Clusters) -> None:
    manager, ns = clusters.manager, clusters.namespace
    manager.run("apply", "-n", ns, "-f", "-", stdin=USER_JOB)
    pods = clusters.running_on_worker(JOB)
    copy = clusters.copy(JOB)
    assert copy is not None
    assert "managedBy" not in copy["spec"]
    workload = copy["metadata"]["labels"][contract.PREBUILT_WORKLOAD_LABEL]
    assert [
        owner["name"]
        for owner in clusters.worker.get_json("workload", workload, "-n", ns)["metadata"]["ownerReferences"]
    ] == [JOB]
    assert {pod["spec"]["containers"][0]["resources"]["limits"][contract.GPU_RESOURCE] for pod in pods} == {
        "4"
    }
    status = wait_status(manager, ns, JOB, "Running, mirrored", lambda s: s.get("state") == "Running")
    assert status["message"] == "2/2 workers running"
    # The manager runs nothing of its own, and writes nothing while the copy's status is mirrored.
    assert pods_of(manager, ns, JOB) == []
    assert manager.items("services", "-n", ns) == []
    touch(clusters, "1")
    writes = write_requests(clusters.operator)
    touch(clusters, "2")
    assert write_requests(clusters.operator) == writes
    printed = manager.run("get", "tj", JOB, "-n", ns)
    assert "Running" in printed
    clusters.finish_on_worker(JOB)
    done = wait_state(manager, ns, JOB, "Completed")["status"]
    assert done["message"].startswith("all 2 workers succeeded")
    wait_for("the worker's copy deleted by MultiKueue", lambda: clusters.copy(JOB) is None, timeout=60)
    assert "Completed" in manager.run("get", "tj", JOB, "-n", ns)


def test_deleting_the_job_on_the_manager_deletes_the_worker_copy(clusters: Clusters) -> None:
    manager, ns = clusters.manager, clusters.namespace
    manager.run("apply", "-n", ns, "-f", "-", stdin=USER_JOB)
    clusters.running_on_worker(JOB)
    manager.run("delete", "trainingjob", JOB, "-n", ns)
    wait_for("the worker's copy gone", lambda: clusters.copy(JOB) is None, timeout=60)
    wait_for("the worker's pods gone", lambda: clusters.worker_pods(JOB) == [], timeout=60)


def test_an_unknown_manager_and_a_change_of_managed_by_are_refused_at_admission(
    kueue: Kubectl, namespace: str
) -> None:
    (job,) = manifests(USER_JOB)
    job["spec"]["managedBy"] = "example.com/someone-else"
    with pytest.raises(KubectlError) as refused:
        kueue.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(job))
    assert 'spec.managedBy: Unsupported value: "example.com/someone-else"' in refused.value.stderr
    job["spec"]["managedBy"] = contract.CONTROLLER_NAME
    kueue.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(job))
    patch = json.dumps({"spec": {"managedBy": contract.MULTIKUEUE_CONTROLLER}})
    with pytest.raises(KubectlError) as changed:
        kueue.run("patch", "trainingjob", JOB, "-n", namespace, "--type=merge", "-p", patch)
    assert "spec.managedBy" in changed.value.stderr


def test_a_worker_unreachable_mid_run_is_shown_and_nothing_is_lost(clusters: Clusters) -> None:
    manager, ns = clusters.manager, clusters.namespace
    manager.run("apply", "-n", ns, "-f", "-", stdin=USER_JOB)
    clusters.running_on_worker(JOB)
    wait_state(manager, ns, JOB, "Running")
    clusters.worker_cluster.stop("kube-apiserver")
    try:
        lost = wait_status(
            manager,
            ns,
            JOB,
            "WorkerReachable False",
            lambda s: (condition(s, "WorkerReachable") or {}).get("status") == "False",
            timeout=60,
        )
        wait_for_events(
            manager, ns, JOB, {"WorkerClusterUnreachable": ["worker cluster worker1 is unreachable"]}
        )
    finally:
        clusters.worker_cluster.start("kube-apiserver")
    reachable = condition(lost, "WorkerReachable")
    assert reachable is not None
    assert "ClientConnectionFailed" in reachable["message"]
    assert lost["state"] == "Running"  # the worker's last word, kept while MultiKueue waits
    wait_for("the manager's Kueue connected again", lambda: worker_active(manager) or None, timeout=90)
    back = wait_status(
        manager,
        ns,
        JOB,
        "WorkerReachable no longer False",
        lambda s: (condition(s, "WorkerReachable") or {}).get("status") != "False",
    )
    assert back["state"] == "Running"
    if clusters.worker_operator is not None and not clusters.worker_operator.alive():
        # It gave up its leadership when its API server went away, as a deployed one does before
        # its Deployment restarts it.
        clusters.start_worker_operator(clusters.worker_operator.log_path)
    # The copy ran on meanwhile: the same pods finish, and the end reaches the manager.
    clusters.finish_on_worker(JOB)
    wait_state(manager, ns, JOB, "Completed")


def test_multikueue_taking_the_copy_away_is_explained_on_the_manager(clusters: Clusters) -> None:
    manager, ns = clusters.manager, clusters.namespace
    manager.run("apply", "-n", ns, "-f", "-", stdin=USER_JOB)
    manager.run("apply", "-n", ns, "-f", "-", stdin=job_named("bystander"))
    clusters.running_on_worker(JOB)
    clusters.running_on_worker("bystander")
    wait_state(manager, ns, JOB, "Running")
    wait_state(manager, ns, "bystander", "Running")
    workload = str(get_job(clusters.worker, ns, JOB)["metadata"]["labels"][contract.PREBUILT_WORKLOAD_LABEL])
    manager.run("patch", "workload", workload, "-n", ns, "--type=merge", "-p", '{"spec":{"active":false}}')
    wait_for("the worker's copy deleted by MultiKueue", lambda: clusters.copy(JOB) is None, timeout=60)
    wait_for("the copy's pods gone", lambda: clusters.worker_pods(JOB) == [], timeout=60)
    queued = wait_status(manager, ns, JOB, "Queued, saying why", lambda s: s.get("state") == "Queued")
    assert queued["message"] == (
        "The workload is deactivated; waiting in LocalQueue team-a-workers for dispatch to a worker cluster"
    ), queued
    admitted = condition(queued, "Admitted")
    assert admitted is not None
    assert admitted["reason"] == "Deactivated", queued
    assert get_job(manager, ns, "bystander")["status"]["state"] == "Running"
    manager.run("patch", "workload", workload, "-n", ns, "--type=merge", "-p", '{"spec":{"active":true}}')
    clusters.running_on_worker(JOB)
    wait_state(manager, ns, JOB, "Running")
    for name in (JOB, "bystander"):
        clusters.finish_on_worker(name)
        wait_state(manager, ns, name, "Completed")


class Workers:
    """Both worker clusters by name, each with an operator for the test's namespace."""

    def __init__(self, clusters: Clusters, second: Cluster, log_dir: Path) -> None:
        self.clusters = clusters
        self.by_name = {WORKER: clusters.worker_cluster, WORKER2: second}
        self.log_dir = log_dir
        self.operators: list[OperatorProcess] = []

    def start_operator(self, name: str) -> None:
        ns = self.clusters.namespace
        log = self.log_dir / f"{name}-operator-{len(self.operators)}.log"
        args = (f"--namespace={ns}", f"--lease-namespace={ns}")
        operator = OperatorProcess(self.by_name[name].kubeconfig, log, args).start()
        self.operators.append(operator)
        operator.wait_ready()

    def revive_operator(self, name: str) -> None:
        """A worker's operator gives up its leadership while its API server is away (as a deployed one
        does before its Deployment restarts it): started again."""
        if name == WORKER:
            operator = self.clusters.worker_operator
            if operator is not None and not operator.alive():
                self.clusters.start_worker_operator(operator.log_path)
        elif not all(operator.alive() for operator in self.operators):
            self.start_operator(name)

    def running_copies(self, job: str) -> list[str]:
        """The workers holding a copy of `job` whose 2 pods are Running."""
        found = []
        for name, cluster in self.by_name.items():
            pods = (
                self.clusters.worker_pods(job, cluster.kubectl)
                if self.clusters.copy(job, cluster.kubectl)
                else []
            )
            if len(pods) == 2 and all(pod["status"].get("phase") == "Running" for pod in pods):
                found.append(name)
        return found

    def copies(self, job: str) -> list[str]:
        return [name for name, cluster in self.by_name.items() if self.clusters.copy(job, cluster.kubectl)]

    def all_active(self) -> bool:
        return all(worker_active(self.clusters.manager, name) for name in self.by_name)


@pytest.fixture
def workers(clusters: Clusters, tmp_path: Path) -> Iterator[Workers]:
    """A second worker cluster `worker2` beside worker1, set up as the section sets up a worker (its
    queues, the test's namespace, an operator), with its MultiKueueCluster on the manager (the test
    names it in the MultiKueueConfig); the manager's Kueue with a workerLostTimeout of LOST_TIMEOUT
    (restarted with it while worker2 starts). All of it is taken away after the test."""
    with ThreadPoolExecutor(max_workers=1) as pool, contextlib.ExitStack() as undo:
        starting = pool.submit(start_worker_cluster, SESSION, WORKER2)
        undo.callback(stop_worker_cluster, SESSION, WORKER2)
        undo.enter_context(kueue_worker_lost_timeout(SESSION, LOST_TIMEOUT))
        found = Workers(clusters, starting.result(), tmp_path)
        undo.callback(_forget_worker2, found)
        _set_up_worker2(found)
        yield found


def _set_up_worker2(found: Workers) -> None:
    manager, ns = found.clusters.manager, found.clusters.namespace
    second = found.by_name[WORKER2].kubectl
    second.run("create", "namespace", ns)
    wait_for(
        f"default ServiceAccount in {ns} on {WORKER2}",
        lambda: second.get_or_none("serviceaccount", "default", "-n", ns),
    )
    second.run("apply", "-n", ns, "-f", "-", stdin=WORKER_SETUP)
    manager.apply(multikueue_cluster(WORKER2))
    found.start_operator(WORKER2)


def _forget_worker2(found: Workers) -> None:
    """worker2's operators stopped, and the manager's MultiKueue objects as the section has them."""
    manager = found.clusters.manager
    for operator in found.operators:
        operator.stop()
    one = json.dumps({"spec": {"clusters": [WORKER]}})
    manager.run("patch", "multikueueconfig", "workers", "--type=merge", "-p", one, check=False)
    manager.run("delete", "multikueuecluster", WORKER2, "--ignore-not-found", check=False)


def test_a_worker_lost_past_the_timeout_requeues_the_job_which_completes(
    clusters: Clusters, workers: Workers
) -> None:
    """Its worker's API server stopped for longer than MultiKueue's workerLostTimeout: Kueue evicts the
    manager's Workload (its admission check back to Retry) and requeues it, MultiKueue dispatches it to
    the other worker, where it runs from the start, mirrored to the manager. Once the lost worker is
    back, MultiKueue keeps one copy (the one that reserved first: the lost worker's, which ran on
    meanwhile, so the second is deleted) and the job Completes; nothing is lost, nothing loops.

    worker2 joins the MultiKueueConfig once the job runs on worker1: with both in it from the start,
    Kueue v0.17 dispatches to both at once, and a second copy left over from that race has kept it
    from dispatching the requeued job anywhere (its webhook refused the Workload's clusterName)."""
    manager, ns = clusters.manager, clusters.namespace
    manager.run("apply", "-n", ns, "-f", "-", stdin=USER_JOB)
    uid = get_job(manager, ns, JOB)["metadata"]["uid"]
    clusters.running_on_worker(JOB)
    first = wait_state(manager, ns, JOB, "Running")["status"]
    workload = str(first["queue"]["workload"])
    both = json.dumps({"spec": {"clusters": [WORKER, WORKER2]}})
    manager.run("patch", "multikueueconfig", "workers", "--type=merge", "-p", both)
    wait_for("both MultiKueueClusters Active", lambda: workers.all_active() or None, timeout=90)
    workers.by_name[WORKER].stop("kube-apiserver")
    try:
        wait_for_events(
            manager,
            ns,
            JOB,
            {"WorkerClusterUnreachable": [f"worker cluster {WORKER} is unreachable"]},
            timeout=60,
        )
        evicted = wait_for(
            f"Kueue evicting Workload {workload} past the timeout",
            lambda: (
                [
                    event
                    for event in events_of(manager, ns, workload, kind="Workload")
                    if event["reason"] == "EvictedDueToAdmissionCheck"
                ]
                or None
            ),
            timeout=LOST_TIMEOUT * 4,
        )
        clusters.running_on_worker(JOB, workers.by_name[WORKER2].kubectl)
        moved = wait_status(
            manager,
            ns,
            JOB,
            f"Running, mirrored from {WORKER2}",
            lambda s: s.get("state") == "Running" and s.get("startTime") != first["startTime"],
        )
    finally:
        workers.by_name[WORKER].start("kube-apiserver")
    assert [event["message"] for event in evicted] == ["At least one admission check is false"]
    assert condition(moved, "WorkerReachable") is None  # the other worker's status, mirrored whole
    wait_for(f"MultiKueueCluster {WORKER} Active again", lambda: worker_active(manager) or None, timeout=90)
    workers.revive_operator(WORKER)
    left = wait_for(
        "one copy of the job left",
        lambda: workers.copies(JOB) if len(workers.copies(JOB)) == 1 else None,
        timeout=90,
    )
    assert left == [WORKER]
    clusters.running_on_worker(JOB)
    clusters.finish_on_worker(JOB)
    done = wait_state(manager, ns, JOB, "Completed")
    assert done["metadata"]["uid"] == uid
    assert done["status"]["startTime"] == first["startTime"]  # the lost worker's run, which went on
    touch(clusters, "1")
    writes = write_requests(clusters.operator)
    touch(clusters, "2")
    assert write_requests(clusters.operator) == writes
