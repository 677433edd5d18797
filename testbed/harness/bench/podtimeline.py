"""When a gang's ranks ran again after a fault, and when the new attempt first reported progress, from
the bench's own watch of the pods.

Why: the recovery bench (testbed/harness/bench/recovery.py) times what a user waits for after a rank
fails: every rank's container running again, and the first progress report of the next attempt. A
watch sees each change as it happens (no polling of the API server being measured), and a slim
transform keeps only what these questions need: which run of the container a pod holds (its UID, the
container's restart count, the gang attempt on its label, and for a job restarted in place the attempt
its supervisor reports on the run annotation) and whether it runs and has reported in that run.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace

from controller.resources import PODS
from controller.runtime.client import KubeClient
from controller.runtime.clock import RealClock
from controller.runtime.informer import Informer
from controller.runtime.store import Store
from crd import contract
from testbed.common import JsonDict, ToolError

Identity = tuple[str, str, int, int]
RUN = contract.RUN_ANNOTATION


@dataclass(frozen=True)
class RankRun:
    """One pod's run of the trainer as the watch last saw it. `identity` changes whenever the trainer
    starts again: a new pod (UID), the kubelet restarting its container, another gang attempt, or the
    supervisor of a kept pod reporting a newer attempt's process Running (run_attempt).

    progress: the progress annotation's value (None without one); progress_at_start: its value when this
    run began (a kept pod still holds the previous run's last report), so `reported` means this run's."""

    name: str
    uid: str
    attempt: str
    restarts: int
    phase: str
    container_running: bool
    deleting: bool
    run_attempt: int = -1
    run_state: str = ""
    progress: str | None = None
    progress_at_start: str | None = None

    @property
    def identity(self) -> Identity:
        return (self.uid, self.attempt, self.restarts, self.run_attempt)

    @property
    def running(self) -> bool:
        """The trainer runs: its container, and under a supervisor the supervisor's child."""
        return self.container_running and self.run_state in ("", "Running")

    @property
    def reported(self) -> bool:
        return self.progress is not None and self.progress != self.progress_at_start


def run_report(text: object) -> tuple[int, str]:
    """The run annotation's (attempt, state); (-1, "") without a readable one."""
    try:
        report = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        report = None
    if not isinstance(report, dict) or type(report.get("attempt")) is not int:
        return -1, ""
    return report["attempt"], str(report.get("state") or "")


def rank_run(pod: JsonDict) -> RankRun:
    """The pod's slim view (the informer's transform keeps the fields this reads)."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    trainer: JsonDict = next((s for s in statuses if s.get("name") == contract.CONTAINER_NAME), {})
    run_attempt, run_state = run_report(annotations.get(RUN))
    progress = annotations.get(contract.PROGRESS_ANNOTATION)
    return RankRun(
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        attempt=str((metadata.get("labels") or {}).get(contract.ATTEMPT_LABEL, "")),
        restarts=int(trainer.get("restartCount") or 0),
        phase=str((pod.get("status") or {}).get("phase") or ""),
        container_running="running" in (trainer.get("state") or {}),
        deleting=bool(metadata.get("deletionTimestamp")),
        run_attempt=run_attempt,
        run_state=run_state,
        progress=progress if isinstance(progress, str) else None,
    )


def next_run(previous: RankRun | None, seen: RankRun) -> RankRun:
    """`seen` with the progress report its run began with: the previous view's, carried while the run is
    the same, or that view's last report when a kept pod starts a new run."""
    if previous is None or previous.uid != seen.uid:
        return seen
    if previous.identity == seen.identity:
        return replace(seen, progress_at_start=previous.progress_at_start)
    return replace(seen, progress_at_start=previous.progress)


def _slim(pod: JsonDict) -> JsonDict:
    metadata = pod["metadata"]
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return {
        "metadata": {
            **{
                k: metadata.get(k)
                for k in ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")
            },
            "labels": {
                k: v for k, v in labels.items() if k in (contract.ATTEMPT_LABEL, contract.JOB_NAME_LABEL)
            },
            "annotations": {k: v for k, v in annotations.items() if k in (contract.PROGRESS_ANNOTATION, RUN)},
        },
        "status": {
            "phase": (pod.get("status") or {}).get("phase"),
            "containerStatuses": [
                {"name": s.get("name"), "restartCount": s.get("restartCount"), "state": s.get("state") or {}}
                for s in statuses
            ],
        },
    }


def all_running_again(
    runs: Mapping[str, RankRun], ranks: Collection[str], before: Mapping[str, Identity]
) -> bool:
    """Every rank of `ranks` runs a trainer that started after the fault (an identity not in `before`)."""
    return all(
        (run := runs.get(rank)) is not None
        and run.running
        and not run.deleting
        and run.identity != before.get(rank)
        for rank in ranks
    )


def new_run_reported(runs: Mapping[str, RankRun], reporter: str, before: Mapping[str, Identity]) -> bool:
    """The reporting rank's new run has put its first progress report on its pod."""
    run = runs.get(reporter)
    return run is not None and run.reported and run.identity != before.get(reporter)


Condition = Callable[[Mapping[str, RankRun]], bool]


class PodTimeline:
    """The pods of one namespace (optionally one label selector), watched; `wait` returns the monotonic
    time of the watch event at which a condition first held."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        label_selector: str | None = None,
        on_pod: Callable[[JsonDict], None] | None = None,
    ) -> None:
        """`on_pod`, when given, also sees every pod the watch delivers (slimmed)."""
        self._on_pod = on_pod
        self._lock = threading.Condition()
        self._runs: dict[str, RankRun] = {}
        self._waiters: list[tuple[Condition, list[float]]] = []
        self._stop = threading.Event()
        self._informer = Informer(
            client,
            PODS,
            Store(),
            namespace=namespace,
            label_selector=label_selector,
            clock=RealClock(),
            transform=_slim,
        )
        self._informer.add_handler(
            on_add=self._seen, on_update=lambda _old, new: self._seen(new), on_delete=self._gone
        )
        self._thread = threading.Thread(target=self._informer.run, args=(self._stop,), daemon=True)

    def start(self, timeout: float = 60.0) -> None:
        self._thread.start()
        if not self._informer.wait_for_sync(timeout):
            raise ToolError(f"the bench's watch of pods did not sync in {timeout:.0f}s")

    def stop(self) -> None:
        self._stop.set()
        self._informer.stop()

    def runs(self) -> dict[str, RankRun]:
        with self._lock:
            return dict(self._runs)

    def _seen(self, pod: JsonDict) -> None:
        if self._on_pod is not None:
            self._on_pod(pod)
        name = pod["metadata"]["name"]
        self._changed(lambda runs: runs.__setitem__(name, next_run(runs.get(name), rank_run(pod))))

    def _gone(self, pod: JsonDict) -> None:
        self._changed(lambda runs: runs.pop(pod["metadata"]["name"], None))

    def _changed(self, change: Callable[[dict[str, RankRun]], object]) -> None:
        now = time.monotonic()
        with self._lock:
            change(self._runs)
            for condition, hit in self._waiters:
                if not hit and condition(self._runs):
                    hit.append(now)
            self._lock.notify_all()

    def wait(self, what: str, condition: Condition, timeout: float, guard: Callable[[], None]) -> float:
        """The time the condition first held (now, if it holds already); ToolError after `timeout` s.
        `guard` runs every second (it raises when the operator died)."""
        hit: list[float] = []
        deadline = time.monotonic() + timeout
        with self._lock:
            if condition(self._runs):
                return time.monotonic()
            self._waiters.append((condition, hit))
            try:
                while not hit:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ToolError(
                            f"{what}: not after {timeout:.0f}s; pods: {list(self._runs.values())}"
                        )
                    self._lock.wait(min(left, 1.0))
                    if not hit:
                        guard()
            finally:
                self._waiters.remove((condition, hit))
        return hit[0]
