"""The operator's HTTP endpoints, as a kubebuilder project's manager serves them: /metrics on its own
port, over HTTPS for authenticated and authorized requesters (or plain HTTP for local development),
and the kubelet's probes, /healthz (alias /livez) and /readyz, on another port in plain HTTP.

Why two servers: the probes must answer the kubelet whatever happens to the metrics port (a flood of
connections there fills its cap, not theirs), and they carry nothing a tenant could learn from, while
/metrics names every tenant's jobs. Each is an `HttpServer` (controller/runtime/httpserver.py: a cap on
connections, deadlines on reads and writes).

Probes answer like Kubernetes components: 200 "ok", or 503 with the failing checks' reasons, and
`?verbose` lists every check. /metrics speaks the text and OpenMetrics formats (content negotiation),
gzip when asked, and `name[]` filters. With a `DelegatingAuth` every path of the metrics server needs
a token whose user may `get` that path (controller/runtime/authfilter.py); a request that fails that
gets its 401, 403 or 500 and its connection closed.
"""

from __future__ import annotations

import gzip
import logging
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from controller.runtime.authfilter import DelegatingAuth
from controller.runtime.httpserver import HttpServer, Limits, Request, Response, parse_address
from controller.runtime.servingcert import ServingCertificate

__all__ = [
    "Check",
    "Limits",
    "MetricsServer",
    "ProbeServer",
    "Probes",
    "parse_address",
]

logger = logging.getLogger(__name__)

Check = Callable[[], tuple[bool, str]]

# A scrape is one connection per Prometheus replica; a few more leave room for people with curl.
METRICS_LIMITS = Limits(max_connections=32)
# The kubelet opens one connection per probe and closes it.
PROBE_LIMITS = Limits(max_connections=16)


def _normalise_checks(checks: Check | Mapping[str, Check], default_name: str) -> dict[str, Check]:
    if callable(checks):
        return {default_name: checks}
    return dict(checks)


def _run_check(check: Check) -> tuple[bool, str]:
    try:
        ok, reason = check()
    except Exception as exc:
        logger.exception("health check raised")
        return False, f"check raised {type(exc).__name__}: {exc}"
    return bool(ok), str(reason)


class Probes:
    """The named readiness and health checks, and the answers of /readyz, /healthz and /livez.

    `ready` and `healthy` are checks returning `(ok, reason)`, or mappings of named checks. Checks may
    be added and removed while serving (a cache started or stopped later); a request sees all or none.
    """

    def __init__(self, *, ready: Check | Mapping[str, Check], healthy: Check | Mapping[str, Check]) -> None:
        self.ready_checks = _normalise_checks(ready, "ready")
        self.health_checks = _normalise_checks(healthy, "healthy")

    def add_ready_check(self, name: str, check: Check) -> None:
        self.ready_checks = {**self.ready_checks, name: check}

    def remove_ready_check(self, name: str) -> None:
        self.ready_checks = {key: check for key, check in self.ready_checks.items() if key != name}

    def handle(self, request: Request) -> Response:
        if request.path in ("/healthz", "/livez"):
            return self._answer("healthz", self.health_checks, request)
        if request.path == "/readyz":
            return self._answer("readyz", self.ready_checks, request)
        return Response(404, b"404 page not found\n")

    @staticmethod
    def _answer(endpoint: str, checks: Mapping[str, Check], request: Request) -> Response:
        results = {name: _run_check(check) for name, check in checks.items()}
        healthy = all(ok for ok, _ in results.values())
        if "verbose" in request.query:
            lines = ["[+]ping ok"]
            for name, (ok, reason) in results.items():
                lines.append(f"[+]{name} ok" if ok else f"[-]{name} failed: {reason}")
            lines.append(f"{endpoint} check {'passed' if healthy else 'failed'}")
            return Response(200 if healthy else 503, ("\n".join(lines) + "\n").encode())
        if healthy:
            return Response(200, b"ok")
        failed = [(name, reason) for name, (ok, reason) in results.items() if not ok]
        if len(results) == 1:
            text = failed[0][1]
        else:
            text = "\n".join(f"{name}: {reason}" for name, reason in failed)
        return Response(503, (text + "\n").encode())


class ProbeServer(HttpServer):
    """/healthz, /livez and /readyz of `probes`, in plain HTTP (the kubelet's probes)."""

    def __init__(self, host: str, port: int, probes: Probes, *, limits: Limits = PROBE_LIMITS) -> None:
        super().__init__("probe-server", host, port, probes.handle, limits=limits)
        self.probes = probes


def metrics_response(registry: CollectorRegistry, request: Request) -> Response:
    """The exposition of `registry` as the request asks for it (format, gzip, `name[]` filter)."""
    try:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        source: Collector = registry
        names = request.query.get("name[]")
        if names:
            source = registry.restricted_registry(names)
        body = encoder(source)
    except Exception:
        logger.exception("rendering metrics failed")
        return Response(500, b"rendering metrics failed\n")
    headers = {}
    if gzip_accepted(request.headers.get("accept-encoding", "")):
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return Response(200, body, content_type, headers)


class MetricsServer(HttpServer):
    """/metrics of `registry`: HTTPS with `certificate`, each request checked by `auth` when given."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        *,
        certificate: ServingCertificate | None = None,
        auth: DelegatingAuth | None = None,
        limits: Limits = METRICS_LIMITS,
    ) -> None:
        tls = certificate.context if certificate is not None else None
        super().__init__("metrics-server", host, port, self._handle, limits=limits, tls=tls)
        self.registry = registry
        self.certificate = certificate
        self.auth = auth

    def _handle(self, request: Request) -> Response:
        if self.auth is not None:
            decision = self.auth.decide(request.headers.get("authorization"), request.method, request.path)
            if not decision.allowed:
                return Response(decision.status, (decision.message + "\n").encode(), close=True)
        if request.path == "/metrics":
            return metrics_response(self.registry, request)
        return Response(404, b"404 page not found\n")
