"""A container's end as the local kubelet reports it in the Pod's status, retried until it lands.

Why: the operator classifies a worker's end from exactly what a kubelet writes (hack/podstatus.py:
the phase, the terminated state with exit code and reason, the DisruptionTarget condition), so a
trainer's exit, a node shutdown and a container lost in a crash each become that patch. The API
server may be away (tests restart it): a report it refuses is kept and sent again on the next tick.
"""

from __future__ import annotations

import logging
from typing import Final

from controller.errors import KubeError, NotFound
from controller.kube import PODS, KubeClient
from hack.common import JsonDict
from hack.local_kubelet.pods import pod_label
from hack.podstatus import terminated_status_patch

WHO: Final = "the local kubelet"

log = logging.getLogger("local-kubelet")


def exit_patch(pod: JsonDict, code: int, message: str | None, stopping: str | None) -> JsonDict:
    """A trainer's exit; stopped because this kubelet shuts down, a node shutdown's disruption."""
    disruption = "TerminationByKubelet" if stopping == "shutdown" else None
    return terminated_status_patch(pod, exit_code=code, message=message, disruption=disruption, who=WHO)


def lost_container_patch(pod: JsonDict) -> JsonDict:
    """A container this kubelet ran before it crashed: gone, as after a node restart."""
    return terminated_status_patch(
        pod,
        exit_code=137,
        reason="ContainerStatusUnknown",
        message="The container could not be located when the local kubelet restarted",
        disruption="TerminationByKubelet",
        who=WHO,
    )


class StatusReporter:
    """Sends container ends to `pods/<name>/status`; keeps what the API server refused for a retry."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.unreported: dict[str, JsonDict] = {}  # uid -> status patch to retry

    def report(self, uid: str, pod: JsonDict | None, patch: JsonDict) -> bool:
        """True when settled (reported, or the pod is gone); False when kept for a retry."""
        if pod is None:
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
            log.warning("%s: could not report the container's end (%s); retrying", pod_label(pod), error)
            self.unreported[uid] = patch
            return False
        log.info("%s: reported phase %s", pod_label(pod), patch["status"]["phase"])
        return True
