"""The topology-aware scheduling cost measurement (testbed/harness/bench/tascost.py): its assignment is
the worst case it claims (one pod per node, two racks), and its pods are placed as the operator's."""

from __future__ import annotations

from controller.planner.kueue import slot_node_selectors
from testbed.harness.bench import tascost


def test_the_assignment_puts_one_pod_on_each_node_of_two_racks() -> None:
    selectors = slot_node_selectors(tascost.assignment(5))

    assert len({selector[tascost.HOST] for selector in selectors}) == 5
    assert [selector[tascost.RACK] for selector in selectors] == ["rack-0"] * 2 + ["rack-1"] * 3


def test_the_measured_pods_carry_their_domain_only_with_the_topology() -> None:
    plain = tascost.gang(3, topology=False)()
    placed = tascost.gang(3, topology=True)()

    assert all(tascost.HOST not in pod["spec"]["nodeSelector"] for pod in plain)
    assert [pod["spec"]["nodeSelector"][tascost.HOST] for pod in placed] == [
        "rack-0-node-0",
        "rack-1-node-0",
        "rack-1-node-1",
    ]
    figures = tascost.measure(3, rounds=1)
    assert figures["pod_bytes_with_topology"] > figures["pod_bytes"]
