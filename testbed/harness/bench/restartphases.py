"""Where an in-place restart's time goes: the steps between a rank's failure and the new run, from the
supervisors' run reports and the operator's orders, each as seconds after the fault.

Why: the recovery bench's two figures (to every rank running again, to the first report) do not say
which part of a restart to make faster. The supervisors stamp each report on their pod's run annotation
with the time to the millisecond (`at`); the operator's orders (status.inPlaceRestart) carry whole
seconds only, so the bench notes the moment its own watch of the job sees each one. The supervisors,
the operator and the bench share this machine's clock, so the times line up with the fault's.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from controller.resources import TRAININGJOBS
from controller.runtime.client import KubeClient
from controller.runtime.clock import RealClock, parse_time
from controller.runtime.informer import Informer
from controller.runtime.store import Store
from crd import contract
from testbed.common import JsonDict, ToolError

FIELD: Final = "inPlaceRestart"
# The steps, in the order they happen.
STEPS: Final = (
    "failed_rank_exited",  # its supervisor reports the failed process Exited
    "stopping_order_seen",  # the operator's Stopping order, as the bench's watch sees it
    "every_rank_exited",  # the last supervisor reports its process of the failed attempt Exited
    "starting_order_seen",  # the Starting order, as the bench's watch sees it
    "every_rank_running",  # the last supervisor reports its process of the new attempt Running
)


@dataclass(frozen=True)
class RunReport:
    """One value of a pod's run annotation: what its supervisor said, and when (wall-clock seconds)."""

    pod: str
    attempt: int
    state: str
    at: float


@dataclass(frozen=True)
class OrderSeen:
    attempt: int
    phase: str
    seen: float  # wall-clock seconds


def run_report(pod: str, text: object) -> RunReport | None:
    """The run annotation's report, or None when it is absent or unreadable."""
    try:
        report = json.loads(text) if isinstance(text, str) else None
        if not isinstance(report, dict) or type(report.get("attempt")) is not int:
            return None
        at = parse_time(str(report["at"])).timestamp()
    except (ValueError, KeyError):
        return None
    return RunReport(pod, report["attempt"], str(report.get("state") or ""), at)


def steps(
    fault: float, ranks: Sequence[str], failed: str, reports: Sequence[RunReport], orders: Sequence[OrderSeen]
) -> dict[str, float]:
    """Seconds from `fault` (wall clock) to each step of the first in-place restart after it; a step
    that did not happen (a restart that recreated the pods) is left out."""
    stopping = next((o for o in orders if o.phase == "Stopping" and o.seen >= fault), None)
    if stopping is None:
        return {}
    new, old = stopping.attempt, stopping.attempt - 1
    starting = next((o for o in orders if o.phase == "Starting" and o.attempt == new), None)

    def reported(pod: str, attempt: int, state: str) -> float | None:
        return next((r.at for r in reports if (r.pod, r.attempt, r.state) == (pod, attempt, state)), None)

    exited = [reported(pod, old, "Exited") for pod in ranks]
    running = [reported(pod, new, "Running") for pod in ranks]
    found: dict[str, float | None] = {
        "failed_rank_exited": reported(failed, old, "Exited"),
        "stopping_order_seen": stopping.seen,
        "every_rank_exited": _last(exited),
        "starting_order_seen": starting.seen if starting is not None else None,
        "every_rank_running": _last(running),
    }
    return {name: round(at - fault, 3) for name, at in found.items() if at is not None}


def compared(by_strategy: Mapping[str, JsonDict]) -> JsonDict:
    """The node part's results of each restart strategy, measured one after the other in one run, and
    the ratio of InPlace's median to Recreate's for each figure of a failure."""
    result: JsonDict = dict(by_strategy)
    in_place, recreate = by_strategy.get("InPlace"), by_strategy.get("Recreate")
    if in_place is None or recreate is None:
        return result
    ratios = {}
    for figure in ("to_every_rank_running", "to_first_report"):
        slow = recreate["failure"][figure].get("median")
        fast = in_place["failure"][figure].get("median")
        if slow and fast is not None:
            ratios[figure] = round(fast / slow, 3)
    result["in_place_against_recreate"] = ratios
    return result


def _last(moments: Sequence[float | None]) -> float | None:
    """The latest of the ranks' moments; None while a rank has not reached it."""
    known = [moment for moment in moments if moment is not None]
    return max(known) if known and len(known) == len(moments) else None


def medians(measured: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each step's median over the faults that reached it, in the steps' order."""
    return {
        name: round(statistics.median(values), 3)
        for name in STEPS
        if (values := [m[name] for m in measured if name in m])
    }


class RestartLog:
    """The run reports of the job's pods and the operator's orders, as they come (fed by the bench's
    watch of the pods, and by a watch of the job of its own)."""

    def __init__(self, client: KubeClient, namespace: str, job: str) -> None:
        self._lock = threading.Lock()
        self._reports: list[RunReport] = []
        self._orders: list[OrderSeen] = []
        self._stop = threading.Event()
        self._informer = Informer(
            client,
            TRAININGJOBS,
            Store(),
            namespace=namespace,
            field_selector=f"metadata.name={job}",
            clock=RealClock(),
        )
        self._informer.add_handler(on_add=self._job_seen, on_update=lambda _old, new: self._job_seen(new))
        self._thread = threading.Thread(target=self._informer.run, args=(self._stop,), daemon=True)

    def start(self, timeout: float = 60.0) -> None:
        self._thread.start()
        if not self._informer.wait_for_sync(timeout):
            raise ToolError(f"the bench's watch of the job did not sync in {timeout:.0f}s")

    def stop(self) -> None:
        self._stop.set()
        self._informer.stop()

    def pod_seen(self, pod: JsonDict) -> None:
        """A pod as the bench's pod watch saw it: its run report, when it is a new one."""
        name = str(pod["metadata"]["name"])
        report = run_report(name, (pod["metadata"].get("annotations") or {}).get(contract.RUN_ANNOTATION))
        with self._lock:
            if report is not None and report not in self._reports:
                self._reports.append(report)

    def _job_seen(self, job: JsonDict) -> None:
        raw: Any = (job.get("status") or {}).get(FIELD)
        if not isinstance(raw, dict) or type(raw.get("attempt")) is not int:
            return
        seen = OrderSeen(raw["attempt"], str(raw.get("phase") or ""), time.time())
        with self._lock:
            if not any((o.attempt, o.phase) == (seen.attempt, seen.phase) for o in self._orders):
                self._orders.append(seen)

    def steps(self, fault: float, ranks: Sequence[str], failed: str) -> dict[str, float]:
        with self._lock:
            return steps(fault, ranks, failed, list(self._reports), list(self._orders))
