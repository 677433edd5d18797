"""One transition's edit of a copy of a job's status: the state, conditions, Events and pod deletes it
brings, made the same way by every transition (transitions.py, admission.py, roles and reports).

Why apart: the transitions are many small functions over one small machine; the machine (move to a
state with its Event, set a condition that does not flap, stop pods, pause the deadline clock) is one
concern, and modules of transitions other than transitions.py use it without importing all of them.
Every text written goes through controller.planner.texts, so it fits the field it is written to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from controller.planner import conditions as cond
from controller.planner import texts
from controller.planner.facts import Facts, state_of
from controller.planner.model import Delete, Event
from controller.runtime.clock import parse_time
from crd.contract import Condition, State

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Moment:
    """When a status change is made, and from which generation of the spec."""

    now: datetime
    stamp: str
    generation: int | None


@dataclass(frozen=True)
class Step:
    status: JsonDict
    creates: tuple[JsonDict, ...] = ()
    deletes: tuple[Delete, ...] = ()
    events: tuple[Event, ...] = ()
    delete_job: bool = False


class Change:
    """One transition's edit of a copy of the status, and the Events and deletes it brings."""

    def __init__(self, moment: Moment, status: Mapping[str, Any]) -> None:
        self.moment = moment
        self.status: JsonDict = dict(status)
        self.events: list[Event] = []
        self.deletes: list[Delete] = []

    def move_to(
        self, state: State, message: str, reason: str, *, warning: bool = False, announce: bool = True
    ) -> None:
        """Moves to `state` (an Event when it changes, unless `announce` is False) and sets the one-line
        status message."""
        if announce and state_of(self.status) != state:
            self.note("Warning" if warning else "Normal", reason, f"{state}: {message}")
        self.status["state"] = str(state)
        self.status["message"] = texts.message(message)

    def note(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.events.append(Event(type_, texts.reason(reason), texts.event_message(message)))

    def set(self, type_: Condition, value: bool, reason: str, message: str) -> None:
        self.status["conditions"] = cond.set_condition(
            self.status.get("conditions"),
            type_,
            value,
            reason=texts.reason(reason),
            message=texts.message(message),
            now=self.moment.stamp,
            generation=self.moment.generation,
        )

    def clear(self, type_: Condition, reason: str, message: str) -> None:
        """Sets `type_` False only if it is present (a condition that never held need not be written)."""
        if cond.get(self.status.get("conditions"), type_) is not None:
            self.set(type_, False, reason, message)

    def stop(self, pods: Iterable[JsonDict], why: str) -> None:
        for pod in pods:
            meta = pod["metadata"]
            self.deletes.append(Delete("Pod", meta["name"], meta["uid"], why))

    def pause_deadline_clock(self) -> None:
        """Adds the current run to activeSeconds; the deadline clock stands still until runningSince is
        set again."""
        since = self.status.pop("runningSince", None)
        if since:
            elapsed = (self.moment.now - parse_time(since)).total_seconds()
            self.status["activeSeconds"] = int(float(self.status.get("activeSeconds") or 0) + elapsed)

    def step(self, *, creates: Iterable[JsonDict] = (), delete_job: bool = False) -> Step:
        return Step(self.status, tuple(creates), tuple(self.deletes), tuple(self.events), delete_job)


def moment(facts: Facts) -> Moment:
    return Moment(facts.now, facts.stamp, facts.job.generation)
