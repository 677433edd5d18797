"""What a kubelet writes into a Pod's status when its containers end: for the tests (tests/cluster.py
`end_pod`), the chaos run and the soak, which end pods on kwok's nodes by hand.

Why one module: the operator classifies a worker's end from exactly these fields (phase, each
container's terminated state with exit code and reason, the DisruptionTarget condition), so whatever
ends a pod in a kubelet's place must write the same thing a kubelet does. Standard library only and
pure: callers fetch the Pod and send the patch with their own client (kubectl, or the project's REST
client).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final

# A kubelet keeps at most this much of a container's log as its termination message
# (terminationMessagePolicy FallbackToLogsOnError): the last 80 lines, at most 2048 bytes.
FALLBACK_MESSAGE_LINES: Final = 80
FALLBACK_MESSAGE_BYTES: Final = 2048


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_code_of(returncode: int) -> int:
    """A process's wait status as a container exit code: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def log_tail_message(text: str) -> str:
    """The termination message a kubelet takes from the log's tail (FallbackToLogsOnError)."""
    tail = "\n".join(text.rstrip("\n").splitlines()[-FALLBACK_MESSAGE_LINES:])
    data = tail.encode("utf-8", errors="replace")[-FALLBACK_MESSAGE_BYTES:]
    return data.decode("utf-8", errors="ignore")


def terminated_status_patch(
    pod: dict[str, Any],
    *,
    exit_code: int = 0,
    reason: str | None = None,
    message: str | None = None,
    disruption: str | None = None,
    container: str | None = None,
    now: str | None = None,
    who: str = "the test",
) -> dict[str, Any]:
    """The strategic-merge patch of `pods/<name>/status` that ends `pod`'s containers.

    exit_code 0 ends the pod Succeeded, anything else Failed. `reason` is the container's terminated
    reason (default Completed or Error; e.g. OOMKilled). `disruption` adds the DisruptionTarget
    condition with that reason (PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager,
    TerminationByKubelet). `container` ends only that container's state (the others keep theirs); by
    default every container ends with the same code. `who` names the stand-in in the condition's message.
    """
    now = now or now_rfc3339()
    phase = "Succeeded" if exit_code == 0 else "Failed"
    statuses: list[dict[str, Any]] = []
    by_name = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    for spec in pod["spec"]["containers"]:
        previous = by_name.get(spec["name"], {})
        if container is not None and spec["name"] != container:
            statuses.append(previous)
            continue
        started = (previous.get("state") or {}).get("running", {}).get("startedAt", now)
        terminated: dict[str, Any] = {
            "exitCode": exit_code,
            "reason": reason or ("Completed" if exit_code == 0 else "Error"),
            "startedAt": started,
            "finishedAt": now,
        }
        if message:
            terminated["message"] = message
        statuses.append(
            {
                "name": spec["name"],
                "image": spec.get("image", ""),
                "imageID": previous.get("imageID", ""),
                "containerID": previous.get("containerID", f"kwok://{spec['name']}"),
                "ready": False,
                "started": False,
                "restartCount": previous.get("restartCount", 0),
                "state": {"terminated": terminated},
            }
        )
    condition_reason = "PodCompleted" if exit_code == 0 else "PodFailed"
    conditions: list[dict[str, Any]] = [
        {"type": "Ready", "status": "False", "reason": condition_reason, "lastTransitionTime": now},
        {"type": "ContainersReady", "status": "False", "reason": condition_reason, "lastTransitionTime": now},
    ]
    if disruption:
        conditions.append(disruption_condition(disruption, now=now, who=who))
    status: dict[str, Any] = {"phase": phase, "containerStatuses": statuses, "conditions": conditions}
    if disruption or message:
        status["message"] = message or disruption
    return {"status": status}


def disruption_condition(reason: str, *, now: str | None = None, who: str = "the test") -> dict[str, Any]:
    """DisruptionTarget=True with `reason`: what the scheduler, the eviction API or a kubelet adds."""
    return {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": reason,
        "message": f"{reason} (simulated by {who})",
        "lastTransitionTime": now or now_rfc3339(),
    }
