"""Reading a rank's trainer log through the API server's pods/log subresource, whole or followed.

The API server fetches the log from the kubelet of the pod's node, so this works wherever `kubectl
logs` does, with the same credentials and RBAC (`pods/log` get). When it cannot work the reason is
told in one sentence: the pod is gone (the job finished and its pods were cleaned up, or a gang
restart replaced them), the container has not started yet, or the node did not serve the log.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import urllib3

from controller.resources import PODS
from controller.runtime.client import KubeClient
from controller.runtime.errors import ApiError, KubeError, NotFound
from controller.runtime.http11 import StreamingAnswer
from crd import contract
from trainingjob_client.errors import (
    ClusterUnreachable,
    LogsUnavailable,
    status_message,
    translate,
    transport_reason,
)
from trainingjob_client.views import TrainingJob

CHUNK: Final = 16 * 1024
# A whole log is read within this; a followed one may stay silent for as long as training prints nothing.
READ_TIMEOUT: Final = 60.0


def check_rank(job: TrainingJob, rank: int) -> None:
    size = job.replicas.size
    if not 0 <= rank < max(size, 1):
        last = max(size - 1, 0)
        what = f"{size} pods" if job.replicas.has_roles else f"{job.num_workers} workers"
        raise ValueError(
            f"rank {rank} is out of range: TrainingJob {job.namespace}/{job.name} has {what} (ranks 0-{last})"
        )


def open_log(
    kube: KubeClient,
    job: TrainingJob,
    rank: int,
    *,
    follow: bool,
    tail_lines: int | None = None,
) -> StreamingAnswer:
    """The open pods/log answer for `rank`'s trainer container; LogsUnavailable saying why not.

    The pod is read first: a pod that is gone or not yet on a node has no log to ask a kubelet for.
    """
    check_rank(job, rank)
    pod = job.pod_name(rank)
    try:
        found = kube.get(PODS, job.namespace, pod)
    except NotFound:
        raise LogsUnavailable(_gone(job, pod, rank)) from None
    except KubeError as error:
        raise translate(error, namespace=job.namespace, name=job.name, host=kube.host) from None
    node = (found.get("spec") or {}).get("nodeName")
    if not node:
        raise LogsUnavailable(
            f"pod {job.namespace}/{pod} (rank {rank}) is not on a node yet, so it has no log"
        )
    query: dict[str, object] = {
        "container": contract.CONTAINER_NAME,
        "follow": True if follow else None,
        "tailLines": tail_lines,
    }
    try:
        return kube.open_stream(
            PODS.path(job.namespace, pod, "log"),
            query=query,
            read_timeout=None if follow else READ_TIMEOUT,
            description=f"GET logs of {job.namespace}/{pod}",
            accept="*/*",
        )
    except ApiError as error:
        message = status_message(error.body, error.message)
        if error.status in (400, 404, 500, 502, 503, 504):
            raise LogsUnavailable(
                f"the log of pod {job.namespace}/{pod} (rank {rank}) cannot be read from node {node}: "
                f"{message}"
            ) from None
        raise translate(error, namespace=job.namespace, name=job.name, host=kube.host) from None
    except KubeError as error:
        raise translate(error, namespace=job.namespace, name=job.name, host=kube.host) from None


def _gone(job: TrainingJob, pod: str, rank: int) -> str:
    text = f"pod {job.namespace}/{pod} (rank {rank} of TrainingJob {job.name}) no longer exists"
    state = job.status.state
    if state in ("Completed", "Failed"):
        policy = (job.raw.get("spec") or {}).get("cleanPodPolicy") or "Running"
        return f"{text}: the job is {state} and its pods were cleaned up (cleanPodPolicy {policy})"
    if state in ("Restarting", "Suspended", "Pending", "Queued"):
        return f"{text}: the job is {state}"
    return text


def read_all(response: StreamingAnswer, description: str) -> str:
    try:
        return bytes(response.read()).decode("utf-8", errors="replace")
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise ClusterUnreachable(
            f"the log of {description} was cut off: {transport_reason(str(error))}"
        ) from None
    finally:
        response.release_conn()


def lines(response: StreamingAnswer, description: str) -> Iterator[str]:
    """The log's lines (without their newline) as they arrive; the stream is released at the end."""
    buffer = b""
    try:
        while True:
            try:
                chunk = response.read1(CHUNK)
            except (urllib3.exceptions.HTTPError, OSError) as error:
                raise ClusterUnreachable(
                    f"the log of {description} was cut off: {transport_reason(str(error))}"
                ) from None
            if not chunk:
                break
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                yield line.decode("utf-8", errors="replace")
        if buffer:
            yield buffer.decode("utf-8", errors="replace")
    finally:
        response.close()
        response.release_conn()
