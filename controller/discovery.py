"""Which optional APIs the cluster serves, asked at start and every --discovery-interval after, and the
watches that follow them, so that a gang scheduler or Kueue installed (or removed) while the operator
runs is noticed without a restart.

The optional APIs are a gang scheduler's PodGroups (scheduler-plugins' coscheduling, or Volcano: the
first served of --gang-scheduler's choices; with Volcano, its Queues too) and
Kueue's (Workloads, ResourceFlavors, WorkloadPriorityClasses). The operator asks the API server's
discovery endpoints, which every authenticated client may read, so this needs no RBAC. When an API
appears, its informers start on threads of their own, with their own stop event; their stores join
the caches the reconciler reads, the reconciler uses the API (PodGroups for gang-scheduled jobs,
Workloads for queued ones), and every job is reconciled again. When an API goes away, its informers
stop (against a missing resource they would only fail, and hold the operator unready), its store
leaves the caches, and every job is reconciled again. A discovery request that fails changes nothing:
an unreachable API server is not an uninstalled API.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Final

from builders.podgroup import GangScheduler
from controller.kueue_watches import KueueWatch
from controller.reconciler import Reconciler
from controller.resources import GANG_SCHEDULER_CHOICES, POD_GROUPS, WORKLOADS, Apis, discover
from controller.runtime.client import KubeClient
from controller.runtime.informer import Informer
from controller.runtime.serving import Probes
from controller.volcano_watches import VolcanoQueueWatch
from controller.watches import Watches
from crd import contract

logger = logging.getLogger(__name__)

PODGROUP_KIND: Final = "PodGroup"


class OptionalWatch:
    """The informers of one optional API, run together on their own threads and stopped together."""

    def __init__(self, name: str, informers: Sequence[Informer]) -> None:
        self.name = name
        self.informers = list(informers)
        self._stop = threading.Event()

    def start(self) -> None:
        for informer in self.informers:
            thread = threading.Thread(
                target=informer.run, args=(self._stop,), name=f"informer-{informer.name}", daemon=True
            )
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for informer in self.informers:
            informer.stop()

    def synced(self) -> bool:
        return all(informer.has_synced() for informer in self.informers)

    def check(self) -> tuple[bool, str]:
        """Readiness: synced, and no list or watch failing."""
        for informer in self.informers:
            if not informer.has_synced():
                return False, f"{informer.name} not synced"
            if informer.last_sync_error is not None:
                return False, f"{informer.name} watch failing: {informer.last_sync_error}"
        return True, "ok"


class Discovery:
    """Keeps the optional watches, the caches and the reconciler in step with what the cluster serves."""

    def __init__(
        self,
        client: KubeClient,
        watches: Watches,
        reconciler: Reconciler,
        probes: Probes,
        *,
        interval: float,
        gang_preference: tuple[GangScheduler, ...] = GANG_SCHEDULER_CHOICES["auto"],
    ) -> None:
        self._client = client
        self._gang_preference = gang_preference
        self._watches = watches
        self._reconciler = reconciler
        self._probes = probes
        self.interval = interval
        self.apis = Apis()
        self._gang: OptionalWatch | None = None
        self._kueue: OptionalWatch | None = None
        self._lock = threading.Lock()

    def refresh(self) -> bool:
        """Asks discovery once and follows any change; returns whether something changed."""
        with self._lock:
            apis = discover(self._client, self.apis, self._gang_preference)
            if apis == self.apis:
                return False
            if apis.gang_scheduler != self.apis.gang_scheduler:
                self._follow_gang_scheduler(apis)
            if apis.kueue != self.apis.kueue:
                self._follow_kueue(apis)
            self.apis = apis
        self._watches.wake_jobs(lambda _job: True)
        return True

    def run(self, stop: threading.Event) -> None:
        """Thread body: refreshes every `interval` until `stop` is set."""
        while not stop.wait(self.interval):
            try:
                self.refresh()
            except Exception:  # the loop must outlive any failure; the next round asks again
                logger.exception("discovery of optional APIs failed")

    def informers(self) -> list[Informer]:
        """The informers of the optional APIs being watched now."""
        return [
            informer
            for watch in (self._gang, self._kueue)
            if watch is not None
            for informer in watch.informers
        ]

    def stop(self) -> None:
        with self._lock:
            for watch in (self._gang, self._kueue):
                if watch is not None:
                    watch.stop()

    # ------------------------------------------------------------------------------------ changes

    def _follow_gang_scheduler(self, apis: Apis) -> None:
        if self._gang is not None:
            logger.info(
                "the %s PodGroup API is no longer served; gang scheduling off", self.apis.gang_scheduler
            )
            self._reconciler.gang_scheduler = None
            self._reconciler.volcano = None
            self._watches.caches.owned.pop(PODGROUP_KIND, None)
            self._end(self._gang)
            self._gang = None
        scheduler = apis.gang_scheduler
        if scheduler is not None:
            logger.info("gang scheduling available through %s PodGroups", scheduler)
            informer = self._watches.watch_owned(POD_GROUPS[scheduler], optional=True)
            informers = [informer]
            queues = VolcanoQueueWatch(self._watches) if scheduler == contract.GANG_VOLCANO else None
            if queues is not None:
                informers.append(queues.informer)
            self._gang = self._begin(OptionalWatch(f"{scheduler} PodGroups", informers))
            self._watches.caches.owned[PODGROUP_KIND] = informer.store
            self._reconciler.gang_scheduler = scheduler
            self._reconciler.volcano = queues

    def _follow_kueue(self, apis: Apis) -> None:
        if not apis.kueue:
            logger.info("Kueue's API is no longer served; queued jobs wait until it is back")
            self._reconciler.kueue = None
            self._watches.caches.owned.pop(WORKLOADS.kind, None)
            if self._kueue is not None:
                self._end(self._kueue)
                self._kueue = None
            return
        logger.info(
            "Kueue's API is served: jobs labelled kueue.x-k8s.io/queue-name are queued through Workloads"
        )
        kueue = KueueWatch(self._watches)
        self._kueue = self._begin(OptionalWatch("Kueue", kueue.informers))
        self._watches.caches.owned[WORKLOADS.kind] = kueue.workloads.store
        self._reconciler.kueue = kueue

    def _begin(self, watch: OptionalWatch) -> OptionalWatch:
        watch.start()
        self._probes.add_ready_check(f"informers {watch.name}", watch.check)
        return watch

    def _end(self, watch: OptionalWatch) -> None:
        self._probes.remove_ready_check(f"informers {watch.name}")
        watch.stop()
