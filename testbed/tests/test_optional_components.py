"""The optional components of the dev cluster do their job: Kueue queues, the coscheduling scheduler
binds gangs whole or not at all (testbed/addons/optional.py, `up --with kueue,coscheduling`).

Kueue: a ClusterQueue with quota for one GPU and two batch Jobs of one GPU each. Kueue's mutating
webhook suspends both as they are created (the create response already says so, before any controller
could act), Kueue admits one and keeps the other pending for lack of quota, and admits it once the
first has finished. Its validating webhook refuses a Workload that asks for the reserved `pods`
resource. Coscheduling: a PodGroup of three pods of 8 GPUs on two private nodes of 8 GPUs binds no
pod at all, though two would fit; with a third node all three are bound, by the second scheduler.

The components run on the session's cluster (the `kueue` and `coscheduling` fixtures). The last test
runs a throwaway cluster to show an optional component follows the cluster: added to a running one,
brought back when a crashed one is rebuilt, restarted with the API server, stopped by `down`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crd import contract
from testbed import Kubectl, end_pod, wait_for
from testbed.common import DEV, listening_addresses, pid_running
from testbed.tests.clusters import dev_cluster, listening_ports, read_state
from tests.e2e.jobs import PodWatch, extra_nodes

JsonDict = dict[str, Any]
GPU = contract.GPU_RESOURCE
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
SCHEDULER = contract.COSCHEDULING_SCHEDULER_NAME
POOL_KEY = "tj-hack/pool"


def condition(obj: JsonDict | None, type_: str) -> JsonDict | None:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == type_), None)


def is_true(obj: JsonDict | None, type_: str) -> bool:
    found = condition(obj, type_)
    return found is not None and found["status"] == "True"


def container(requests: dict[str, str], *, limits: bool = False) -> JsonDict:
    resources = {"requests": requests, **({"limits": requests} if limits else {})}
    return {"name": "main", "image": "busybox:1.36", "resources": resources}


def events(kubectl: Kubectl, namespace: str, reason: str, fragment: str = "") -> list[JsonDict]:
    return [
        event
        for event in kubectl.items("events", "-n", namespace)
        if event["reason"] == reason and fragment in event["message"]
    ]


# ------------------------------------------------------------------------------------------- Kueue


@contextlib.contextmanager
def gpu_queue(kubectl: Kubectl, namespace: str, gpus: int) -> Iterator[str]:
    """A ResourceFlavor and a ClusterQueue with `gpus` GPUs for `namespace` only, and a LocalQueue
    there; yields the LocalQueue's name. The cluster-scoped objects are deleted afterwards."""
    name = f"tj-hack-{uuid.uuid4().hex[:6]}"
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": name}}
    quota = {"name": name, "resources": [{"name": GPU, "nominalQuota": gpus}]}
    cluster_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [{"coveredResources": [GPU], "flavors": [quota]}],
        },
    }
    local_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "LocalQueue",
        "metadata": {"name": "queue", "namespace": namespace},
        "spec": {"clusterQueue": name},
    }
    try:
        for manifest in (flavor, cluster_queue, local_queue):
            kubectl.run("create", "-f", "-", stdin=json.dumps(manifest))
        wait_for(
            f"ClusterQueue {name} active", lambda: is_true(kubectl.get_json("clusterqueue", name), "Active")
        )
        yield "queue"
    finally:
        for kind in ("clusterqueue", "resourceflavor"):
            kubectl.run("delete", kind, name, "--ignore-not-found", "--wait=false", check=False)


def queued_job(name: str, queue: str) -> JsonDict:
    """A batch Job of one pod with one GPU, in `queue`, created unsuspended."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "suspend": False,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [container({GPU: "1"}, limits=True)]}
            },
        },
    }


def workload_of(kubectl: Kubectl, namespace: str, job: JsonDict) -> JsonDict | None:
    uid = job["metadata"]["uid"]
    for workload in kubectl.items("workloads.kueue.x-k8s.io", "-n", namespace):
        if any(owner["uid"] == uid for owner in workload["metadata"].get("ownerReferences", [])):
            return workload
    return None


def workload_if(workload: JsonDict | None, predicate: Callable[[JsonDict], bool]) -> JsonDict | None:
    return workload if workload is not None and predicate(workload) else None


def admitted(workload: JsonDict) -> bool:
    return is_true(workload, "Admitted")


def pending_for_quota(workload: JsonDict) -> bool:
    reserved = condition(workload, "QuotaReserved")
    return (
        reserved is not None
        and reserved["status"] == "False"
        and f"insufficient unused quota for {GPU}" in reserved["message"]
    )


def running_pod(kubectl: Kubectl, namespace: str, job: str) -> JsonDict | None:
    pods = kubectl.items("pods", "-n", namespace, "-l", f"job-name={job}")
    return next((pod for pod in pods if pod["status"].get("phase") == "Running"), None)


def test_kueue_admits_within_quota_and_queues_the_rest(kueue: Kubectl, namespace: str) -> None:
    kubectl = kueue
    with gpu_queue(kubectl, namespace, gpus=1) as queue:
        created = []
        for name in ("first", "second"):
            out = kubectl.run(
                "create", "-n", namespace, "-o", "json", "-f", "-", stdin=json.dumps(queued_job(name, queue))
            )
            created.append(json.loads(out))
        # Kueue's mutating webhook (mjob.kb.io) suspended them on admission: nothing else had a chance.
        assert [job["spec"]["suspend"] for job in created] == [True, True]

        first = wait_for(
            "first's Workload admitted",
            lambda: workload_if(workload_of(kubectl, namespace, created[0]), admitted),
        )
        pending = wait_for(
            "second's Workload pending for quota",
            lambda: workload_if(workload_of(kubectl, namespace, created[1]), pending_for_quota),
        )
        second_job = kubectl.get_json("job", "second", "-n", namespace)

        # Admitted: unsuspended, its pod runs. Once it has finished, the second gets the quota.
        pod = wait_for("first's pod Running", lambda: running_pod(kubectl, namespace, "first"))
        end_pod(kubectl, namespace, pod["metadata"]["name"])
        wait_for(
            "first's Workload finished",
            lambda: is_true(workload_of(kubectl, namespace, created[0]), "Finished"),
        )
        wait_for(
            "second's Workload admitted",
            lambda: is_true(workload_of(kubectl, namespace, created[1]), "Admitted"),
        )
        wait_for(
            "second unsuspended",
            lambda: kubectl.get_json("job", "second", "-n", namespace)["spec"]["suspend"] is False,
        )

    admission = first["status"]["admission"]
    assert admission["podSetAssignments"][0]["flavors"] == {GPU: admission["clusterQueue"]}
    assert not is_true(pending, "Admitted")
    assert second_job["spec"]["suspend"] is True


def test_kueue_validating_webhook_refuses_a_reserved_resource(kueue: Kubectl, namespace: str) -> None:
    pod_set = {
        "name": "main",
        "count": 1,
        "template": {"spec": {"restartPolicy": "Never", "containers": [container({"pods": "1"})]}},
    }
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "Workload",
        "metadata": {"name": "reserved", "namespace": namespace},
        "spec": {"podSets": [pod_set]},
    }
    result = kueue.attempt("create", "-f", "-", stdin=json.dumps(workload))
    assert result.returncode != 0
    assert 'admission webhook "vworkload.kb.io" denied the request' in result.stderr
    assert "requests[pods]" in result.stderr
    assert "the key is reserved for internal kueue use" in result.stderr
    assert kueue.get_or_none("workloads.kueue.x-k8s.io", "reserved", "-n", namespace) is None


# ------------------------------------------------------------------------------------ coscheduling


def gang(namespace: str, name: str, members: int, gpus: int) -> JsonDict:
    """A List: a PodGroup of `members` pods with `gpus` GPUs each, for the second scheduler, on the pool."""
    group = {
        "apiVersion": contract.COSCHEDULING_GROUP_VERSION,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": members},
    }
    spec = {
        "schedulerName": SCHEDULER,
        "nodeSelector": {POOL_KEY: namespace},
        "tolerations": [{"key": POOL_KEY, "operator": "Equal", "value": namespace}],
        "containers": [container({GPU: str(gpus)}, limits=True)],
    }
    labels = {contract.COSCHEDULING_POD_GROUP_LABEL: name}
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-{index}", "namespace": namespace, "labels": labels},
            "spec": spec,
        }
        for index in range(members)
    ]
    return {"apiVersion": "v1", "kind": "List", "items": [group, *pods]}


def bound(watched: list[tuple[str, JsonDict]]) -> set[str]:
    """Pods with a node at the end of these watch events."""
    nodes: dict[str, str] = {}
    for kind, pod in watched:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            nodes.pop(name, None)
        elif pod["spec"].get("nodeName"):
            nodes[name] = pod["spec"]["nodeName"]
    return set(nodes)


def pool(kubectl: Kubectl, namespace: str, count: int) -> contextlib.AbstractContextManager[list[str]]:
    """`count` nodes of 8 GPUs that only this test's pods tolerate."""
    taint = {"key": POOL_KEY, "value": namespace, "effect": "NoSchedule"}
    return extra_nodes(kubectl, count, gpus=8, labels={POOL_KEY: namespace}, taint=taint, prefix="tj-hack")


def all_bound(kubectl: Kubectl, namespace: str) -> list[JsonDict] | None:
    pods = kubectl.items("pods", "-n", namespace)
    return pods if pods and all(pod["spec"].get("nodeName") for pod in pods) else None


def scheduled_events(kubectl: Kubectl, namespace: str, count: int) -> list[JsonDict] | None:
    found = events(kubectl, namespace, "Scheduled")
    return found if len(found) == count else None


def all_unschedulable(kubectl: Kubectl, namespace: str) -> bool:
    return all(
        (scheduled := condition(pod, "PodScheduled")) is not None and scheduled["reason"] == "Unschedulable"
        for pod in kubectl.items("pods", "-n", namespace)
    )


def test_coscheduling_binds_a_gang_whole_or_not_at_all(coscheduling: Kubectl, namespace: str) -> None:
    kubectl = coscheduling
    watch = PodWatch(kubectl, namespace)
    try:
        with pool(kubectl, namespace, 2):
            kubectl.run("create", "-f", "-", stdin=json.dumps(gang(namespace, "trio", 3, 8)))
            # Two of the three would fit; the coscheduling plugin rejects the group as a whole.
            rejection = f"PodGroup {namespace}/trio gets rejected"
            rejected = wait_for(
                "the gang rejected as a whole",
                lambda: events(kubectl, namespace, "FailedScheduling", rejection),
            )
            wait_for("every pod of the gang unschedulable", lambda: all_unschedulable(kubectl, namespace))
            before = watch.events()
            with pool(kubectl, namespace, 1):
                pods = wait_for("all three pods bound", lambda: all_bound(kubectl, namespace))
                scheduled = wait_for(
                    "three Scheduled events", lambda: scheduled_events(kubectl, namespace, 3)
                )
                kubectl.run("delete", "pods", "--all", "-n", namespace, "--wait=true", "--timeout=60s")
    finally:
        watch.stop()

    assert {event.get("reportingComponent") for event in rejected} == {SCHEDULER}
    assert bound(before) == set(), f"bound while only two could fit: {bound(before)}"
    assert len({pod["spec"]["nodeName"] for pod in pods}) == 3
    assert {event.get("reportingComponent") for event in scheduled} == {SCHEDULER}


def test_coscheduling_and_kueue_listen_on_loopback_only(kueue: Kubectl, coscheduling: Kubectl) -> None:
    processes = read_state(DEV)["processes"]
    for name in ("kueue", "coscheduling"):
        addresses = listening_addresses(processes[name]["pid"])
        assert addresses, f"{name} listens on nothing?"
        for address, port in addresses:
            assert address in ("127.0.0.1", "::ffff:127.0.0.1"), f"{name} listens on {address}:{port}"


# -------------------------------------------------------------------------- a throwaway second cluster


@pytest.mark.slow
@pytest.mark.components
def test_an_optional_component_follows_the_cluster(scratch_dir: Path) -> None:
    dev_cluster("up", "--nodes", "1", dev_dir=scratch_dir)
    assert "optional:    none" in dev_cluster("status", dev_dir=scratch_dir).stdout

    unknown = dev_cluster("up", "--with", "yunikorn", dev_dir=scratch_dir, check=False)
    assert unknown.returncode == 1
    assert "unknown optional component 'yunikorn'; one of: coscheduling, kueue, volcano" in unknown.stderr

    # Added to the running cluster; a second `up --with` leaves it running.
    dev_cluster("up", "--with", "coscheduling", dev_dir=scratch_dir)
    state = read_state(scratch_dir)
    assert state["optional"] == ["coscheduling"]
    first = state["processes"]["coscheduling"]["pid"]
    assert pid_running(first)
    again = dev_cluster("up", "--with", "coscheduling", dev_dir=scratch_dir)
    assert "coscheduling is already running" in again.stderr
    status = dev_cluster("status", dev_dir=scratch_dir).stdout
    assert "optional:    coscheduling" in status
    assert "scheduler-plugins v0.32." in status
    assert "coscheduling.log" in status

    # A crashed cluster is rebuilt with it.
    killed = state["processes"]["kube-scheduler"]["pid"]
    os.kill(killed, signal.SIGKILL)
    wait_for(f"kube-scheduler (pid {killed}) gone", lambda: not pid_running(killed))
    rebuilt = dev_cluster("up", "--nodes", "1", dev_dir=scratch_dir)
    assert "restarting it cleanly" in rebuilt.stderr
    state = read_state(scratch_dir)
    assert state["optional"] == ["coscheduling"]
    assert not pid_running(first)
    second = state["processes"]["coscheduling"]["pid"]
    assert pid_running(second)

    # Restarted after the API server, like the kube-scheduler.
    restarted = dev_cluster("restart", "kube-apiserver", dev_dir=scratch_dir)
    assert "restarted coscheduling after the API server" in restarted.stderr
    third = read_state(scratch_dir)["processes"]["coscheduling"]["pid"]
    assert third != second
    assert pid_running(third)

    ports = list(read_state(scratch_dir)["ports"].values())
    dev_cluster("down", dev_dir=scratch_dir)
    assert not pid_running(third)
    assert not set(ports) & listening_ports()
