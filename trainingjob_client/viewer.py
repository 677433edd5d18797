"""`kubectl trainingjob tensorboard`: run a job's TensorBoard viewer pod and port-forward to it.

Why a pod and a port-forward: the event files are on the job's storage in the cluster, which a laptop
cannot mount; TensorBoard next to them, reached through the API server as `kubectl port-forward`
reaches any pod, needs no Service, Ingress or open port. The Pod itself is trainingjob_client/
tensorboard.py's (pure); this module is the shell around it: create it or reuse a live one, wait for
it to be Ready with progress on stderr, forward a local port to it, and on Ctrl-C or SIGTERM delete it
(unless --keep).

The forwarding is kubectl's own `port-forward` (the kubectl on PATH, which is the one that ran the
plugin when it runs as `kubectl trainingjob`), given the same kubeconfig, context and namespace: it
speaks every protocol the API server offers for it (SPDY and WebSockets) and handles many connections
at once, which a browser opening TensorBoard needs. It runs in its own session, so Ctrl-C reaches the
plugin, which ends it; when it ends by itself (the connection to the pod was lost) while the pod is
still Ready, it is started again on the same local port.
"""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final, TextIO

from controller.resources import PODS
from controller.runtime.errors import ApiError, Forbidden, KubeError, NotFound, TransportError
from crd.spec import parse
from crd.spec_fields import SpecError
from trainingjob_client import tensorboard
from trainingjob_client.client import TrainingJobClient
from trainingjob_client.errors import (
    ClusterUnreachable,
    PermissionDenied,
    TrainingJobError,
    status_message,
    transport_reason,
)
from trainingjob_client.following import format_seconds
from trainingjob_client.tensorboard import Existing, TensorBoardUnavailable

POLL_SECONDS: Final = 1.0
FORWARD_START_SECONDS: Final = 30.0
DELETE_WAIT_SECONDS: Final = 60.0
DELETE_GRACE_SECONDS: Final = 5
# kubectl port-forward ending within this long of its start, this many times in a row: give up.
QUICK_EXIT_SECONDS: Final = 5.0
QUICK_EXITS: Final = 5
FORWARDING: Final = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+)")
STOP_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class ViewerOptions:
    port: int = tensorboard.PORT
    image: str | None = None
    keep: bool = False
    timeout: float = 300.0
    # kubectl's connection flags, passed on to `kubectl port-forward` as the plugin got them.
    kubeconfig: str | None = None
    context: str | None = None


def port_in_use(port: int) -> bool:
    """Whether 127.0.0.1:`port` is taken (bound as kubectl binds it, so a closing socket is no obstacle)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _pod_error(error: KubeError, namespace: str, name: str) -> TrainingJobError:
    if isinstance(error, TransportError):
        return ClusterUnreachable(f"cannot reach the Kubernetes API server: {transport_reason(str(error))}")
    if isinstance(error, Forbidden):
        return PermissionDenied(status_message(error.body, error.message))
    message = status_message(error.body, error.message) if isinstance(error, ApiError) else str(error)
    return TrainingJobError(f"pod {namespace}/{name}: {' '.join(message.split())}")


@contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM end the viewer with KeyboardInterrupt, so its pod is deleted either
    way. SIGINT too, because a process started in the background of a script (`cmd &`) inherits it
    ignored, and Python then installs no handler of its own: the viewer would never stop on Ctrl-C."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = {number: signal.signal(number, interrupt) for number in STOP_SIGNALS}
    except ValueError:  # not the main thread: leave the signals alone
        yield
        return
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


@dataclass
class Viewer:
    """One run of the command: the pod it serves from and the port-forward to it."""

    client: TrainingJobClient
    options: ViewerOptions
    err: TextIO
    namespace: str = ""
    name: str = ""
    uid: str | None = None
    serving: bool = False

    def say(self, line: str) -> None:
        print(line, file=self.err, flush=True)

    # ------------------------------------------------------------------------------------ the pod

    def get(self) -> dict[str, Any] | None:
        try:
            return self.client.kube.get(PODS, self.namespace, self.name)
        except NotFound:
            return None
        except KubeError as error:
            raise _pod_error(error, self.namespace, self.name) from None

    def ensure(self, wanted: dict[str, Any]) -> None:
        """Reuse a live viewer of the job, replace a stale one, or create it."""
        existing = self.get()
        if existing is not None:
            decision = tensorboard.existing_viewer(existing, wanted)
            if decision is Existing.FOREIGN:
                raise TensorBoardUnavailable(
                    f"pod {self.namespace}/{self.name} exists and is not a TensorBoard viewer made by this "
                    "command: delete it or rename it"
                )
            if decision is Existing.REUSE:
                self.uid = existing["metadata"].get("uid")
                self.say(f"pod {self.namespace}/{self.name}: reusing the running viewer")
                return
            self.say(f"pod {self.namespace}/{self.name}: replacing a viewer that is done or out of date")
            self.uid = existing["metadata"].get("uid")
            self.delete_and_wait()
            self.uid = None
        try:
            created = self.client.kube.create(PODS, self.namespace, wanted)
        except KubeError as error:
            raise _pod_error(error, self.namespace, self.name) from None
        self.uid = created["metadata"].get("uid")
        self.say(f"pod {self.namespace}/{self.name} created")

    def wait_ready(self, image: str) -> None:
        clock = self.client.clock
        deadline = clock.monotonic() + self.options.timeout
        shown = ""
        while True:
            pod = self.get()
            if pod is None:
                raise TensorBoardUnavailable(f"pod {self.namespace}/{self.name} was deleted while starting")
            ended = tensorboard.failure(pod, image)
            if ended is not None:
                raise TensorBoardUnavailable(ended)
            now = tensorboard.progress(pod)
            if now != shown:
                shown = now
                self.say(f"pod {self.namespace}/{self.name}: {now}")
            if tensorboard.is_ready(pod):
                return
            if clock.monotonic() >= deadline:
                raise TensorBoardUnavailable(
                    f"pod {self.namespace}/{self.name} was not ready within "
                    f"{format_seconds(self.options.timeout)}: {now} (see --timeout)"
                )
            clock.sleep(POLL_SECONDS)

    def delete_and_wait(self) -> None:
        try:
            self.client.kube.delete(
                PODS, self.namespace, self.name, uid=self.uid, grace_period_seconds=DELETE_GRACE_SECONDS
            )
        except NotFound:
            return
        except KubeError as error:
            raise _pod_error(error, self.namespace, self.name) from None
        deadline = self.client.clock.monotonic() + DELETE_WAIT_SECONDS
        while self.client.clock.monotonic() < deadline:
            pod = self.get()
            if pod is None or pod["metadata"].get("uid") != self.uid:
                return
            self.client.clock.sleep(POLL_SECONDS)

    def clean_up(self) -> None:
        if self.uid is None:
            return
        if self.options.keep:
            self.say(
                f"pod {self.namespace}/{self.name} kept (--keep): `kubectl delete pod {self.name}` ends it"
            )
            return
        try:
            self.delete_and_wait()
        except TrainingJobError as error:
            self.say(f"pod {self.namespace}/{self.name} not deleted: {error}")
            return
        self.say(f"pod {self.namespace}/{self.name} deleted")

    # ------------------------------------------------------------------------------- port-forward

    def forward_command(self, kubectl: str, port: int) -> list[str]:
        command = [kubectl, "port-forward", f"--namespace={self.namespace}"]
        if self.options.kubeconfig:
            command.append(f"--kubeconfig={self.options.kubeconfig}")
        if self.options.context:
            command.append(f"--context={self.options.context}")
        return [*command, "--address=127.0.0.1", f"pod/{self.name}", f"{port}:{tensorboard.PORT}"]


class Forward:
    """`kubectl port-forward` running; its output read by threads (so its pipes never fill)."""

    def __init__(self, command: list[str], err: TextIO) -> None:
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.port: int | None = None
        self.listening = threading.Event()
        self.last_error = ""
        self.passing_on = False
        self.err = err
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self.threads = [
            threading.Thread(target=self._stdout, args=(self.process.stdout,), daemon=True),
            threading.Thread(target=self._stderr, args=(self.process.stderr,), daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _stdout(self, stream: TextIO) -> None:
        for line in stream:
            found = FORWARDING.search(line)
            if found and self.port is None:
                self.port = int(found.group(1))
                self.listening.set()
        self.listening.set()

    def _stderr(self, stream: TextIO) -> None:
        for line in stream:
            text = " ".join(line.split())
            if text:
                self.last_error = text
                if self.passing_on:
                    print(f"kubectl port-forward: {text}", file=self.err, flush=True)

    def wait_listening(self) -> int:
        """The local port once kubectl listens; TrainingJobError with kubectl's words if it does not."""
        self.listening.wait(FORWARD_START_SECONDS)
        if self.port is None:
            self.stop()
            for thread in self.threads:
                thread.join(timeout=5)
            said = self.last_error.removeprefix("error: ") or "it did not start listening"
            raise TrainingJobError(f"kubectl port-forward failed: {said}")
        self.passing_on = True
        return self.port

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def view(client: TrainingJobClient, job_name: str, options: ViewerOptions, out: TextIO, err: TextIO) -> int:
    """Runs the viewer until interrupted; returns 0 after Ctrl-C or SIGTERM (errors raise)."""
    found = client.get(job_name)
    try:
        job = parse(found.raw)
    except SpecError as error:
        raise TrainingJobError(f"TrainingJob {found.namespace}/{found.name}: {error}") from None
    wanted = tensorboard.viewer_pod(job, image=options.image)
    image = str(wanted["spec"]["containers"][0]["image"])
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise TrainingJobError("kubectl is not on PATH: the port-forward runs `kubectl port-forward`")
    if options.port and port_in_use(options.port):
        raise TrainingJobError(f"port {options.port} on 127.0.0.1 is in use: choose another with --port")
    viewer = Viewer(client, options, err, found.namespace, tensorboard.viewer_name(found.name))
    with _stop_signals_interrupt():
        try:
            viewer.ensure(wanted)
            viewer.wait_ready(image)
            serve(viewer, kubectl, out)
        except KeyboardInterrupt:
            # Ctrl-C is how a viewer that serves ends (exit code 0); before that it interrupts (130).
            if not viewer.serving:
                raise
        finally:
            viewer.clean_up()
    return 0


def serve(viewer: Viewer, kubectl: str, out: TextIO) -> None:
    """Port-forwards until interrupted; starts kubectl again when it ends while the pod is Ready."""
    port = viewer.options.port
    quick_exits = 0
    while True:
        forward = Forward(viewer.forward_command(kubectl, port), viewer.err)
        try:
            port = forward.wait_listening()
            if not viewer.serving:
                viewer.serving = True
                url = f"http://127.0.0.1:{port}/"
                print(url, file=out, flush=True)
                job = f"{viewer.namespace}/{job_of(viewer)}"
                viewer.say(f"TensorBoard of TrainingJob {job} at {url}; Ctrl-C stops it")
            forward.process.wait()
        finally:
            forward.stop()
        pod = viewer.get()
        if pod is None or not tensorboard.is_ready(pod):
            state = "deleted" if pod is None else tensorboard.progress(pod)
            raise TensorBoardUnavailable(f"pod {viewer.namespace}/{viewer.name} stopped serving: {state}")
        quick_exits = quick_exits + 1 if time.monotonic() - forward.started < QUICK_EXIT_SECONDS else 0
        if quick_exits >= QUICK_EXITS:
            raise TrainingJobError(f"kubectl port-forward keeps failing: {forward.last_error}")
        viewer.say(f"port-forward ended ({forward.last_error or 'no reason given'}); starting it again")


def job_of(viewer: Viewer) -> str:
    return viewer.name.removesuffix(tensorboard.NAME_SUFFIX)


def options_from(args: Mapping[str, Any]) -> ViewerOptions:
    """The command's flags (argparse's namespace as a mapping) as ViewerOptions."""
    return ViewerOptions(
        port=int(args["port"]),
        image=args.get("image") or None,
        keep=bool(args.get("keep")),
        timeout=float(args["timeout"]),
        kubeconfig=args.get("kubeconfig"),
        context=args.get("context"),
    )
