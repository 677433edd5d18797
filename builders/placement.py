"""Where Kueue's admission sends a queued job's pods: node labels, tolerations, labels, annotations.

Kueue admits a Workload into ResourceFlavors: each flavor stands for a kind of node (its
`nodeLabels`) and may carry `tolerations` for those nodes' taints. A job integrated with Kueue must
put them on the pods it starts, or the pods could land on nodes of another flavor, or on none. An
admission check may add labels, annotations, a node selector and tolerations of its own (its
`podSetUpdates`). With topology-aware scheduling (spec.scheduling.topology) Kueue also assigns each
pod a domain of its Topology (down to a node): the node labels of the domain of each slot, in the
order of the pod set, are `slot_node_selectors`. `Placement` is the sum of all; `place` puts it on a
built pod, after spec.podTemplate was merged, so that what admission decided wins.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Placement:
    """What an admission adds to every pod of the job."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    slot_node_selectors: tuple[Mapping[str, str], ...] = ()

    def for_slot(self, slot: int) -> Placement:
        """What goes on the pod of `slot`: the topology domain Kueue assigned to it added to the node
        selector (a slot past the assignment gets the rest only)."""
        if slot >= len(self.slot_node_selectors):
            return self
        selector = {**self.node_selector, **self.slot_node_selectors[slot]}
        return Placement(selector, self.tolerations, self.labels, self.annotations)


def place(pod: Mapping[str, Any], placement: Placement | None) -> JsonDict:
    """`pod` with `placement` added: the node selector merged (admission's value wins for a key both
    set), tolerations appended unless the pod has an equal one already, labels and annotations added
    (the pod's own keys, which the operator selects its pods by, are kept)."""
    if placement is None:
        return dict(pod)
    placed = copy.deepcopy(dict(pod))
    spec = placed["spec"]
    if placement.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **placement.node_selector}
    if placement.tolerations:
        tolerations = list(spec.get("tolerations") or [])
        for toleration in placement.tolerations:
            if dict(toleration) not in tolerations:
                tolerations.append(copy.deepcopy(dict(toleration)))
        spec["tolerations"] = tolerations
    metadata = placed["metadata"]
    if placement.labels:
        metadata["labels"] = {**placement.labels, **(metadata.get("labels") or {})}
    if placement.annotations:
        metadata["annotations"] = {**placement.annotations, **(metadata.get("annotations") or {})}
    return placed
