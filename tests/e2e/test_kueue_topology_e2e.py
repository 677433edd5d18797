"""Topology-aware gangs with the real Kueue v0.17 (its TAS) on kwok nodes in racks.

Two racks of four 8-GPU nodes, in one block, a Topology of their block, rack and hostname levels, and
a ResourceFlavor that names it (tests/e2e/kueue_support.py `racks`, `gpu_queue(topology=...)`). The
quota is larger than the nodes, so what holds a job back is where it may go, not how much it asks for.
One test, several jobs at once (the Kueue tests run in the kwok cluster, no real node):

- a 4-pod gang that must be in one rack lands in one rack, each pod on the node Kueue assigned it,
  and a gang restart puts the new pods on the same nodes;
- a 5-pod gang that must be in one rack waits, Queued, with Kueue's reason;
- a job asking for a level the Topology does not have waits with a condition and a Warning naming
  spec.scheduling.topology.level;
- a 6-pod gang that only prefers one rack spreads over both.
"""

from __future__ import annotations

from typing import Any

from controller.planner.kueue import slot_node_selectors
from testbed import Kubectl, end_pod, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import condition, wait_for_events
from tests.e2e.kueue_support import (
    RACK_LABEL,
    finish,
    gpu_queue,
    is_true,
    pool_toleration,
    queued_job,
    racks,
    topology_name,
    waiting,
    workload_of,
)
from tests.e2e.lifecycle_support import backoff, running_pods, wait_state

JsonDict = dict[str, Any]
MISSING_LEVEL = "topology.example.com/zone"


def in_topology(namespace: str, level: str, mode: str = "Required") -> JsonDict:
    """A job's spec fields that ask Kueue for its gang in one domain of `level`; restarts after 1 s.
    The job tolerates the pool's taint itself: Kueue judges a TAS node's taints by the Workload's pod
    set alone, and would take a node whose taint only the flavor tolerates for failed while a gang
    restart has no pod on it (and evict the job, NodeFailures)."""
    return {
        "scheduling": {
            "topology": {"level": level, "mode": mode},
            "tolerations": [pool_toleration(namespace)],
        },
        "failurePolicy": {"restartPolicy": "OnFailure", "restartBackoff": backoff(1)},
    }


def nodes_of(pods: list[JsonDict]) -> dict[str, str]:
    return {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in pods}


def test_a_gang_lands_in_one_rack_waits_when_no_rack_holds_it_and_spreads_when_it_only_prefers_one(
    kueue: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    kubectl = kueue
    with (
        racks(kubectl, namespace, count=2, nodes=4) as rack_of,
        gpu_queue(kubectl, namespace, gpus=256, topology=topology_name(namespace)),
    ):
        start_operator()
        kubectl.apply(queued_job("fits", numWorkers=4, **in_topology(namespace, RACK_LABEL)), "-n", namespace)
        kubectl.apply(
            queued_job("too-big", numWorkers=5, **in_topology(namespace, RACK_LABEL)), "-n", namespace
        )
        kubectl.apply(queued_job("nowhere", **in_topology(namespace, MISSING_LEVEL)), "-n", namespace)
        wait_state(kubectl, namespace, "fits", "Running")
        first = running_pods(kubectl, namespace, "fits", 0, 4)
        workload = workload_of(kubectl, namespace, "fits")
        too_big = waiting(kubectl, namespace, "too-big", "Pending", "topology")
        nowhere = waiting(kubectl, namespace, "nowhere", "TopologyLevelNotFound")
        warnings = wait_for_events(
            kubectl, namespace, "nowhere", {"TopologyLevelNotFound": ["spec.scheduling.topology.level"]}
        )

        end_pod(kubectl, namespace, "fits-worker-1", exit_code=1)
        again = running_pods(kubectl, namespace, "fits", 1, 4)

        finish(kubectl, namespace, "fits")
        wait_for(
            "fits' Workload Finished", lambda: is_true(workload_of(kubectl, namespace, "fits"), "Finished")
        )
        kubectl.run("delete", "trainingjob", "too-big", "-n", namespace, "--wait=false")
        kubectl.apply(
            queued_job("spread", numWorkers=6, **in_topology(namespace, RACK_LABEL, "Preferred")),
            "-n",
            namespace,
        )
        wait_state(kubectl, namespace, "spread", "Running")
        spread = running_pods(kubectl, namespace, "spread", 0, 6)

    # In one rack, each pod where Kueue's assignment put it (down to the node), and again after a restart.
    assert workload is not None
    assert workload["spec"]["podSets"][0]["topologyRequest"]["required"] == RACK_LABEL
    assignment = workload["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assert len({rack_of[node] for node in nodes_of(first).values()}) == 1
    for pod in first:
        assert pod["spec"]["nodeSelector"]["kubernetes.io/hostname"] == pod["spec"]["nodeName"]
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == RACK_LABEL
    assert sorted(nodes_of(first).values()) == sorted(
        s["kubernetes.io/hostname"] for s in slot_node_selectors(assignment)
    )
    assert nodes_of(again) == nodes_of(first)
    # Too big for a rack: Queued with Kueue's words.
    assert too_big["workers"]["active"] == 0
    assert "allows to fit only 4 out of 5 pod(s)" in too_big["message"], too_big["message"]
    # A level the Topology does not have: the field named, in the condition and a Warning.
    found = condition(nowhere, "Admitted")
    assert found is not None
    assert found["message"].startswith(f"spec.scheduling.topology.level {MISSING_LEVEL} is not a level")
    assert [e["type"] for e in warnings if e["reason"] == "TopologyLevelNotFound"] == ["Warning"]
    # Preferred: six pods fit no rack, so they spread over both.
    assert len(set(nodes_of(spread).values())) == 6
    assert {rack_of[node] for node in nodes_of(spread).values()} == {"rack-0", "rack-1"}
