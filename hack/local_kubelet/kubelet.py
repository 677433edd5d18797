"""The local kubelet's decisions: what each pod event, process exit and tick means for the operator's
pods: start gangs, run their containers, report.

Why: one thread owns every decision, fed by a queue (pod events from the informers, process exits
from the waiter threads) and a tick every TICK_SECONDS (retries, gang starts, sidecar restarts, grace
periods, token renewals), so nothing here needs a lock; hack/local_kubelet/loop.py runs that thread,
and the kubelet's start and stop. What happens to a pod's containers is decided
by hack/local_kubelet/containers.py (init containers in order, native sidecars kept running and
stopped last, the pod's phase); this loop starts and stops processes as it says and reports the
status it computes whenever that changes. Nothing a pod does can stop the loop: an odd pod is logged
and skipped, an API error retried with backoff.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError, is_retryable
from hack.common import JsonDict
from hack.local_kubelet.containers import ContainerRun, PodRun, pod_status
from hack.local_kubelet.launch import AttemptKey, AttemptPorts, LocalSettings, PodLaunch, prepare
from hack.local_kubelet.logfiles import PodLogs
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
from hack.local_kubelet.processes import Exited, Supervisor
from hack.local_kubelet.status import StatusReporter
from hack.local_kubelet.volumes import LocalVolumes, write_private
from hack.podstatus import now_rfc3339

TOKEN_REFRESH_FRACTION: Final = 0.8
TOKEN_REFRESH_SECONDS: Final = 30.0  # retry a failed renewal this much later
TICK_SECONDS: Final = 0.5

log = logging.getLogger("local-kubelet")


@dataclass
class PodEvent:
    kind: str  # "upsert" or "delete"
    pod: JsonDict


@dataclass
class Started:
    """A pod whose containers this kubelet runs: what it launched, their states, its tokens' age."""

    launch: PodLaunch
    run: PodRun
    token_minted: float

    @property
    def attempt(self) -> AttemptKey:
        return (self.launch.namespace, self.launch.job, self.launch.attempt)


@dataclass
class Kubelet:
    client: KubeClient
    namespaces: list[str]
    state_dir: Path
    log_dir: Path
    python: str = sys.executable
    events: queue.Queue[PodEvent | Exited | None] = field(default_factory=queue.Queue)
    pods: dict[str, JsonDict] = field(default_factory=dict)
    started: dict[str, Started] = field(default_factory=dict)  # by pod uid, until its end is reported
    done: set[str] = field(default_factory=set)  # uids started and ended, or skipped
    retry_at: dict[str, tuple[int, float]] = field(default_factory=dict)
    ports: dict[AttemptKey, AttemptPorts] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        configuration = self.client.api_client.configuration
        ca_file: Path | None = None
        if configuration.ssl_ca_cert:
            ca_file = self.state_dir / "ca.crt"
            write_private(ca_file, Path(configuration.ssl_ca_cert).read_bytes(), 0o644)
        self.settings = LocalSettings(self.python, str(configuration.host).rstrip("/"), ca_file)
        self.volumes = LocalVolumes(self.client, self.state_dir)
        self.logs = PodLogs(self.log_dir)
        self.supervisor = Supervisor(self.logs, self.state_dir / "processes", self.events)
        self.reporter = StatusReporter(self.client)

    @property
    def running(self) -> set[str]:
        """The uids of pods with a container running."""
        return self.supervisor.pods()

    # ---- events and periodic work ----------------------------------------------------------------

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
        self.reporter.forget(uid)
        self.terminate(uid, "deleted")
        if uid not in self.started and well_formed(pod):  # nothing runs: its own volumes can go
            self.volumes.remove_pod(pod)

    def tick(self) -> None:
        """Periodic work: retry unreported statuses, start pods whose gang is ready, restart native
        sidecars after their back-off, grace periods, tokens."""
        now = time.monotonic()
        for uid in list(self.reporter.unreported):
            self.report_status(uid, self.reporter.unreported.pop(uid))
        for uid, pod in list(self.pods.items()):
            try:
                self.maybe_start(uid, pod, now)
            except Exception:
                log.exception("%s: skipped: cannot make sense of it", pod_label(pod))
                self.done.add(uid)
        for uid in list(self.started):
            try:
                self.advance(uid)
            except Exception:
                log.exception(
                    "%s: could not advance its containers; trying again", pod_label(self.pods.get(uid, {}))
                )
        self.supervisor.kill_overdue(now)
        self.renew_tokens(now)
        live = {s.attempt for s in self.started.values()}
        live |= {
            (str(p["metadata"]["namespace"]), job_of(p) or "", attempt_of(p)) for p in self.pods.values()
        }
        for key in [key for key in self.ports if key not in live]:
            del self.ports[key]

    def maybe_start(self, uid: str, pod: JsonDict, now: float) -> None:
        if uid in self.started or uid in self.done or not is_running(pod):
            return
        tries, when = self.retry_at.get(uid, (0, 0.0))
        attempts = [s.attempt for uid_, s in self.started.items() if uid_ in self.running]
        if now < when or not gang_ready(pod, self.pods, set(self.started) | self.done, attempts):
            return
        try:
            launch = prepare(pod, self.volumes, self.settings, self.ports)
        except SkipPod as reason:
            log.warning("%s: not started: %s (the pod stays Running)", pod_label(pod), reason)
            self.done.add(uid)
            return
        except KubeError as error:
            if not is_retryable(error):
                log.warning("%s: not started: %s (the pod stays Running)", pod_label(pod), error)
                self.done.add(uid)
                return
            delay = min(30.0, 2.0**tries)
            log.warning("%s: could not start (%s); retrying in %.0fs", pod_label(pod), error, delay)
            self.retry_at[uid] = (tries + 1, now + delay)
            return
        self.retry_at.pop(uid, None)
        containers = [ContainerRun(c.name, c.role, c.image) for c in launch.containers]
        self.started[uid] = Started(launch, PodRun(uid, containers), now)
        self.supervisor.start_pod(launch)
        self.advance(uid)

    # ---- a pod's containers -----------------------------------------------------------------------

    def advance(self, uid: str) -> None:
        """Starts what the pod's state says starts now, stops the native sidecars once the regular
        containers are done, reports the status when it changed, and ends the pod when it is over."""
        started = self.started[uid]
        run = started.run
        for _ in range(len(run.containers) + 1):
            batch = run.to_start() + run.sidecars_to_restart(time.monotonic())
            if not batch:
                break
            for container in batch:
                launch = started.launch.container(container.name)
                process = self.supervisor.spawn(started.launch, launch, container.next_instance)
                run.started(container, f"local://{process.popen.pid}", now_rfc3339())
        pod = self.pods.get(uid)
        grace = grace_seconds(pod) if pod else float(DEFAULT_GRACE_SECONDS)
        for sidecar in run.sidecars_to_stop():
            run.finishing = True
            for proc in self.supervisor.of_pod(uid):
                if proc.container == sidecar.name:
                    self.supervisor.terminate(proc, "finished: its regular containers have ended", grace)
        if run.stopping == "deleted":
            if run.over:
                self.forget(uid)
            return
        disruption = "TerminationByKubelet" if run.stopping == "shutdown" else None
        if run.over:
            del self.started[uid]
            self.done.add(uid)  # never started again; forgotten when the pod is deleted
        if pod is not None:
            self.report_status(uid, pod_status(run, pod.get("status") or {}, now_rfc3339(), disruption))
        elif run.over:
            self.supervisor.forget(uid)

    def terminate(self, uid: str, why: str, grace: float | None = None) -> None:
        started = self.started.get(uid)
        if started is None:
            return
        pod = self.pods.get(uid)
        seconds = grace if grace is not None else grace_seconds(pod) if pod else float(DEFAULT_GRACE_SECONDS)
        if started.run.stopping is None:
            started.run.stopping = why
        for proc in self.supervisor.of_pod(uid):
            self.supervisor.terminate(proc, f"pod {why}", seconds)
        if not self.supervisor.of_pod(uid):
            self.advance(uid)

    def on_exit(self, exited: Exited) -> None:
        finished = self.supervisor.finish(exited)
        started = self.started.get(exited.uid)
        if finished is None or started is None:
            return
        proc, code = finished
        container = started.run.get(exited.container)
        if container is None:
            return
        message = None
        if started.launch.container(exited.container).fallback_to_logs:
            message = self.supervisor.termination_message(proc, code)
        started.run.exited(container, code, now_rfc3339(), time.monotonic(), message)
        self.advance(exited.uid)

    def report_status(self, uid: str, patch: JsonDict) -> None:
        if self.reporter.report(uid, self.pods.get(uid), patch) and uid not in self.started:
            self.supervisor.forget(uid)

    def forget(self, uid: str) -> None:
        """A deleted pod whose containers have all stopped: its records and its own volumes go."""
        started = self.started.pop(uid, None)
        self.supervisor.forget(uid)
        if started is not None:
            launch = started.launch
            self.volumes.remove_pod(
                {"metadata": {"namespace": launch.namespace, "name": launch.name, "uid": uid}}
            )

    def renew_tokens(self, now: float) -> None:
        """Mints the projected tokens of running pods again before they expire, as a kubelet does."""
        for uid, started in self.started.items():
            tokens = started.launch.tokens
            if not tokens or started.run.stopping is not None or uid not in self.running:
                continue
            if now - started.token_minted <= TOKEN_REFRESH_FRACTION * min(t.seconds for t in tokens):
                continue
            current = self.pods.get(uid)
            if current is None:
                continue
            try:
                for token in tokens:
                    self.volumes.mint_token(current, token)
                started.token_minted = now
            except KubeError as error:
                log.warning("%s: could not renew the token (%s)", pod_label(current), error)
                started.token_minted += TOKEN_REFRESH_SECONDS
