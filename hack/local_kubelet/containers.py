"""A running pod's containers as the local kubelet tracks them, and the Pod status a kubelet derives.

Why apart: which container starts next (init containers one after another, native sidecars kept
running, the regular containers together), when the native sidecars are stopped (once every regular
container has ended), and what the Pod's status says at each step (phase, conditions,
containerStatuses and initContainerStatuses) are the kubelet's rules, decided here without processes
or a cluster, so tests call them directly (tests/hack/test_local_kubelet.py). The loop
(hack/local_kubelet/kubelet.py) starts and stops processes as these functions say and reports the
status they compute.

The worker pods have restartPolicy Never: an init container that fails fails the pod, and so does a
regular container that fails; a native sidecar (restartPolicy Always) that exits is started again
with the kubelet's back-off while the pod runs. The phase is Pending until the init containers are
done, Running while a regular container or a sidecar still runs, then Succeeded when every regular
container exited 0, else Failed: a classic sidecar that never exits keeps its pod Running, as on a
real node. Only the exit codes of regular containers decide the phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from hack.common import JsonDict
from hack.local_kubelet.pods import Role
from hack.podstatus import disruption_condition

SIDECAR_BACKOFF_SECONDS: Final = 10.0  # the kubelet's container restart back-off: 10 s doubling ...
SIDECAR_BACKOFF_MAX_SECONDS: Final = 300.0  # ... up to 5 minutes


@dataclass
class ContainerRun:
    """One container of a pod: its state as a kubelet reports it."""

    name: str
    role: Role
    image: str = ""
    state: str = "waiting"  # waiting | running | terminated
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    restart_count: int = 0
    container_id: str | None = None
    last_terminated: JsonDict | None = None
    restart_after: float | None = None  # a native sidecar that exited starts again after this

    @property
    def next_instance(self) -> int:
        """The number of its next run: its restart count, one more when it ran before."""
        return self.restart_count + (1 if self.state == "terminated" else 0)

    def terminated(self) -> JsonDict:
        state: JsonDict = {
            "exitCode": self.exit_code,
            "reason": self.reason or ("Completed" if self.exit_code == 0 else "Error"),
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
        }
        if self.container_id:
            state["containerID"] = self.container_id
        if self.message:
            state["message"] = self.message
        return state

    def status(self) -> JsonDict:
        """This container's entry in containerStatuses or initContainerStatuses."""
        running = self.state == "running"
        entry: JsonDict = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": running and self.role is not Role.INIT,
            "started": running,
            "restartCount": self.restart_count,
        }
        if self.container_id:
            entry["containerID"] = self.container_id
        if running:
            entry["state"] = {"running": {"startedAt": self.started_at}}
        elif self.state == "terminated":
            entry["state"] = {"terminated": self.terminated()}
        else:
            entry["state"] = {"waiting": {"reason": "PodInitializing"}}
        if self.last_terminated:
            entry["lastState"] = {"terminated": self.last_terminated}
        return entry


@dataclass
class PodRun:
    """The containers of one pod the local kubelet runs, in start order."""

    uid: str
    containers: list[ContainerRun] = field(default_factory=list)
    stopping: str | None = None  # "deleted" or "shutdown": every container is being stopped
    finishing: bool = False  # every regular container has ended: the native sidecars are being stopped

    def get(self, name: str) -> ContainerRun | None:
        return next((c for c in self.containers if c.name == name), None)

    def of(self, *roles: Role) -> list[ContainerRun]:
        return [c for c in self.containers if c.role in roles]

    @property
    def running(self) -> list[ContainerRun]:
        return [c for c in self.containers if c.state == "running"]

    @property
    def init_failed(self) -> bool:
        return any(c.state == "terminated" and c.exit_code != 0 for c in self.of(Role.INIT))

    @property
    def incomplete_init(self) -> list[str]:
        """Init containers not yet completed and native sidecars not yet started."""
        return [
            c.name
            for c in self.of(Role.INIT, Role.SIDECAR)
            if c.state == "waiting" or (c.role is Role.INIT and (c.state == "running" or c.exit_code != 0))
        ]

    @property
    def initialized(self) -> bool:
        return not self.incomplete_init

    @property
    def regular_done(self) -> bool:
        """The regular containers have all ended, or never will (an init container failed)."""
        return self.init_failed or all(c.state == "terminated" for c in self.of(Role.MAIN))

    @property
    def over(self) -> bool:
        """Nothing runs any more and nothing will start again: the pod's end can be reported."""
        return (self.regular_done or self.stopping is not None) and not self.running

    def to_start(self) -> list[ContainerRun]:
        """The containers to start now: the next init container (or native sidecar) in order, then,
        once all of them are through, every regular container."""
        if self.stopping is not None or self.finishing or self.init_failed:
            return []
        for container in self.of(Role.INIT, Role.SIDECAR):
            if container.state == "waiting":
                return [container]
            if container.role is Role.INIT and container.state == "running":
                return []
        return [c for c in self.of(Role.MAIN) if c.state == "waiting"]

    def sidecars_to_restart(self, now: float) -> list[ContainerRun]:
        """Native sidecars that exited while the pod runs, once their back-off has passed."""
        if self.stopping is not None or self.finishing or self.regular_done:
            return []
        return [
            c
            for c in self.of(Role.SIDECAR)
            if c.state == "terminated" and c.restart_after is not None and now >= c.restart_after
        ]

    def sidecars_to_stop(self) -> list[ContainerRun]:
        """Once the regular containers are done, the native sidecars still running (stopped last, as
        a kubelet stops them after the main containers)."""
        if not self.regular_done or self.stopping is not None:
            return []
        return [c for c in self.of(Role.SIDECAR) if c.state == "running"]

    def started(self, container: ContainerRun, container_id: str, now: str) -> None:
        if container.state == "terminated":  # a native sidecar's restart: its last run becomes lastState
            container.last_terminated = container.terminated()
            container.restart_count += 1
        container.state = "running"
        container.started_at, container.container_id = now, container_id
        container.finished_at = container.exit_code = container.reason = container.message = None
        container.restart_after = None

    def exited(self, container: ContainerRun, code: int, now: str, clock: float, message: str | None) -> None:
        container.state = "terminated"
        container.exit_code, container.finished_at, container.message = code, now, message
        container.reason = "Completed" if code == 0 else "Error"
        if container.role is Role.SIDECAR and self.stopping is None and not self.finishing:
            delay = min(SIDECAR_BACKOFF_MAX_SECONDS, SIDECAR_BACKOFF_SECONDS * 2**container.restart_count)
            container.restart_after = clock + delay

    def phase(self) -> str:
        if not self.over:
            if not self.initialized or any(c.state == "waiting" for c in self.of(Role.MAIN)):
                return "Pending"
            return "Running"
        regular = self.of(Role.MAIN)
        failed = self.init_failed or any(c.state != "terminated" or c.exit_code != 0 for c in regular)
        return "Failed" if failed else "Succeeded"


def _condition(kind: str, ok: bool, *, reason: str, message: str, now: str, current: JsonDict) -> JsonDict:
    """A pod condition; its lastTransitionTime is kept while its status stays the same, and a True
    condition has no reason or message."""
    status = "True" if ok else "False"
    previous = next((c for c in current.get("conditions") or [] if c.get("type") == kind), None)
    since = previous.get("lastTransitionTime") if previous and previous.get("status") == status else None
    # None removes what an earlier report said (a strategic-merge patch merges conditions by type).
    return {
        "type": kind,
        "status": status,
        "lastTransitionTime": since or now,
        "reason": None if ok else reason,
        "message": None if ok else message,
    }


def pod_status(run: PodRun, current: JsonDict, now: str, disruption: str | None = None) -> JsonDict:
    """The Pod's status for `run`, as a strategic-merge patch of pods/<name>/status. `current` is the
    pod's status now (conditions keep their transition times); `disruption` adds DisruptionTarget."""
    phase = run.phase()
    incomplete = run.incomplete_init
    unready = [c.name for c in run.of(Role.MAIN, Role.SIDECAR) if c.state != "running"]
    ready_reason = "PodCompleted" if phase == "Succeeded" else "ContainersNotReady"
    ready_message = f"containers with unready status: [{' '.join(unready)}]"
    conditions = [
        _condition("PodReadyToStartContainers", True, reason="", message="", now=now, current=current),
        _condition(
            "Initialized",
            not incomplete,
            reason="ContainersNotInitialized",
            message=f"containers with incomplete status: [{' '.join(incomplete)}]",
            now=now,
            current=current,
        ),
        *(
            _condition(
                kind, not unready, reason=ready_reason, message=ready_message, now=now, current=current
            )
            for kind in ("ContainersReady", "Ready")
        ),
    ]
    status: JsonDict = {
        "phase": phase,
        "conditions": conditions,
        "containerStatuses": [c.status() for c in run.of(Role.MAIN)],
    }
    init = [c.status() for c in run.of(Role.INIT, Role.SIDECAR)]
    if init:
        status["initContainerStatuses"] = init
    if disruption:
        conditions.append(disruption_condition(disruption, now=now, who="the local kubelet"))
        status["message"] = disruption
    else:
        failed = next((c for c in run.of(Role.MAIN) if c.message and c.exit_code), None)
        if failed is not None and phase == "Failed":
            status["message"] = failed.message
    return {"status": status}
