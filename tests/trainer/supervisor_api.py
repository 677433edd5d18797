"""A small live Kubernetes API on 127.0.0.1 for the supervisor's tests: one TrainingJob, its list and
watch, and the PATCHes of one pod's run annotation.

Why not tests/unit/fakeapi.py: that server answers from scripts fixed before the request comes, while
the supervisor's tests change the job in the middle of an open watch (an order after the child has
started) and must see the change arrive on that stream, as the real API server sends it. This one
keeps the job and a history of its versions: a watch gets every event after its resourceVersion and
then each new one as the test makes it; the test can also change the job silently (as if the event
was lost), cut the open streams, or end them with 410 Gone, to prove the supervisor lists again.
"""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from trainingjob_progress.supervision import RUN_ANNOTATION

NAMESPACE = "ml-training"
JOB = "mnist"
POD = "mnist-worker-0"
JOBS_PATH = f"/apis/ml.example.com/v1/namespaces/{NAMESPACE}/trainingjobs"
POD_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}"

Json = dict[str, Any]


class JobApi:
    """The API the supervisor talks to; every method is safe to call from the test's thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 1
        self._job: Json | None = {
            "apiVersion": "ml.example.com/v1",
            "kind": "TrainingJob",
            "metadata": {"name": JOB, "namespace": NAMESPACE, "resourceVersion": "1"},
            "status": {"state": "Running", "attempt": 0},
        }
        self._events: list[tuple[int, Json]] = []
        self._cut = 0  # bumped to cut every open watch stream without ending it properly
        self._expired = 0  # bumped to end every open watch stream with 410 Gone
        self._stopped = False
        self.reports: list[tuple[float, Json]] = []  # (monotonic time, run annotation)
        self.patch_headers: list[dict[str, str]] = []
        self.lists = 0
        self.watches: list[dict[str, str]] = []
        self.refuse_lists = 0  # the next lists answered 500
        self.refuse_patches = 0  # the next PATCHes answered 500
        self.refused_patches = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # --- what a test does --------------------------------------------------------------------------

    def set_status(self, *, silent: bool = False, **fields: Any) -> None:
        """Changes status fields (None removes one) as the operator would, and sends a MODIFIED event
        on every watch (unless `silent`: then only a new list sees the change)."""
        with self._cond:
            assert self._job is not None
            status = self._job["status"]
            for name, value in fields.items():
                if value is None:
                    status.pop(name, None)
                else:
                    status[name] = value
            self._bump({"type": "MODIFIED", "object": self._job}, silent)

    def delete_job(self) -> None:
        with self._cond:
            assert self._job is not None
            job, self._job = self._job, None
            self._bump({"type": "DELETED", "object": job}, silent=False)

    def cut_watches(self) -> None:
        """Drops every open watch connection in the middle of its stream."""
        with self._cond:
            self._cut += 1
            self._cond.notify_all()

    def expire_watches(self) -> None:
        """Ends every open watch with an ERROR event of 410 Gone, as for a too old resourceVersion."""
        with self._cond:
            self._expired += 1
            self._cond.notify_all()

    def wait_until(self, what: Callable[[], bool], timeout: float = 10.0, message: str = "") -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not what():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out waiting: {message or what}; reports {self.runs()}")
                self._cond.wait(min(remaining, 0.05))

    def runs(self) -> list[Json]:
        """The run annotation's values in the order they were PATCHed, without their times."""
        with self._cond:
            return [{k: v for k, v in report.items() if k != "at"} for _, report in self.reports]

    def wait_for_runs(self, count: int, timeout: float = 10.0) -> list[Json]:
        self.wait_until(lambda: len(self.reports) >= count, timeout, f"{count} run reports")
        return self.runs()

    # --- the server side ---------------------------------------------------------------------------

    def _bump(self, event: Json, silent: bool) -> None:
        self._version += 1
        if self._job is not None:
            self._job["metadata"]["resourceVersion"] = str(self._version)
        event = copy.deepcopy(event)
        event["object"]["metadata"]["resourceVersion"] = str(self._version)
        if not silent:
            self._events.append((self._version, event))
        self._cond.notify_all()

    def _list(self) -> Json | None:
        """The list's answer; None for a list refused (refuse_lists)."""
        with self._cond:
            self.lists += 1
            self._cond.notify_all()
            if self.refuse_lists:
                self.refuse_lists -= 1
                return None
            items = [copy.deepcopy(self._job)] if self._job is not None else []
            return {
                "kind": "TrainingJobList",
                "metadata": {"resourceVersion": str(self._version)},
                "items": items,
            }

    def _record_patch(self, headers: dict[str, str], body: bytes) -> bool:
        """Records a run report; False for one refused (refuse_patches)."""
        text = json.loads(body)["metadata"]["annotations"][RUN_ANNOTATION]
        with self._cond:
            if self.refuse_patches:
                self.refuse_patches -= 1
                self.refused_patches += 1
                self._cond.notify_all()
                return False
            self.reports.append((time.monotonic(), json.loads(text)))
            self.patch_headers.append(headers)
            self._cond.notify_all()
            return True

    def _stream(self, query: dict[str, str], write: Callable[[bytes], None]) -> str:
        """Writes the watch's events; returns how it ended: "cut", "expired" or "stopped"."""
        with self._cond:
            self.watches.append(query)
            self._cond.notify_all()
            sent = int(query.get("resourceVersion") or 0)
            cut, expired = self._cut, self._expired
        bookmark = {
            "type": "BOOKMARK",
            "object": {"kind": "TrainingJob", "metadata": {"resourceVersion": str(sent)}},
        }
        write(json.dumps(bookmark).encode() + b"\n")
        while True:
            with self._cond:
                while True:
                    pending = [event for version, event in self._events if version > sent]
                    if pending or self._stopped or self._cut != cut or self._expired != expired:
                        break
                    self._cond.wait(0.05)
                if self._stopped:
                    return "stopped"
                if self._cut != cut:
                    return "cut"
                if self._expired != expired:
                    return "expired"
                sent = self._version
            for event in pending:
                write(json.dumps(event).encode() + b"\n")

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


GONE_EVENT = {
    "type": "ERROR",
    "object": {"kind": "Status", "status": "Failure", "code": 410, "reason": "Expired"},
}


def _handler_for(api: JobApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return None

        def do_GET(self) -> None:
            split = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(split.query).items()}
            if split.path != JOBS_PATH or query.get("fieldSelector") != f"metadata.name={JOB}":
                self._reply(404, {"kind": "Status", "code": 404, "message": f"no {split.path}"})
            elif query.get("watch") in ("1", "true"):
                self._watch(query)
            elif (answer := api._list()) is None:
                self._reply(500, {"kind": "Status", "code": 500, "message": "etcdserver: request timed out"})
            else:
                self._reply(200, answer)

        def do_PATCH(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if urlsplit(self.path).path != POD_PATH:
                self._reply(404, {"kind": "Status", "code": 404, "message": "no such pod"})
                return
            if api._record_patch(dict(self.headers.items()), body):
                self._reply(200, {"kind": "Pod"})
            else:
                self._reply(500, {"kind": "Status", "code": 500, "message": "the pod is busy"})

        def _reply(self, code: int, body: Json) -> None:
            payload = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _watch(self, query: dict[str, str]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.close_connection = True
            try:
                ended = api._stream(query, self._chunk)
                if ended == "cut":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if ended == "expired":
                    self._chunk(json.dumps(GONE_EVENT).encode() + b"\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                return

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


@contextmanager
def running() -> Iterator[JobApi]:
    api = JobApi()
    api._thread.start()
    try:
        yield api
    finally:
        api.stop()
