"""The Pod status the local kubelet reports, sent to `pods/<name>/status` and retried until it lands.

Why: the operator reads a worker's life from exactly what a kubelet writes (phase, conditions, each
container's state with exit code and reason, the DisruptionTarget condition), so every change of a
pod's containers (hack/local_kubelet/containers.py computes the status) becomes that patch, and so do
a node shutdown and a container lost in a crash (hack/podstatus.py, shared with the tests). The API
server may be away (tests restart it): a report it refuses is kept and sent again on the next tick,
and a newer report of the same pod replaces it. A report equal to the last one sent is not sent again.
"""

from __future__ import annotations

import logging
from typing import Final

from controller.resources import PODS
from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError, NotFound
from hack.common import JsonDict
from hack.local_kubelet.pods import pod_label
from hack.podstatus import terminated_status_patch

WHO: Final = "the local kubelet"

log = logging.getLogger("local-kubelet")


def lost_container_patch(pod: JsonDict) -> JsonDict:
    """A pod this kubelet ran before it crashed: its containers gone, as after a node restart."""
    return terminated_status_patch(
        pod,
        exit_code=137,
        reason="ContainerStatusUnknown",
        message="The container could not be located when the local kubelet restarted",
        disruption="TerminationByKubelet",
        who=WHO,
    )


def _comparable(patch: JsonDict) -> JsonDict:
    """The patch without transition times (they move with every report of an unchanged condition)."""
    status = dict(patch.get("status") or {})
    status["conditions"] = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in status.get("conditions") or []
    ]
    return status


class StatusReporter:
    """Sends pod statuses to `pods/<name>/status`; keeps what the API server refused for a retry."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.unreported: dict[str, JsonDict] = {}  # uid -> status patch to retry
        self.sent: dict[str, JsonDict] = {}  # uid -> the last status that landed (comparable form)

    def forget(self, uid: str) -> None:
        self.unreported.pop(uid, None)
        self.sent.pop(uid, None)

    def report(self, uid: str, pod: JsonDict | None, patch: JsonDict) -> bool:
        """True when settled (reported, unchanged, or the pod is gone); False when kept for a retry."""
        if pod is None:
            return True
        if self.sent.get(uid) == _comparable(patch):
            self.unreported.pop(uid, None)
            return True
        metadata = pod["metadata"]
        try:
            self.client.patch(
                PODS,
                str(metadata["namespace"]),
                str(metadata["name"]),
                patch,
                patch_type="strategic",
                subresource="status",
            )
        except NotFound:
            return True
        except KubeError as error:
            log.warning("%s: could not report its status (%s); retrying", pod_label(pod), error)
            self.unreported[uid] = patch
            return False
        self.unreported.pop(uid, None)
        self.sent[uid] = _comparable(patch)
        log.info("%s: reported phase %s", pod_label(pod), patch["status"]["phase"])
        return True
