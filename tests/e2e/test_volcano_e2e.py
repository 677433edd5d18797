"""Gang scheduling with the real Volcano: its scheduler binds a PodGroup's pods all or none and keeps a
Queue within its capability, and the operator says why a job waits, for a full queue (Volcano's
reason on the Scheduled condition) and for a queue that does not exist or is closed (its own
condition and Event, the pods held back).

The `volcano` fixture adds Volcano's scheduler and queue controller, with its CRDs, to the session's
cluster (testbed/addons/volcano.py). The operator runs with --gang-scheduler=volcano: the session's
cluster may serve scheduler-plugins' PodGroups too, which `auto` would prefer. Pods "run" on kwok
nodes and end when the test ends them (testbed.end_pod), as in tests/e2e/test_gang_scheduling_e2e.py.
The Queue and TrainingJob of docs/shared-clusters.md's Volcano section are applied as written.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from typing import Any, Final

import pytest
import yaml

from crd import contract
from testbed import Kubectl, end_pod, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import PodWatch, condition, event_messages, events_of, get_job, job_manifest, status_of
from tests.e2e.lifecycle_support import (
    TIMEOUT,
    WatchEvents,
    node_pool,
    pool_scheduling,
    retried,
    running_pods,
    wait_state,
    wait_status,
)
from tests.e2e.test_docs_yaml import SHARED_CLUSTERS, yaml_blocks

JsonDict = dict[str, Any]
GANG: Final = "--gang-scheduler=volcano"
QUEUE_API: Final = "scheduling.volcano.sh/v1beta1"


def docs_blocks() -> list[str]:
    """The blocks of docs/shared-clusters.md's Volcano section: a Queue, then a job in it."""
    return [block for block in yaml_blocks(SHARED_CLUSTERS.read_text(encoding="utf-8")) if is_volcanos(block)]


def is_volcanos(block: str) -> bool:
    """A block of Volcano's objects, or of a job naming a Volcano Queue."""
    documents = [item for item in yaml.safe_load_all(block) if item]
    return any(
        str(item.get("apiVersion", "")).startswith("scheduling.volcano.sh/")
        or "queue" in ((item.get("spec") or {}).get("scheduling") or {})
        for item in documents
    )


def manifest_of(block: str) -> JsonDict:
    (document,) = [item for item in yaml.safe_load_all(block) if item]
    assert isinstance(document, dict)
    return document


@contextlib.contextmanager
def cluster_objects(kubectl: Kubectl, *objects: JsonDict) -> Iterator[None]:
    """Cluster-scoped objects (Volcano Queues) created for the block, deleted afterwards."""
    text = "\n---\n".join(json.dumps(item) for item in objects)
    try:
        kubectl.run("apply", "-f", "-", stdin=text)
        yield
    finally:
        retried(
            "the queues deleted",
            functools.partial(
                kubectl.run, "delete", "-f", "-", "--ignore-not-found", "--wait=false", stdin=text
            ),
        )


def queue(name: str) -> JsonDict:
    return {"apiVersion": QUEUE_API, "kind": "Queue", "metadata": {"name": name}, "spec": {"weight": 1}}


def queue_state(kubectl: Kubectl, name: str) -> str:
    found = kubectl.get_or_none("queues.scheduling.volcano.sh", name) or {}
    return str((found.get("status") or {}).get("state") or "")


def operate(kubectl: Kubectl, name: str, action: str) -> None:
    """What `vcctl queue operate` does: a bus Command for the queue controller (OpenQueue, CloseQueue)."""
    target = kubectl.get_json("queues.scheduling.volcano.sh", name)
    reference = {
        "apiVersion": QUEUE_API,
        "kind": "Queue",
        "name": name,
        "uid": target["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    command = {
        "apiVersion": "bus.volcano.sh/v1alpha1",
        "kind": "Command",
        "metadata": {"generateName": f"{name}-{action.lower()}-", "ownerReferences": [reference]},
        "target": reference,
        "action": action,
    }
    kubectl.run("create", "-n", "default", "-f", "-", stdin=json.dumps(command))
    wanted = "Open" if action == "OpenQueue" else "Closed"
    wait_for(f"queue {name} {wanted}", lambda: queue_state(kubectl, name) == wanted or None)


def scheduled_reason(status: JsonDict) -> str | None:
    entry = condition(status, "Scheduled")
    return str(entry.get("reason")) if entry else None


def created(status: JsonDict) -> tuple[str, str, str]:
    entry = condition(status, "Created") or {}
    return str(entry.get("status")), str(entry.get("reason")), str(entry.get("message"))


def finish(kubectl: Kubectl, namespace: str, name: str, workers: int) -> None:
    """Ends the job's running pods as Succeeded and waits until it is Completed."""
    for pod in running_pods(kubectl, namespace, name, 0, workers):
        end_pod(kubectl, namespace, pod["metadata"]["name"])
    wait_state(kubectl, namespace, name, "Completed")


def gpu_holders(events: WatchEvents) -> list[dict[str, int]]:
    """Replays a pod watch: after each event, how many pods each job has bound to a node and not
    ended (deleted pods count until they are gone)."""
    bound: dict[str, str] = {}  # pod uid -> job
    samples = []
    for kind, pod in events:
        uid = str(pod["metadata"]["uid"])
        ended = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if kind == "DELETED" or ended or not pod["spec"].get("nodeName"):
            bound.pop(uid, None)
        else:
            bound[uid] = pod["metadata"]["labels"][contract.JOB_NAME_LABEL]
        counts: dict[str, int] = {}
        for job in bound.values():
            counts[job] = counts.get(job, 0) + 1
        samples.append(counts)
    return samples


def running_one(kubectl: Kubectl, namespace: str, names: tuple[str, ...]) -> str | None:
    running = [name for name in names if status_of(kubectl, namespace, name).get("state") == "Running"]
    assert len(running) <= 1, f"two gangs Running at once on 8 GPUs: {running}"
    return running[0] if running else None


@pytest.mark.slow
def test_three_gangs_on_eight_gpus_run_one_after_another_never_partly_bound(
    volcano: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """Three jobs of 4 workers x 2 GPUs on 2 nodes of 4 GPUs: each needs all 8. Volcano binds one gang
    whole and none of the others' pods; as each finishes, the next runs, whole."""
    kubectl = volcano
    names = ("first", "second", "third")
    with node_pool(kubectl, namespace, 2, gpus=4):
        start_operator(GANG)
        watch = PodWatch(kubectl, namespace)
        try:
            for name in names:
                scheduling = pool_scheduling(namespace, gangScheduling=True)
                manifest = job_manifest(name, numWorkers=4, gpusPerWorker=2, scheduling=scheduling)
                kubectl.apply(manifest, "-n", namespace)
            order = []
            waiting: list[tuple[str, JsonDict]] = []
            for index, _ in enumerate(names):
                current = wait_for(
                    "one gang Running", lambda: running_one(kubectl, namespace, names), timeout=TIMEOUT
                )
                order.append(current)
                if index == 0:  # a gang that waits: admitted into the queue, no room on the nodes
                    other = next(name for name in names if name != current)
                    status = wait_status(
                        kubectl,
                        namespace,
                        other,
                        "Scheduled False with Volcano's reason",
                        lambda s: scheduled_reason(s) == "NotEnoughResources",
                    )
                    waiting.append((other, status))
                finish(kubectl, namespace, current, 4)
            groups = [
                kubectl.get_json("podgroups.scheduling.volcano.sh", name, "-n", namespace) for name in names
            ]
            pods = kubectl.items("pods", "-n", namespace)
        finally:
            events = watch.stop()

    assert sorted(order) == sorted(names)
    ((other, status),) = waiting
    entry = condition(status, "Scheduled")
    assert entry is not None
    assert entry["message"].startswith(
        f"PodGroup {other} is Inqueue in Volcano Queue default (enqueued, its pods not all placed): "
    ), entry
    samples = gpu_holders(events)
    assert all(len(holders) <= 1 for holders in samples), [h for h in samples if len(h) > 1][:3]
    # Every gang was bound whole (its 4 pods together on the pool), one after the other.
    assert max(max(h.values()) for h in samples if h) == 4
    assert [next(iter(h)) for h in samples if h] == sorted(
        (next(iter(h)) for h in samples if h), key=order.index
    )
    for group in groups:
        assert group["spec"]["minMember"] == 4
        assert group["spec"]["queue"] == "default"
        assert group["spec"]["minResources"] == {contract.GPU_RESOURCE: "8"}
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "volcano"
        job = pod["metadata"]["labels"][contract.JOB_NAME_LABEL]
        assert pod["metadata"]["annotations"][contract.VOLCANO_GROUP_NAME_ANNOTATION] == job


@pytest.mark.slow
def test_a_full_queue_holds_the_next_job_pending_with_volcanos_reason_until_room_appears(
    volcano: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """docs/shared-clusters.md's Queue `research` (capability: 8 GPUs) and its job of 4 x 2 GPUs; a
    second such job waits in the queue although the cluster has room, Pending with Volcano's reason
    on its Scheduled condition, and runs, then Completes, once the first has finished."""
    kubectl = volcano
    queue_block, job_block = docs_blocks()
    first = manifest_of(job_block)
    second = {**first, "metadata": {"name": f"{first['metadata']['name']}-2"}}
    names = (first["metadata"]["name"], second["metadata"]["name"])
    with cluster_objects(kubectl, manifest_of(queue_block)):
        wait_for("queue research Open", lambda: queue_state(kubectl, "research") == "Open" or None)
        start_operator(GANG)
        kubectl.apply(first, "-n", namespace)
        wait_state(kubectl, namespace, names[0], "Running")
        kubectl.apply(second, "-n", namespace)
        waiting = wait_status(
            kubectl,
            namespace,
            names[1],
            "Scheduled False with Volcano's reason",
            lambda s: scheduled_reason(s) == "NotEnoughResources",
        )
        pods = kubectl.items("pods", "-n", namespace, "-l", f"{contract.JOB_NAME_LABEL}={names[1]}")
        finish(kubectl, namespace, names[0], 4)
        wait_state(kubectl, namespace, names[1], "Running")
        finish(kubectl, namespace, names[1], 4)

    assert waiting["state"] == "Pending"
    entry = condition(waiting, "Scheduled")
    assert entry is not None
    assert entry["status"] == "False"
    assert entry["message"].startswith(
        f"PodGroup {names[1]} is Pending in Volcano Queue research (not enqueued: the queue's capability"
    ), entry
    assert "tasks in gang unschedulable" in entry["message"]
    assert len(pods) == 4
    assert not [pod for pod in pods if pod["spec"].get("nodeName")]


@pytest.mark.slow
def test_a_queue_that_does_not_exist_or_is_closed_holds_that_job_alone(
    volcano: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """A job naming a queue that does not exist, and one naming a closed queue: no pod is made, the
    Created condition and one Warning Event name the queue, the job is not written again meanwhile;
    a job in the default queue runs beside them. Each starts once its queue exists and is open."""
    kubectl = volcano
    with cluster_objects(kubectl, queue("shut")):
        wait_for("queue shut Open", lambda: queue_state(kubectl, "shut") == "Open" or None)
        operate(kubectl, "shut", "CloseQueue")
        start_operator(GANG)
        for name, queue_name in (("lost", "nowhere"), ("held", "shut")):
            scheduling = {"gangScheduling": True, "queue": queue_name}
            kubectl.apply(job_manifest(name, scheduling=scheduling), "-n", namespace)
        lost = wait_status(
            kubectl,
            namespace,
            "lost",
            "VolcanoQueueNotFound",
            lambda s: created(s)[1] == "VolcanoQueueNotFound",
        )
        held = wait_status(
            kubectl, namespace, "held", "VolcanoQueueClosed", lambda s: created(s)[1] == "VolcanoQueueClosed"
        )
        versions = {
            name: get_job(kubectl, namespace, name)["metadata"]["resourceVersion"]
            for name in ("lost", "held")
        }
        kubectl.apply(job_manifest("other", scheduling={"gangScheduling": True}), "-n", namespace)
        wait_state(kubectl, namespace, "other", "Running")
        later = {
            name: get_job(kubectl, namespace, name)["metadata"]["resourceVersion"]
            for name in ("lost", "held")
        }
        pods = {
            name: kubectl.items("pods", "-n", namespace, "-l", f"{contract.JOB_NAME_LABEL}={name}")
            for name in ("lost", "held")
        }
        events = {name: events_of(kubectl, namespace, name) for name in ("lost", "held")}
        with cluster_objects(kubectl, queue("nowhere")):
            wait_state(kubectl, namespace, "lost", "Running")
            operate(kubectl, "shut", "OpenQueue")
            wait_state(kubectl, namespace, "held", "Running")

    assert lost["state"] == held["state"] == "Pending"
    assert created(lost)[0] == "False"
    assert created(lost)[2].startswith("Volcano Queue nowhere (spec.scheduling.queue) does not exist")
    assert created(held)[2].startswith("Volcano Queue shut (spec.scheduling.queue) is Closed")
    assert pods == {"lost": [], "held": []}
    assert later == versions, "a held job was written while it waited"
    for name, reason, queue_name in (
        ("lost", "VolcanoQueueNotFound", "nowhere"),
        ("held", "VolcanoQueueClosed", "shut"),
    ):
        warnings = [event for event in events[name] if event["reason"] == reason]
        assert [(event["type"], event.get("count", 1)) for event in warnings] == [("Warning", 1)]
        assert f"Volcano Queue {queue_name} " in next(iter(event_messages(warnings, reason)))
