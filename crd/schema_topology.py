"""spec.scheduling.topology: where in the cluster's topology Kueue may place a queued job's gang.

Why its own module: the field is Kueue's topology-aware scheduling (TAS) seen from the TrainingJob,
with its own bounds (a node label key, as Kueue's Topology levels are) and text, kept apart from
the rest of spec.scheduling's schema.
"""

from __future__ import annotations

from crd import contract
from crd.openapi import Schema, obj, string

# A node label key: an optional DNS subdomain prefix and a name (what Kueue's Topology levels are).
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def topology() -> Schema:
    return obj(
        "Topology-aware placement of a queued job's pods by Kueue (its TAS): Kueue admits the job "
        "into a ResourceFlavor with a Topology and picks the nodes, in as few domains of `level` as "
        "it can; the operator puts each pod on the node Kueue assigned. Only for jobs queued in "
        f"Kueue (label {contract.QUEUE_NAME_LABEL}).",
        {
            "level": string(
                "The Topology level (a node label key, e.g. a rack label) whose one domain should hold "
                "the whole gang.",
                max_length=317,
                pattern=LABEL_KEY_PATTERN,
            ),
            "mode": string(
                "Required: the gang waits until it fits in one domain of the level. Preferred: in one "
                "domain if it fits, else spread over as few as needed.",
                max_length=16,
                enum=[mode.value for mode in contract.TopologyMode],
                default=contract.TopologyMode.REQUIRED.value,
            ),
        },
        required=["level"],
    )
