"""Writing a TrainingJob's status, and what a write announces: the transition's log line, its
metrics, the plan's Events.

The reconciler (reconciler.py) decides when; this module knows how: a JSON merge patch of what
changed, with the resourceVersion the plan was made from as precondition (a stale cache gets a 409,
never a write), recorded in `StatusWrites` so the next reconcile waits until the job cache shows it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from controller.metrics import Metrics
from controller.planner import Event
from controller.resources import TRAININGJOBS
from controller.runtime import mergepatch
from controller.runtime.client import KubeClient
from controller.runtime.clock import Clock, parse_time
from controller.runtime.errors import Conflict, NotFound
from controller.runtime.events import EventRecorder
from controller.runtime.store import object_key
from controller.runtime.trackers import StatusWrites

logger = logging.getLogger(__name__)

JsonDict = dict[str, Any]


class StatusWriter:
    """Writes one job's status for the reconciler, and records what the write changed."""

    def __init__(
        self,
        client: KubeClient,
        *,
        status_writes: StatusWrites,
        events: EventRecorder,
        metrics: Metrics,
        clock: Clock,
    ) -> None:
        self._client = client
        self._status_writes = status_writes
        self._events = events
        self._metrics = metrics
        self._clock = clock

    def write(
        self,
        job: JsonDict,
        old: Mapping[str, Any],
        new: Mapping[str, Any],
        version: str | None = None,
        *,
        confirm: bool = False,
    ) -> str | None:
        """PATCHes status when it changed, with the job's resourceVersion (or `version`, that of our last
        write) as precondition; returns the resourceVersion the job has now (None if it is gone).

        `confirm`: pods are to be let go on the strength of this status, so even an unchanged one is
        confirmed with the API server (a PATCH of the precondition alone, which writes nothing): a
        cache that lags behind another leader's last write gets a 409, not a release."""
        version = version or str(job["metadata"]["resourceVersion"])
        patch = mergepatch.diff(old, new)
        if not patch and not confirm:
            return version
        body: JsonDict = {"metadata": {"resourceVersion": version}}
        if patch:
            body["status"] = patch
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        try:
            updated = self._client.patch(TRAININGJOBS, namespace, name, body, subresource="status")
        except NotFound:
            logger.info("job deleted while reconciling")
            return None
        except Conflict:
            logger.info("job changed since it was read; reconciling again with the fresh version")
            raise
        written = str(updated["metadata"]["resourceVersion"])
        self._status_writes.wrote(object_key(job), written)
        old_state, new_state = old.get("state"), new.get("state")
        if old_state != new_state:
            logger.info(
                "state %s -> %s: %s",
                old_state or "(new)",
                new_state,
                new.get("message", ""),
                extra={"action": "transition", "from": old_state, "to": new_state},
            )
        else:
            logger.debug("status updated", extra={"fields": sorted(patch)})
        return written

    def record(
        self, job: JsonDict, old: Mapping[str, Any], new: Mapping[str, Any], events: Sequence[Event]
    ) -> None:
        """The metrics of what the status write changed, and the plan's Events."""
        created = job["metadata"].get("creationTimestamp")
        age = (self._clock.now() - parse_time(created)).total_seconds() if created else None
        self._metrics.record_transition(job["metadata"]["namespace"], age, old, new)
        for event in events:
            self._events.record(job, event.type, event.reason, event.message)
