"""Failure classification and restart backoff: whose fault a pod's end was, and what it costs.

Users of training operators complain most that preemptions are counted as failures, that backoffLimit
does not work and that restarts storm. The rules live here as pure functions:

* a disruption (DisruptionTarget condition: preemption, eviction, node drain; or the pod's node is
  lost) is retried without consuming backoffLimit, under its own, larger cap;
* under restartPolicy ExitCode, listed codes win, then codes >= 128 (signals: OOM kill 137, SIGTERM
  143) are retryable and 1-127 (the program's own error) are permanent;
* OnFailure retries every failure, Never retries none;
* the delay before a gang restart grows exponentially with jitter, per cause.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from controller.planner import podstate
from crd.spec import FailurePolicy, RestartBackoff


class Cause(StrEnum):
    """Why a gang restarts; also the `restarts` counter it increments and the metric label."""

    FAILURE = "failure"
    DISRUPTION = "disruption"
    SCHEDULING = "scheduling"
    STALL = "stall"


class Verdict(StrEnum):
    RETRY = "retry"
    DISRUPTION = "disruption"
    PERMANENT = "permanent"


@dataclass(frozen=True)
class PodFailure:
    """One pod's end that breaks the gang, with everything a status message needs."""

    pod: str
    index: int | None
    container: str
    exit_code: int | None
    reason: str
    message: str
    disruption: bool
    # The pod is on its way out (terminating) or already deleted (its last state): not a live rank.
    gone: bool = False

    def describe(self) -> str:
        parts = [f"pod {self.pod}"]
        if self.container:
            parts.append(f"container {self.container}")
        if self.exit_code is not None:
            parts.append(f"exit code {self.exit_code}")
        parts.append(f"reason {self.reason}")
        text = ", ".join(parts)
        return f"{text}: {self.message}" if self.message else text


def classify(
    pod: Mapping[str, Any],
    node: Mapping[str, Any] | None,
    node_known: bool,
    *,
    now: datetime | None = None,
    node_grace: float = 0.0,
) -> PodFailure | None:
    """The failure this pod represents, if any. `node_known` is False when the node cache cannot tell;
    a NotReady node counts as lost `node_grace` seconds after it turned NotReady."""
    name = str(pod.get("metadata", {}).get("name", ""))
    index = podstate.replica_index(pod)
    ended = podstate.termination(pod)
    disrupted = podstate.disruption_reason(pod)
    phase = podstate.worker_phase(pod)
    if disrupted is not None and phase != "Succeeded":
        return PodFailure(
            name,
            index,
            ended.container if ended else "",
            ended.exit_code if ended else None,
            disrupted,
            ended.message if ended else "",
            disruption=True,
        )
    if phase == "Failed":
        ended = ended or podstate.Termination("", None, "Failed", "")
        return PodFailure(
            name, index, ended.container, ended.exit_code, ended.reason, ended.message, disruption=False
        )
    bound = podstate.node_name(pod)
    if (
        phase in ("Pending", "Running")
        and bound
        and node_known
        and podstate.node_is_lost(node, now, node_grace)
    ):
        return PodFailure(name, index, "", None, "NodeLost", f"node {bound} is not ready", disruption=True)
    return None


def verdict(failure: PodFailure, policy: FailurePolicy) -> Verdict:
    if failure.disruption:
        return Verdict.DISRUPTION
    if policy.restart_policy != "ExitCode":
        return Verdict.PERMANENT if policy.restart_policy == "Never" else Verdict.RETRY
    return _exit_code_verdict(failure.exit_code, policy)


def _exit_code_verdict(code: int | None, policy: FailurePolicy) -> Verdict:
    """restartPolicy ExitCode: listed codes win; else >= 128 (a signal) retries and 1-127 is permanent.
    A pod that failed without a container exit code (e.g. it could not start) is retried."""
    if code is None or code in policy.retryable_exit_codes:
        return Verdict.RETRY
    if code in policy.permanent_exit_codes:
        return Verdict.PERMANENT
    return Verdict.RETRY if code >= 128 else Verdict.PERMANENT


def restart_delay(backoff: RestartBackoff, previous_restarts: int, seed: str) -> float:
    """Seconds to wait before the next gang start: initial * multiplier^previous, with up to 10% jitter,
    never above maxDelaySeconds. Below the cap the jitter lengthens the delay; at the cap it shortens
    it, so jobs that failed together do not restart together even there. The jitter is derived from
    `seed` (job UID and restart number): stable across operator restarts, reproducible in tests.

    Whatever numbers the schema admits, the answer is a number (infinite when the growth or the cap
    is): a multiplier or delay too large for a float saturates instead of raising."""
    initial, cap = backoff.initial_delay_seconds, backoff.max_delay_seconds
    exponent = min(max(previous_restarts, 0), 64)
    fraction = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "big") / 2**64
    if initial <= 0:
        return 0.0
    try:
        growth = backoff.multiplier**exponent
    except OverflowError:
        growth = math.inf
    delay = initial * growth * (1 + 0.1 * fraction)
    return delay if delay <= cap else cap * (1 - 0.1 * fraction)
