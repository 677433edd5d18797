"""The operator's guards end to end: what a job owns is deleted with it and a foreign pod is never
adopted, never two pods for one rank across a gang restart, no status write when nothing changed,
and bad input (a missing PriorityClass or claim, an affinity the API server refuses, a deeply nested
spec) that blocks or fails only its own job.

Split out of tests/e2e/test_reconcile.py (a running job, how jobs end).
"""

from __future__ import annotations

import json

import pytest

from crd import contract
from testbed import Kubectl
from tests.e2e import reconcile_support
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    PodWatch,
    assert_healthy,
    condition,
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
from tests.e2e.reconcile_support import DEBUG, SUPPORTING_KINDS, JsonDict, owned_by

# The shared fixtures, bound here so that pytest finds them for this module's tests.
kubectl = reconcile_support.kubectl
running_job = reconcile_support.running_job


# --------------------------------------------------------------------------------- ownership


def test_deleting_the_job_deletes_what_it_owns(
    kubectl: Kubectl, namespace: str, running_job: JsonDict
) -> None:
    assert not running_job["metadata"].get("finalizers")
    selector = f"{contract.JOB_NAME_LABEL}=bert"
    kinds = ",".join(("pods", *SUPPORTING_KINDS))
    before = kubectl.items(kinds, "-n", namespace, "-l", selector)
    assert sorted({item["kind"] for item in before}) == ["Pod", "Service"]
    assert all(owned_by(item, running_job) for item in before)
    shared_selector = f"{contract.COMPONENT_LABEL}={contract.SHARED_COMPONENT}"
    shared = kubectl.items(kinds, "-n", namespace, "-l", shared_selector)
    assert sorted(item["kind"] for item in shared) == ["ConfigMap", "RoleBinding", "ServiceAccount"]

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


def test_a_job_being_deleted_gets_nothing_created_again(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    # A foreground deletion keeps the job (deletionTimestamp) until the garbage collector has deleted
    # its pods and Services, and someone else's finalizer may keep it longer: the operator must not
    # create them again, nor restart the gang they were.
    operator = start_operator(DEBUG)
    kubectl.apply(job_manifest("held", numWorkers=2), "-n", namespace)
    wait_for_state(kubectl, namespace, "held", "Running")
    hold = json.dumps({"metadata": {"finalizers": ["example.com/hold"]}})
    kubectl.run("patch", "trainingjob", "held", "-n", namespace, "--type=merge", "-p", hold)
    selector = f"{contract.JOB_NAME_LABEL}=held"
    watch = PodWatch(kubectl, namespace, "held")
    try:
        wait("the watch to list the pods", lambda: len(watch.events()) >= 2)
        kubectl.run("delete", "trainingjob", "held", "-n", namespace, "--cascade=foreground", "--wait=false")
        wait(
            "the garbage collector to delete the job's pods and Services",
            lambda: not kubectl.items("pods,services", "-n", namespace, "-l", selector),
            timeout=90,
        )
        job = wait_until_quiet(kubectl, operator, namespace, "held", reconciles=1)
        assert not kubectl.items("pods,services", "-n", namespace, "-l", selector)
        assert job["status"]["state"] == "Running"
        assert job["status"]["restartCount"] == 0
    finally:
        events = watch.stop()
        release = json.dumps({"metadata": {"finalizers": None}})
        kubectl.attempt("patch", "trainingjob", "held", "-n", namespace, "--type=merge", "-p", release)
    assert len({pod["metadata"]["uid"] for kind, pod in events if kind == "ADDED"}) == 2
    wait("the job gone", lambda: kubectl.get_or_none("trainingjob", "held", "-n", namespace) is None)


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


def _running_with_quick_restarts(kubectl: Kubectl, namespace: str, name: str, workers: int) -> None:
    """A job whose gang restarts with (almost) no backoff, Running."""
    manifest = job_manifest(
        name,
        numWorkers=workers,
        failurePolicy={"restartBackoff": {"initialDelaySeconds": 0, "maxDelaySeconds": 1}},
    )
    kubectl.apply(manifest, "-n", namespace)
    wait_for_state(kubectl, namespace, name, "Running")


def _running_again(kubectl: Kubectl, namespace: str, name: str) -> JsonDict:
    """The job once its next gang (attempt 1) runs."""

    def restarted() -> JsonDict | None:
        job = get_job(kubectl, namespace, name)
        status = job.get("status") or {}
        return job if status.get("state") == "Running" and status.get("attempt") == 1 else None

    return wait("attempt 1 Running", restarted, timeout=90)


@pytest.mark.usefixtures("operator")
def test_every_pod_deleted_at_once_is_one_counted_restart(kubectl: Kubectl, namespace: str) -> None:
    # No live rank is left to show the gang had formed; the ranks being deleted show it (they were
    # counted as nothing, and the gang re-created as the same attempt, before).
    _running_with_quick_restarts(kubectl, namespace, "all-gone", 2)

    selector = f"{contract.JOB_NAME_LABEL}=all-gone"
    kubectl.run("delete", "pods", "-l", selector, "-n", namespace, "--wait=false")

    status = _running_again(kubectl, namespace, "all-gone")["status"]
    assert status["restartCount"] == 1
    assert status["restarts"] == {"disruption": 1}
    assert status["lastRestartReason"] == "PodDeleted"


@pytest.mark.usefixtures("operator")
def test_never_two_pods_for_one_rank_across_a_gang_restart(kubectl: Kubectl, namespace: str) -> None:
    _running_with_quick_restarts(kubectl, namespace, "gang", 3)
    watch = PodWatch(kubectl, namespace, "gang")
    try:
        wait("the watch to list the pods", lambda: len(watch.events()) >= 3)

        kubectl.run("delete", "pod", "gang-worker-1", "-n", namespace, "--wait=false")

        job = _running_again(kubectl, namespace, "gang")
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
