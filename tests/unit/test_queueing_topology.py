"""Topology-aware gangs (spec.scheduling.topology) through Kueue's TAS, decided by the planner.

The job's Workload asks for its pod set in one domain of a level (required or preferred); Kueue's
admission assigns each pod a domain (down to a node), which the operator puts on the pods it creates,
in the order of the pod set, with the annotation by which Kueue counts them as the Topology's. A
gang restart builds the same pods in the same places; a resized job asks again, in one domain. A
level no flavor's Topology has, or a queue without a Topology, makes the job wait with a reason
naming the field; a topology on a job Kueue does not queue is ignored with a Warning.
"""

from __future__ import annotations

from typing import Any

from builders.workload import pod_set
from controller.planner.kueue import slot_node_selectors
from crd import contract
from crd.spec import parse
from tests.unit.kueue_world import FLAVOR_LABELS, QUEUE, kueue_world
from tests.unit.queueing_steps import admitted, event_reasons, pod_creates, reason, workload_creates

JsonDict = dict[str, Any]
RACK = "example.com/rack"
HOST = "kubernetes.io/hostname"
REQUIRED = {"spec.scheduling.topology": {"level": RACK}}
# Kueue's assignment for two pods: both in rack r1, one per node (v1beta2's slices).
ASSIGNMENT = {
    "levels": [RACK, HOST],
    "slices": [
        {
            "domainCount": 2,
            "valuesPerLevel": [{"universal": "r1"}, {"individual": {"prefix": "node-", "roots": ["a", "b"]}}],
            "podCounts": {"universal": 1},
        }
    ],
}


def test_the_workload_asks_for_the_gang_in_one_domain_required_or_preferred() -> None:
    w = kueue_world(REQUIRED)
    (workload,) = workload_creates(w.step())
    assert workload["spec"]["podSets"][0]["topologyRequest"] == {"required": RACK}

    preferred = parse(kueue_world({"spec.scheduling.topology": {"level": RACK, "mode": "Preferred"}}).job)
    assert pod_set(preferred)["topologyRequest"] == {"preferred": RACK}
    assert "topologyRequest" not in pod_set(parse(kueue_world().job))


def test_each_pod_goes_to_the_domain_kueue_assigned_it_and_a_gang_restart_keeps_them() -> None:
    w = kueue_world(REQUIRED)
    w.step()
    w.admit(topology=ASSIGNMENT)
    pods = sorted(pod_creates(w.step()), key=lambda pod: pod["metadata"]["name"])

    assert [pod["spec"]["nodeSelector"] for pod in pods] == [
        {**FLAVOR_LABELS, RACK: "r1", HOST: "node-a"},
        {**FLAVOR_LABELS, RACK: "r1", HOST: "node-b"},
    ]
    for pod in pods:
        assert pod["metadata"]["annotations"][contract.PODSET_REQUIRED_TOPOLOGY_ANNOTATION] == RACK

    w.start()
    w.step()
    w.exit(1, code=1)
    restarted: list[JsonDict] = []
    for _ in range(10):
        w.finish_terminating()
        w.advance(60)
        restarted += pod_creates(w.step())
        if len(restarted) == 2:
            break
    assert sorted(pod["spec"]["nodeSelector"][HOST] for pod in restarted) == ["node-a", "node-b"]


def test_a_resized_job_asks_for_its_new_gang_in_one_domain_and_goes_where_the_new_admission_says() -> None:
    w = kueue_world(REQUIRED)
    w.step()
    w.admit(topology=ASSIGNMENT)
    w.step()
    w.start()
    w.step()
    w.update_spec(numWorkers=3)
    w.step()  # WorkloadChanged: the pods go
    w.step()  # then the old Workload
    (workload,) = workload_creates(w.step())
    assert workload["spec"]["podSets"][0]["count"] == 3
    assert workload["spec"]["podSets"][0]["topologyRequest"] == {"required": RACK}
    three = {
        "levels": [RACK, HOST],
        "slices": [
            {
                "domainCount": 3,
                "valuesPerLevel": [{"universal": "r2"}, {"individual": {"roots": ["n1", "n2", "n3"]}}],
                "podCounts": {"universal": 1},
            }
        ],
    }
    w.admit(topology=three)
    pods = sorted(pod_creates(w.step()), key=lambda pod: pod["metadata"]["name"])
    assert [(pod["spec"]["nodeSelector"][RACK], pod["spec"]["nodeSelector"][HOST]) for pod in pods] == [
        ("r2", "n1"),
        ("r2", "n2"),
        ("r2", "n3"),
    ]


def test_a_level_no_flavor_has_or_a_flavor_without_topology_is_named_by_the_field() -> None:
    w = kueue_world(REQUIRED)
    result = w.step()
    w.pending(
        'couldn\'t assign flavors to pod set workers: Flavor "a100" does not contain the requested level'
    )
    result = w.step()
    assert reason(w) == "TopologyLevelNotFound"
    found = admitted(w)
    assert found is not None
    assert found["message"].startswith(
        f"spec.scheduling.topology.level {RACK} is not a level of the Topology of any ResourceFlavor "
        f"of LocalQueue {QUEUE}'s ClusterQueue; waiting: couldn't assign flavors"
    )
    assert ("Warning", "TopologyLevelNotFound") in event_reasons(result)

    w.pending(
        'couldn\'t assign flavors to pod set workers: Flavor "a100" does not support TopologyAwareScheduling'
    )
    w.step()
    assert reason(w) == "TopologyNotSupported"


def test_an_assignment_is_read_slice_by_slice_and_domain_by_domain() -> None:
    spread = {
        "levels": [RACK],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [{"individual": {"roots": ["r1", "r2"]}}],
                "podCounts": {"individual": [2, 1]},
            },
            {"domainCount": 1, "valuesPerLevel": [{"universal": "r3"}], "podCounts": {"universal": 1}},
        ],
    }
    assert slot_node_selectors(spread) == ({RACK: "r1"}, {RACK: "r1"}, {RACK: "r2"}, {RACK: "r3"})
    assert slot_node_selectors(None) == ()


def test_a_topology_on_a_job_kueue_does_not_queue_is_ignored_with_a_warning() -> None:
    w = kueue_world(REQUIRED, queue=None)
    result = w.step()
    assert ("Warning", "TopologyIgnored") in event_reasons(result)
    (event,) = [e for e in result.events if e.reason == "TopologyIgnored"]
    assert event.message.startswith(
        f"spec.scheduling.topology is set but the job has no {contract.QUEUE_NAME_LABEL}"
    )
    assert ("Warning", "TopologyIgnored") not in event_reasons(w.step())
    assert ("Warning", "TopologyIgnored") not in event_reasons(kueue_world(REQUIRED).step())
