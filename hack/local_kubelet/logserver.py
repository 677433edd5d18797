"""The kubelet API's container log endpoint for the fake nodes: what `kubectl logs` reaches.

Why: `kubectl logs` (and the Python client's `logs()`) ask the API server for pods/log; the API server
then calls the kubelet of the pod's node at the address and port in the Node's status (InternalIP
127.0.0.1 and daemonEndpoints.kubeletEndpoint.Port, which kwok writes) with
`GET /containerLogs/<namespace>/<pod>/<container>?follow=&tailLines=&...`. kwok's nodes have no
kubelet, so the local kubelet answers there, over TLS, from the container logs it keeps
(hack/local_kubelet/logfiles.py).

What it checks, as a kubelet with client-certificate authentication and webhook authorisation does:
- the caller's TLS client certificate must be signed by the cluster's CA (`--client-ca-file`); its
  common name is the user, its organisations the groups. No certificate: 401. Bearer tokens are not
  accepted (a kubelet would ask the API server with a TokenReview);
- a SubjectAccessReview asks the API server whether that user may `get` `nodes/proxy` of the pod's
  node, the attributes a kubelet checks for /containerLogs; the API server's own client certificate
  is allowed that by the ClusterRole system:kubelet-api-admin (hack/devcluster binds it). Answers are
  cached for 5 minutes (allowed) or 30 seconds (denied), the kubelet's defaults. Denied: 403;
- it does not check that the pod's node is one that names this endpoint, and it serves the pods of
  every namespace whose logs are in its log directory (every local kubelet of a cluster writes to the
  same one by default, so whichever of them the kernel hands the connection answers the same).

Several local kubelets may serve one cluster (the demo's and a test's): each listens with SO_REUSEPORT.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

from controller.resources import NODES, PODS
from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError, NotFound
from hack.common import JsonDict
from hack.local_kubelet.logfiles import BadOptions, LogOptions, PodLogs, parse_options, read_log

ALLOWED_TTL: Final = 300.0
DENIED_TTL: Final = 30.0
SUBJECT_ACCESS_REVIEWS: Final = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
LOOPBACK: Final = "127.0.0.1"

log = logging.getLogger("local-kubelet")


@dataclass(frozen=True)
class Identity:
    user: str
    groups: tuple[str, ...]


def identity_of(certificate: dict[str, Any] | None) -> Identity | None:
    """The Kubernetes user of a verified client certificate: CN is the name, each O a group."""
    if not certificate:
        return None
    names: list[str] = []
    groups: list[str] = []
    for rdn in certificate.get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                names.append(str(value))
            elif key == "organizationName":
                groups.append(str(value))
    if not names:
        return None
    return Identity(names[0], (*groups, "system:authenticated"))


class Authorizer:
    """May this identity read the kubelet API of a node? Asked of the API server, answers cached."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client
        self.lock = threading.Lock()
        self.cache: dict[tuple[Identity, str, str], tuple[bool, float]] = {}

    def allowed(self, who: Identity, verb: str, node: str) -> bool:
        key = (who, verb, node)
        now = time.monotonic()
        with self.lock:
            cached = self.cache.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": who.user,
                "groups": list(who.groups),
                "resourceAttributes": {
                    "verb": verb,
                    "version": "v1",
                    "resource": "nodes",
                    "subresource": "proxy",
                    "name": node,
                },
            },
        }
        answer = self.client.request("POST", SUBJECT_ACCESS_REVIEWS, body=review)
        allowed = bool((answer.get("status") or {}).get("allowed"))
        with self.lock:
            self.cache[key] = (allowed, now + (ALLOWED_TTL if allowed else DENIED_TTL))
        return allowed


class Refusal(Exception):
    """An answer other than the log: the HTTP status and the message a kubelet would give."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def pod_containers(pod: JsonDict) -> set[str]:
    spec = pod.get("spec") or {}
    return {str(c.get("name")) for key in ("containers", "initContainers") for c in spec.get(key) or []}


class LogHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60
    server: LogHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("log server: %s", format % args)

    def do_GET(self) -> None:
        try:
            log_file, options = self.resolve()
        except Refusal as refusal:
            self.refuse(refusal.status, str(refusal))
            return
        except KubeError as error:
            self.refuse(500, f"the API server did not answer: {error}")
            return
        self.stream(read_log(log_file, options, self.gone))

    def resolve(self) -> tuple[Path, LogOptions]:
        who = identity_of(
            self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        )
        if who is None:
            raise Refusal(401, "Unauthorized")
        url = urlsplit(self.path)
        parts = [unquote(part) for part in url.path.strip("/").split("/")]
        if len(parts) != 4 or parts[0] != "containerLogs" or not all(parts[1:]):
            raise Refusal(404, "404 page not found")
        _, namespace, name, container = parts
        try:
            options = parse_options(parse_qs(url.query), time.time_ns())
        except BadOptions as error:
            raise Refusal(400, str(error)) from None
        try:
            pod: JsonDict | None = self.server.client.get(PODS, namespace, name)
        except NotFound:
            pod = None
        node = str(((pod or {}).get("spec") or {}).get("nodeName") or "")
        if not self.server.authorizer.allowed(who, "get", node):
            raise Refusal(
                403, f"Forbidden (user={who.user}, verb=get, resource=nodes, subresource(s)=[proxy])"
            )
        if pod is None:
            raise Refusal(404, f'pod "{name}" does not exist')
        if container not in pod_containers(pod):
            raise Refusal(404, f'container "{container}" not found in pod "{name}"')
        uid = str(pod["metadata"]["uid"])
        chosen = self.server.logs.choose(namespace, name, uid, container, options.previous)
        if chosen is not None:
            return chosen, options
        if options.previous:
            raise Refusal(400, f'previous terminated container "{container}" in pod "{name}" not found')
        phase = str((pod.get("status") or {}).get("phase") or "Pending")
        if phase in ("Pending", "Running"):
            raise Refusal(
                400,
                f'container "{container}" in pod "{name}" is waiting to start: the local kubelet has not '
                "started it (it runs the pods of the namespaces it watches whose trainer can run "
                "locally; its log says why not)",
            )
        raise Refusal(
            400, f'container "{container}" in pod "{name}" is terminated: the local kubelet did not run it'
        )

    def refuse(self, status: int, message: str) -> None:
        body = message.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def stream(self, chunks: Iterator[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for chunk in chunks:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (OSError, ssl.SSLError):
            self.close_connection = True  # the reader went away

    def gone(self) -> bool:
        """The server is stopping or the reader hung up (checked while following a quiet log)."""
        return self.server.stopping.is_set() or peer_closed(self.connection)


def peer_closed(connection: socket.socket) -> bool:
    readable, _, _ = select.select([connection], [], [], 0)
    if not readable:
        return False
    previous = connection.gettimeout()
    connection.settimeout(0.0)
    try:
        return connection.recv(1) == b""
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    except OSError:
        return True
    finally:
        connection.settimeout(previous)


class LogHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, context: ssl.SSLContext, client: KubeClient, logs: PodLogs) -> None:
        self.context = context
        self.client = client
        self.logs = logs
        self.authorizer = Authorizer(client)
        self.stopping = threading.Event()
        super().__init__((LOOPBACK, port), LogHandler)

    def server_bind(self) -> None:
        # Every local kubelet of the cluster listens on the nodes' kubelet port.
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()

    def finish_request(self, request: Any, client_address: Any) -> None:
        """The TLS handshake in the connection's own thread, then the request."""
        request.settimeout(LogHandler.timeout)
        try:
            connection = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError) as error:
            log.debug("log server: TLS handshake with %s failed: %s", client_address, error)
            return
        try:
            LogHandler(connection, client_address, self)
        finally:
            with contextlib.suppress(OSError):
                connection.close()


def server_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    """TLS with the kubelet's serving certificate; client certificates verified with the cluster's CA
    when given (a request without one is answered 401)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    context.load_verify_locations(str(client_ca))
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


def node_ports(client: KubeClient) -> list[int]:
    """The kubelet ports the nodes whose InternalIP is 127.0.0.1 name in their status."""
    ports: set[int] = set()
    for node in client.list(NODES).get("items") or []:
        status = node.get("status") or {}
        addresses = {a.get("address") for a in status.get("addresses") or [] if a.get("type") == "InternalIP"}
        port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
        if LOOPBACK in addresses and isinstance(port, int) and port > 0:
            ports.add(port)
    return sorted(ports)


class LogServer:
    """The endpoint on each port, each in a thread of its own."""

    def __init__(self, ports: list[int], context: ssl.SSLContext, client: KubeClient, logs: PodLogs) -> None:
        self.servers = [LogHTTPServer(port, context, client, logs) for port in ports]

    @property
    def ports(self) -> list[int]:
        return [int(server.server_address[1]) for server in self.servers]

    def start(self) -> None:
        for server in self.servers:
            threading.Thread(
                target=server.serve_forever, name=f"logs-{server.server_address[1]}", daemon=True
            ).start()
        log.info(
            "serving container logs (the kubelet API) on %s", ", ".join(f"{LOOPBACK}:{p}" for p in self.ports)
        )

    def stop(self) -> None:
        for server in self.servers:
            server.stopping.set()
            server.shutdown()
            server.server_close()
