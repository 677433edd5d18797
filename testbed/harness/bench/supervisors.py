"""The recovery bench's stand-in for the in-place restart's supervisors on kwok, where no process runs.

Why: a job with `spec.failurePolicy.restartStrategy: InPlace` restarts by orders in its status
(status.inPlaceRestart) that each rank's supervisor (trainer/trainingjob_progress/supervise.py) answers
on its own pod's run annotation. On kwok nothing runs in the pods, so to count what an in-place restart
of 256 or 1,024 pods costs the operator, the bench answers for every pod as its supervisor would: Running
for the pod's first attempt, Exited for a failed rank, Exited 143 for each running rank when a Stopping
order appears, Running for the new attempt when a Starting order appears. Its PATCHes are the
supervisors' requests, not the operator's: the bench counts the operator's from its metrics.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from typing import Any, Final

from controller.resources import PODS, TRAININGJOBS
from controller.runtime.client import KubeClient
from controller.runtime.clock import RealClock
from controller.runtime.informer import Informer
from controller.runtime.store import Store
from crd import contract
from testbed.common import JsonDict, ToolError

# PATCHes in flight at once: many supervisors answer an order together.
CONCURRENCY: Final = 16
EXIT_TERMINATED: Final = 143  # the reference trainer stopped by SIGTERM


def run_annotation(attempt: int, state: str, exit_code: int | None = None) -> JsonDict:
    """The merge patch a supervisor sends (trainingjob_progress.supervision.run_report's document)."""
    report: dict[str, Any] = {"attempt": attempt, "state": state}
    if exit_code is not None:
        report["exitCode"] = exit_code
    now = datetime.now(UTC)
    report["at"] = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
    text = _compact(report)
    return {"metadata": {"annotations": {contract.RUN_ANNOTATION: text}}}


def _compact(report: Mapping[str, Any]) -> str:
    return json.dumps(report, sort_keys=True, separators=(",", ":"))


def answers(
    order: Mapping[str, Any] | None, reported: Mapping[str, tuple[int, str]]
) -> dict[str, tuple[int, str, int | None]]:
    """What each pod's supervisor reports for `order` (status.inPlaceRestart), given what each last
    reported ((attempt, state) by pod): pod -> (attempt, state, exit code)."""
    if not isinstance(order, Mapping) or type(order.get("attempt")) is not int:
        return {}
    target: int = order["attempt"]
    found: dict[str, tuple[int, str, int | None]] = {}
    for pod, (attempt, state) in reported.items():
        if attempt >= target:
            continue
        if order.get("phase") == "Stopping" and state == "Running":
            found[pod] = (attempt, "Exited", EXIT_TERMINATED)
        elif order.get("phase") == "Starting":
            found[pod] = (target, "Running", None)
    return found


class SupervisorPlayer:
    """Answers the in-place orders of the jobs in `gangs` (job name -> workers) for all their pods."""

    def __init__(self, client: KubeClient, namespace: str, gangs: Mapping[str, int]) -> None:
        self._client = client
        self._namespace = namespace
        self._pods = {
            name: [f"{name}-worker-{index}" for index in range(workers)] for name, workers in gangs.items()
        }
        self._lock = threading.Lock()
        self._reported: dict[str, tuple[int, str]] = {}
        self._errors: list[str] = []
        self._pool = ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="supervisor")
        self._stop = threading.Event()
        self._informer = Informer(client, TRAININGJOBS, Store(), namespace=namespace, clock=RealClock())
        self._informer.add_handler(
            on_add=self._ordered, on_update=lambda _old, new: self._ordered(new), on_delete=lambda _job: None
        )
        self._thread = threading.Thread(target=self._informer.run, args=(self._stop,), daemon=True)

    def start(self, timeout: float = 60.0) -> None:
        self._thread.start()
        if not self._informer.wait_for_sync(timeout):
            raise ToolError(f"the supervisors' watch of TrainingJobs did not sync in {timeout:.0f}s")

    def stop(self) -> None:
        self._stop.set()
        self._informer.stop()
        self._pool.shutdown(wait=True)

    def check(self) -> None:
        """Raises when a supervisor's PATCH failed (the measurement would wait for nothing)."""
        with self._lock:
            if self._errors:
                raise ToolError(f"a supervisor's report failed: {self._errors[0]}")

    def all_running(self, attempt: int = 0) -> None:
        """Every pod reports its process of `attempt` Running, as each supervisor does when it starts."""
        pods = [pod for names in self._pods.values() for pod in names]
        wait([self._report(pod, attempt, "Running") for pod in pods])
        self.check()

    def fail(self, pod: str, exit_code: int = 1) -> Future[None]:
        """The pod's training process exits `exit_code`; its container (the supervisor) runs on."""
        with self._lock:
            attempt = self._reported.get(pod, (0, ""))[0]
        return self._report(pod, attempt, "Exited", exit_code)

    def _ordered(self, job: JsonDict) -> None:
        name = job.get("metadata", {}).get("name", "")
        pods = self._pods.get(name)
        if not pods:
            return
        order = (job.get("status") or {}).get("inPlaceRestart")
        with self._lock:
            due = answers(order, {pod: self._reported.get(pod, (0, "")) for pod in pods})
            for pod, (attempt, state, _code) in due.items():
                self._reported[pod] = (attempt, state)  # before the PATCH: an order is answered once
        for pod, (attempt, state, code) in due.items():
            self._report(pod, attempt, state, code, recorded=True)

    def _report(
        self, pod: str, attempt: int, state: str, exit_code: int | None = None, *, recorded: bool = False
    ) -> Future[None]:
        if not recorded:
            with self._lock:
                self._reported[pod] = (attempt, state)
        return self._pool.submit(self._patch, pod, run_annotation(attempt, state, exit_code))

    def _patch(self, pod: str, body: JsonDict) -> None:
        try:
            self._client.patch(PODS, self._namespace, pod, body, answer=False)
        except Exception as error:
            with self._lock:
                self._errors.append(f"{pod}: {error}")
