"""What `wait()` waits for, and when waiting is pointless: pure decisions over a TrainingJob view.

A job that is Failed never becomes Completed, and a Completed one never gets a condition it does not
have by then (the operator stops reconciling a finished job). So a wait ends in one of three ways:
the target is reached, the job finished without reaching it (JobEnded, at once rather than at the
timeout), or the time is up (WaitTimeout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from trainingjob_client.views import CONDITION_TYPES, STATES, TrainingJob

CONDITION_STATUSES: Final = ("True", "False", "Unknown")


@dataclass(frozen=True)
class Target:
    """A state (`state="Completed"`) or a condition with a status (`condition="Succeeded"`, "True")."""

    state: str | None = None
    condition: str | None = None
    condition_status: str = "True"

    @classmethod
    def of(cls, for_state: str | None, condition: str | None) -> Target:
        """From wait()'s arguments: one of them, or neither for "Completed". A condition may carry its
        status as kubectl wait writes it: "Stalled=False"."""
        if for_state is not None and condition is not None:
            raise ValueError("wait for a state or for a condition, not both")
        if condition is not None:
            name, _, status = condition.partition("=")
            name = name.strip()
            wanted = status.strip().capitalize() or "True"
            if name not in CONDITION_TYPES:
                raise ValueError(f"unknown condition {name!r}: one of {', '.join(CONDITION_TYPES)}")
            if wanted not in CONDITION_STATUSES:
                raise ValueError(f"condition status {status!r}: one of {', '.join(CONDITION_STATUSES)}")
            return cls(condition=name, condition_status=wanted)
        state = "Completed" if for_state is None else for_state
        if state not in STATES:
            raise ValueError(f"unknown state {state!r}: one of {', '.join(STATES)}")
        return cls(state=state)

    def describe(self) -> str:
        if self.condition is not None:
            return f"condition {self.condition}={self.condition_status}"
        return f"state {self.state}"

    def reached(self, job: TrainingJob) -> bool:
        if self.condition is not None:
            entry = job.status.condition(self.condition)
            if entry is None:
                return self.condition_status == "False" and job.status.finished
            return entry.status == self.condition_status
        return job.status.state == self.state

    def unreachable(self, job: TrainingJob) -> str | None:
        """Why the target can no longer be reached (the job finished otherwise), or None."""
        if not job.status.finished or self.reached(job):
            return None
        status = job.status
        detail = status.failure_reason or status.message
        ended = f"TrainingJob {job.namespace}/{job.name} ended {status.state}"
        if detail:
            ended += f" ({detail})"
        return f"{ended} while waiting for {self.describe()}"
