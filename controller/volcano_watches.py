"""What the operator watches of Volcano's Queues while Volcano is the gang scheduler.

Why: Volcano's scheduler silently skips a PodGroup whose Queue does not exist (it logs the fact at a
verbose level and nothing else), and Volcano refuses new work for a closed queue only in the admission
webhook of its own Job kind. A TrainingJob's PodGroup would wait for ever without a word. So the
operator reads the Queues itself: the planner holds a job's pods back, with a condition and an Event
that name the queue, while its queue is missing or not open (controller/planner/volcano.py), and a
queue that appears, opens or closes wakes every gang-scheduled job.

Started and stopped by discovery (controller/discovery.py) with the Volcano PodGroup watch. Each Queue
is cached as only its name and state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.resources import VOLCANO_QUEUES
from controller.watches import Watches

JsonDict = dict[str, Any]


def queue_essentials(queue: JsonDict) -> JsonDict:
    """All the operator keeps of a Queue: its name and its state (Open, Closing, Closed; empty until
    Volcano's queue controller first looks at it)."""
    meta = queue.get("metadata") or {}
    return {
        "apiVersion": queue.get("apiVersion"),
        "kind": queue.get("kind"),
        "metadata": {"name": meta.get("name"), "resourceVersion": meta.get("resourceVersion")},
        "status": {"state": (queue.get("status") or {}).get("state", "")},
    }


def gang_scheduled(job: JsonDict) -> bool:
    return bool(((job.get("spec") or {}).get("scheduling") or {}).get("gangScheduling"))


class VolcanoQueueWatch:
    """The informer of Volcano's Queues, built without I/O."""

    def __init__(self, watches: Watches) -> None:
        self.informer = watches.informer(
            VOLCANO_QUEUES, label_selector=None, cluster=True, transform=queue_essentials, optional=True
        )

        def wake(_queue: JsonDict) -> None:
            watches.wake_jobs(gang_scheduled)

        def changed(old: JsonDict, new: JsonDict) -> None:
            if old.get("status") != new.get("status"):
                wake(new)

        self.informer.add_handler(on_add=wake, on_update=changed, on_delete=wake)

    def queues(self) -> Mapping[str, JsonDict] | None:
        """The Queues by name; None until the informer has listed them (nothing is judged meanwhile)."""
        if not self.informer.has_synced():
            return None
        return {str(queue["metadata"]["name"]): queue for queue in self.informer.store.list()}
