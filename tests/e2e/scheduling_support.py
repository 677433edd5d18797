"""What the scheduling tests end to end share (tests/e2e/test_lifecycle_scheduling_e2e.py,
tests/e2e/test_gang_scheduling_e2e.py, tests/e2e/test_discovery_e2e.py): a fast restart backoff,
waiting for a pod the scheduler cannot place, the PodGroup API taken away for a block, and which
scheduler bound each pod.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from crd import contract
from testbed import Kubectl
from tests.cluster import optional_api_withdrawn
from tests.e2e.lifecycle_support import (
    wait_status,
)

JsonDict = dict[str, Any]


BACKOFF = {"initialDelaySeconds": 1, "maxDelaySeconds": 2}


def wait_unschedulable(
    kubectl: Kubectl, namespace: str, name: str, pods: str, *, attempt: int | None = None
) -> JsonDict:
    """Waits until the job says `<pods> pods unschedulable: <the scheduler's reason>` (pods: "1/3"),
    in attempt `attempt` if given; returns the status."""
    prefix = f"{pods} pods unschedulable: "
    return wait_status(
        kubectl,
        namespace,
        name,
        prefix + (f"(attempt {attempt})" if attempt is not None else ""),
        lambda s: (
            str(s.get("message", "")).startswith(prefix) and (attempt is None or s.get("attempt") == attempt)
        ),
    )


POD_GROUP_CRD = "podgroups.scheduling.x-k8s.io"
VOLCANO_POD_GROUP_CRD = "podgroups.scheduling.volcano.sh"


@contextlib.contextmanager
def pod_group_api_withdrawn(kubectl: Kubectl) -> Iterator[None]:
    """No PodGroup API served for the block, as on a cluster without a gang scheduler.

    When the session's cluster runs the coscheduling component or Volcano (an earlier test asked for
    it), its PodGroup CRD is deleted for the block (with every PodGroup in the cluster: tests run one
    at a time) and put back afterwards, and the scheduler restarted so that its PodGroup informer
    starts afresh instead of sitting out its relist backoff."""
    with (
        optional_api_withdrawn(
            kubectl,
            "coscheduling",
            POD_GROUP_CRD,
            contract.COSCHEDULING_GROUP_VERSION,
            {"podgroups"},
            restart=True,
        ),
        optional_api_withdrawn(
            kubectl,
            "volcano",
            VOLCANO_POD_GROUP_CRD,
            contract.VOLCANO_GROUP_VERSION,
            {"podgroups"},
            restart=True,
        ),
    ):
        yield


def scheduled_by(kubectl: Kubectl, namespace: str, count: int) -> dict[str, str] | None:
    """Once `count` pods were bound: pod name -> the scheduler that reported binding it (the Scheduled
    events' reporting component)."""
    found = {
        event["involvedObject"]["name"]: event.get("reportingComponent", "")
        for event in kubectl.items("events", "-n", namespace)
        if event["reason"] == "Scheduled"
    }
    return found if len(found) == count else None
