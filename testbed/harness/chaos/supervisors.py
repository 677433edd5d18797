"""The chaos run's stand-in for the supervisors of its in-place jobs (restartStrategy InPlace).

Why: kwok runs no process, so nobody answers the operator's in-place orders (status.inPlaceRestart)
on the ranks' run annotations. This player does, as each rank's supervisor would
(trainer/trainingjob_progress/supervise.py): Running for the attempt a new pod was made for, Exited
143 for a running rank when a Stopping order comes, Running for the new attempt when a Starting order
comes (the answers are the recovery bench's, testbed/harness/bench/supervisors.py). It reads the state
from the pods themselves on every look (no memory of its own), so a pod the operator recreated (a
fallback, a disruption, a lost node) is answered like any other, and a leader killed in between
changes nothing for it.

`hold` keeps it from answering a job's orders: a kill round injects its in-place failures, waits until
the leader ordered the ranks to stop, holds the other ranks there while it kills the leader, and lets
them answer while no replica leads, so the next leader finishes a restart the previous one started.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any, Final

from controller.planner import podstate
from controller.resources import PODS, TRAININGJOBS
from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError
from crd import contract
from testbed.harness.bench.supervisors import answers, run_annotation

JsonDict = dict[str, Any]
LOOK_SECONDS: Final = 0.5


def container_running(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's trainer container runs (its supervisor is alive), as kwok reports it."""
    return bool(
        not podstate.is_terminating(pod)
        and "running" in ((podstate.trainer_status(pod) or {}).get("state") or {})
    )


def reports_due(order: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> dict[str, JsonDict]:
    """The run annotations the supervisors of a job's `pods` send now (pod name -> merge patch): a pod
    whose container runs but has not reported starts its attempt; the others answer `order`."""
    due: dict[str, JsonDict] = {}
    reported: dict[str, tuple[int, str]] = {}
    for pod in pods:
        if not container_running(pod):
            continue
        name = pod["metadata"]["name"]
        report = podstate.run(pod)
        if report is None:
            due[name] = run_annotation(podstate.attempt(pod) or 0, "Running")
        else:
            reported[name] = (report.attempt, report.state)
    for name, (attempt, state, code) in answers(order, reported).items():
        due[name] = run_annotation(attempt, state, code)
    return due


def failed_report(pod: Mapping[str, Any], exit_code: int = 1) -> JsonDict:
    """The run annotation a supervisor sends when the training process of the attempt it runs exits."""
    return run_annotation(podstate.attempt(pod) or 0, "Exited", exit_code)


class SupervisorStandIn:
    """Answers, every `LOOK_SECONDS`, for every pod of the in-place jobs `jobs` in `namespace`."""

    def __init__(self, client: KubeClient, namespace: str, jobs: Iterable[str]) -> None:
        self._client = client
        self._namespace = namespace
        self._jobs = frozenset(jobs)
        self._held: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-supervisors", daemon=True)
        self.reports = 0
        self.errors = 0

    def start(self) -> None:
        if self._jobs:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def hold(self, jobs: Iterable[str]) -> None:
        with self._lock:
            self._held.update(jobs)

    def release(self) -> None:
        with self._lock:
            self._held.clear()

    def look(self) -> None:
        jobs = {
            job["metadata"]["name"]: job
            for job in self._client.list(TRAININGJOBS, self._namespace)["items"]
            if job["metadata"]["name"] in self._jobs
        }
        by_job: dict[str, list[JsonDict]] = {}
        for pod in self._client.list(PODS, self._namespace)["items"]:
            job = (pod["metadata"].get("labels") or {}).get(contract.JOB_NAME_LABEL)
            if isinstance(job, str) and job in jobs:
                by_job.setdefault(job, []).append(pod)
        with self._lock:
            held = set(self._held)
        for name, pods in by_job.items():
            status = jobs[name].get("status") or {}
            if status.get("state") in ("Completed", "Failed"):
                continue
            order = None if name in held else status.get("inPlaceRestart")
            for pod, patch in reports_due(order, pods).items():
                self._client.patch(PODS, self._namespace, pod, patch)
                self.reports += 1

    def _run(self) -> None:
        while not self._stop.wait(LOOK_SECONDS):
            try:
                self.look()
            except (KubeError, OSError):
                self.errors += 1  # the API server restarting, a pod just deleted: look again
