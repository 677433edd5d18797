"""The local kubelet's loop: watch the operator's pods, start gangs, stop deleted pods, report ends.

Why: one thread owns every decision, fed by a queue (pod events from the informers, process exits
from the waiter threads) and a tick every TICK_SECONDS (retries, gang starts, grace periods, token
renewals), so nothing here needs a lock. Nothing a pod does can stop the loop: an odd pod is logged
and skipped, an API error retried with backoff.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from controller.errors import KubeError, is_retryable
from controller.informer import Informer
from controller.kube import PODS, KubeClient
from controller.store import Store
from crd import contract
from hack.common import JsonDict
from hack.local_kubelet.launch import AttemptKey, prepare
from hack.local_kubelet.pods import (
    DEFAULT_GRACE_SECONDS,
    SkipPod,
    attempt_of,
    gang_ready,
    grace_seconds,
    is_running,
    job_of,
    pod_label,
    well_formed,
)
from hack.local_kubelet.processes import Exited, Running, Supervisor
from hack.local_kubelet.status import StatusReporter, exit_patch, lost_container_patch
from hack.local_kubelet.volumes import LocalVolumes, write_private

TOKEN_REFRESH_FRACTION: Final = 0.8
TOKEN_REFRESH_SECONDS: Final = 30.0  # retry a failed renewal this much later
# A stop takes at most SHUTDOWN_SECONDS, below `hack/dev-cluster.sh stop`'s 30 s wait, so trainers are
# never left behind: SIGTERM, SIGKILL after SHUTDOWN_GRACE_SECONDS, then reports retried until the end.
SHUTDOWN_GRACE_SECONDS: Final = 10.0
SHUTDOWN_SECONDS: Final = 25.0
TICK_SECONDS: Final = 0.5

log = logging.getLogger("local-kubelet")


@dataclass
class PodEvent:
    kind: str  # "upsert" or "delete"
    pod: JsonDict


@dataclass
class Kubelet:
    client: KubeClient
    namespaces: list[str]
    state_dir: Path
    log_dir: Path
    python: str = sys.executable
    events: queue.Queue[PodEvent | Exited | None] = field(default_factory=queue.Queue)
    pods: dict[str, JsonDict] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)  # uids started and ended, or skipped
    retry_at: dict[str, tuple[int, float]] = field(default_factory=dict)
    ports: dict[AttemptKey, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        configuration = self.client.api_client.configuration
        self.api_url = str(configuration.host).rstrip("/")
        self.ca_file: Path | None = None
        if configuration.ssl_ca_cert:
            self.ca_file = self.state_dir / "ca.crt"
            write_private(self.ca_file, Path(configuration.ssl_ca_cert).read_bytes(), 0o644)
        self.volumes = LocalVolumes(self.client, self.state_dir)
        self.supervisor = Supervisor(self.log_dir, self.state_dir / "processes", self.events)
        self.reporter = StatusReporter(self.client)

    @property
    def running(self) -> dict[str, Running]:
        return self.supervisor.running

    # ---- the loop ---------------------------------------------------------------------------------

    def run(self) -> None:
        informers = [
            Informer(self.client, PODS, Store(), namespace=ns, label_selector=contract.MANAGED_SELECTOR)
            for ns in self.namespaces
        ]
        for informer in informers:
            informer.add_handler(
                on_add=lambda pod: self.events.put(PodEvent("upsert", pod)),
                on_update=lambda _old, pod: self.events.put(PodEvent("upsert", pod)),
                on_delete=lambda pod: self.events.put(PodEvent("delete", pod)),
            )
        for informer in informers:
            threading.Thread(
                target=informer.run, args=(self.stop,), name=f"informer-{informer.name}", daemon=True
            ).start()
        while not self.stop.is_set() and not all(i.has_synced() for i in informers):
            self.stop.wait(0.1)
        self._drain(block=False)
        log.info(
            "watching pods of %s in namespace(s) %s; trainer logs in %s",
            contract.OPERATOR_NAME,
            ", ".join(self.namespaces),
            self.log_dir,
        )
        self.recover()
        while not self.stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("unexpected error; carrying on")
            self._drain(block=True)
        log.info("stopping: ending %d trainer process(es)", len(self.running))
        for informer in informers:
            informer.stop()
        self.shutdown()

    def _drain(self, *, block: bool) -> None:
        try:
            item = self.events.get(timeout=TICK_SECONDS) if block else self.events.get_nowait()
            while True:
                self.handle(item)
                item = self.events.get_nowait()
        except queue.Empty:
            return

    def handle(self, item: PodEvent | Exited | None) -> None:
        if item is None:
            return
        try:
            if isinstance(item, Exited):
                self.on_exit(item)
            elif item.kind == "delete":
                self.on_delete(item.pod)
            else:
                self.on_pod(item.pod)
        except Exception:
            log.exception("could not handle %s", item if isinstance(item, Exited) else pod_label(item.pod))

    def on_pod(self, pod: JsonDict) -> None:
        if not well_formed(pod):
            log.warning("ignoring a malformed pod: %.300r", pod)
            return
        uid = str(pod["metadata"]["uid"])
        self.pods[uid] = pod
        if pod["metadata"].get("deletionTimestamp"):
            self.terminate(uid, "deleted")

    def on_delete(self, pod: JsonDict) -> None:
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        self.pods.pop(uid, None)
        self.done.discard(uid)
        self.retry_at.pop(uid, None)
        self.reporter.unreported.pop(uid, None)
        self.terminate(uid, "deleted")

    def tick(self) -> None:
        """Periodic work: retry unreported ends, start pods whose gang is ready, deadlines, tokens."""
        now = time.monotonic()
        for uid in list(self.reporter.unreported):
            self.report_end(uid, self.reporter.unreported.pop(uid))
        for uid, pod in list(self.pods.items()):
            try:
                self.maybe_start(uid, pod, now)
            except Exception:
                log.exception("%s: skipped: cannot make sense of it", pod_label(pod))
                self.done.add(uid)
        self.supervisor.kill_overdue(now)
        self.renew_tokens(now)
        live = {(p.namespace, p.job, p.attempt) for p in self.running.values()}
        live |= {
            (str(p["metadata"]["namespace"]), job_of(p) or "", attempt_of(p)) for p in self.pods.values()
        }
        for key in [key for key in self.ports if key not in live]:
            del self.ports[key]

    def maybe_start(self, uid: str, pod: JsonDict, now: float) -> None:
        if uid in self.running or uid in self.done or not is_running(pod):
            return
        tries, when = self.retry_at.get(uid, (0, 0.0))
        started = set(self.running) | self.done
        attempts = [(p.namespace, p.job, p.attempt) for p in self.running.values()]
        if now < when or not gang_ready(pod, self.pods, started, attempts):
            return
        try:
            launch = prepare(
                pod,
                self.volumes,
                python=self.python,
                ports=self.ports,
                api_url=self.api_url,
                ca_file=self.ca_file,
            )
            self.supervisor.spawn(launch)
            self.retry_at.pop(uid, None)
        except SkipPod as reason:
            log.warning("%s: not started: %s (the pod stays Running)", pod_label(pod), reason)
            self.done.add(uid)
        except KubeError as error:
            if not is_retryable(error):
                log.warning("%s: not started: %s (the pod stays Running)", pod_label(pod), error)
                self.done.add(uid)
                return
            delay = min(30.0, 2.0**tries)
            log.warning("%s: could not start (%s); retrying in %.0fs", pod_label(pod), error, delay)
            self.retry_at[uid] = (tries + 1, now + delay)

    def renew_tokens(self, now: float) -> None:
        """Mints the projected tokens of running pods again before they expire, as a kubelet does."""
        for proc in self.running.values():
            if proc.kill_at is not None or not proc.tokens:
                continue
            if now - proc.token_minted <= TOKEN_REFRESH_FRACTION * min(t.seconds for t in proc.tokens):
                continue
            current = self.pods.get(proc.uid)
            if current is None or proc.stopping is not None:
                continue
            try:
                for token in proc.tokens:
                    self.volumes.mint_token(current, token)
                proc.token_minted = now
            except KubeError as error:
                log.warning("%s/%s: could not renew the token (%s)", proc.namespace, proc.name, error)
                proc.token_minted += TOKEN_REFRESH_SECONDS

    # ---- stopping and exits -----------------------------------------------------------------------

    def terminate(self, uid: str, why: str, grace: float | None = None) -> None:
        pod = self.pods.get(uid)
        seconds = grace if grace is not None else grace_seconds(pod) if pod else float(DEFAULT_GRACE_SECONDS)
        self.supervisor.terminate(uid, why, seconds)

    def on_exit(self, exited: Exited) -> None:
        finished = self.supervisor.finish(exited)
        if finished is None:
            return
        proc, code = finished
        pod = self.pods.get(exited.uid)
        if pod is not None:
            self.done.add(exited.uid)  # never started again; forgotten when the pod is deleted
        if pod is None or proc.stopping == "deleted":
            self.supervisor.forget(exited.uid)
            return  # the pod is gone (or going): nobody reads its status any more
        message = self.supervisor.termination_message(proc, code)
        self.report_end(exited.uid, exit_patch(pod, code, message, proc.stopping))

    def report_end(self, uid: str, patch: JsonDict) -> None:
        if self.reporter.report(uid, self.pods.get(uid), patch):
            self.supervisor.forget(uid)

    def recover(self) -> None:
        """Processes a previous run of this kubelet started: killed if still there, and their pods ended
        like containers lost on a node restart, so the operator restarts the gang."""
        for uid in self.supervisor.kill_leftovers():
            pod = self.pods.get(uid)
            self.done.add(uid)
            if pod is None or not is_running(pod):
                self.supervisor.forget(uid)
                continue
            self.report_end(uid, lost_container_patch(pod))

    def shutdown(self) -> None:
        """Stops every trainer (SIGTERM, SIGKILL after its grace) and reports their pods ended, within
        SHUTDOWN_SECONDS: reports the API server refuses are retried until then (it may be restarting),
        then left to the next start (`recover`)."""
        started = time.monotonic()
        # Short requests from now on: an API server that is away must not hold the stop up.
        self.reporter.client = KubeClient(
            self.client.api_client, qps=0, burst=0, max_attempts=2, max_elapsed=3.0
        )
        for uid in list(self.running):
            self.terminate(
                uid, "shutdown", grace=min(SHUTDOWN_GRACE_SECONDS, grace_seconds(self.pods.get(uid, {})))
            )
        while self.running and time.monotonic() < started + SHUTDOWN_GRACE_SECONDS + 5:
            with contextlib.suppress(queue.Empty):
                self.handle(self.events.get(timeout=TICK_SECONDS))
            self.supervisor.kill_overdue(time.monotonic())
        unreported = self.reporter.unreported
        while unreported and time.monotonic() < started + SHUTDOWN_SECONDS:
            for uid in list(unreported):
                self.report_end(uid, unreported.pop(uid))
            if unreported:
                time.sleep(TICK_SECONDS)
        if unreported:
            log.warning("%d pod end(s) not reported; the next start reports them", len(unreported))
