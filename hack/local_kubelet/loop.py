"""The local kubelet as a process: its informers, the one thread that feeds the Kubelet its events and
ticks, what it does about a previous run's containers at start, and how it stops.

Why apart from hack/local_kubelet/kubelet.py: the Kubelet decides what happens to each pod when an
event or a tick comes; this module is the process around it: when events come (informers, a queue
drained every TICK_SECONDS), what a start finds left over (containers of a previous run, reported
lost so the operator restarts their gangs), and an end within SHUTDOWN_SECONDS (below `hack/dev-cluster.sh
stop`'s 30 s wait, so containers are never left behind).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Final

from controller.resources import PODS
from controller.runtime.client import KubeClient
from controller.runtime.informer import Informer
from controller.runtime.store import Store
from crd import contract
from hack.local_kubelet.kubelet import TICK_SECONDS, Kubelet, PodEvent
from hack.local_kubelet.pods import grace_seconds
from hack.local_kubelet.status import lost_container_patch

# SIGTERM, SIGKILL after SHUTDOWN_GRACE_SECONDS, then reports retried until SHUTDOWN_SECONDS.
SHUTDOWN_GRACE_SECONDS: Final = 10.0
SHUTDOWN_SECONDS: Final = 25.0

log = logging.getLogger("local-kubelet")


def run(kubelet: Kubelet) -> None:
    """Watches the kubelet's namespaces and hands it every event and a tick until `kubelet.stop`."""
    informers = [
        Informer(kubelet.client, PODS, Store(), namespace=ns, label_selector=contract.MANAGED_SELECTOR)
        for ns in kubelet.namespaces
    ]
    for informer in informers:
        informer.add_handler(
            on_add=lambda pod: kubelet.events.put(PodEvent("upsert", pod)),
            on_update=lambda _old, pod: kubelet.events.put(PodEvent("upsert", pod)),
            on_delete=lambda pod: kubelet.events.put(PodEvent("delete", pod)),
        )
    for informer in informers:
        threading.Thread(
            target=informer.run, args=(kubelet.stop,), name=f"informer-{informer.name}", daemon=True
        ).start()
    while not kubelet.stop.is_set() and not all(i.has_synced() for i in informers):
        kubelet.stop.wait(0.1)
    drain(kubelet, block=False)
    log.info(
        "watching pods of %s in namespace(s) %s; container logs in %s",
        contract.OPERATOR_NAME,
        ", ".join(kubelet.namespaces),
        kubelet.log_dir,
    )
    recover(kubelet)
    while not kubelet.stop.is_set():
        try:
            kubelet.tick()
        except Exception:
            log.exception("unexpected error; carrying on")
        drain(kubelet, block=True)
    log.info("stopping: ending %d pod(s)", len(kubelet.running))
    for informer in informers:
        informer.stop()
    shutdown(kubelet)


def drain(kubelet: Kubelet, *, block: bool) -> None:
    """Hands the kubelet every queued event; with `block`, waits up to TICK_SECONDS for the first."""
    try:
        item = kubelet.events.get(timeout=TICK_SECONDS) if block else kubelet.events.get_nowait()
        while True:
            kubelet.handle(item)
            item = kubelet.events.get_nowait()
    except queue.Empty:
        return


def recover(kubelet: Kubelet) -> None:
    """Processes a previous run of this kubelet started: killed if still there, and their pods ended
    like containers lost on a node restart, so the operator restarts the gang."""
    for uid in kubelet.supervisor.kill_leftovers():
        pod = kubelet.pods.get(uid)
        kubelet.done.add(uid)
        phase = ((pod or {}).get("status") or {}).get("phase")
        if pod is None or pod["metadata"].get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            kubelet.supervisor.forget(uid)
            continue
        kubelet.report_status(uid, lost_container_patch(pod))


def shutdown(kubelet: Kubelet) -> None:
    """Stops every container (SIGTERM, SIGKILL after its grace) and reports their pods ended, within
    SHUTDOWN_SECONDS: reports the API server refuses are retried until then (it may be restarting),
    then left to the next start (`recover`)."""
    began = time.monotonic()
    # Short requests from now on: an API server that is away must not hold the stop up.
    kubelet.reporter.client = KubeClient(
        kubelet.client.api_client, qps=0, burst=0, max_attempts=2, max_elapsed=3.0
    )
    for uid in list(kubelet.started):
        grace = min(SHUTDOWN_GRACE_SECONDS, grace_seconds(kubelet.pods.get(uid, {})))
        kubelet.terminate(uid, "shutdown", grace=grace)
    while kubelet.running and time.monotonic() < began + SHUTDOWN_GRACE_SECONDS + 5:
        with contextlib.suppress(queue.Empty):
            kubelet.handle(kubelet.events.get(timeout=TICK_SECONDS))
        kubelet.supervisor.kill_overdue(time.monotonic())
    unreported = kubelet.reporter.unreported
    while unreported and time.monotonic() < began + SHUTDOWN_SECONDS:
        for uid in list(unreported):
            kubelet.report_status(uid, unreported.pop(uid))
        if unreported:
            time.sleep(TICK_SECONDS)
    if unreported:
        log.warning("%d pod status(es) not reported; the next start reports them", len(unreported))
