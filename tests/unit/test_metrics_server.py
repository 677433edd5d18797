"""What the operator serves: its metrics exposition, checked by promtool with every series exercised,
and the servers of /metrics and of /healthz and /readyz in plain HTTP (formats, gzip, name filters,
named checks, concurrent scrapes, each path on its own server only, ports closed at stop, IPv4 and
IPv6 addresses).

Split out of tests/unit/test_metrics.py (the metrics themselves). The limits every server keeps are
tests/unit/test_httpserver.py's, HTTPS and the requesters' authentication tests/unit/test_metrics_auth.py's.
"""

from __future__ import annotations

import gzip
import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pytest
from prometheus_client import CollectorRegistry

from controller.metrics import Metrics, eviction_reason, restart_reason
from controller.runtime.clock import FakeClock
from controller.runtime.httpserver import HttpServer
from controller.runtime.serving import Check, MetricsServer, Probes, ProbeServer, parse_address
from controller.runtime.workqueue import WorkQueue
from tests.unit.metrics_jobs import COMPLETED, NOW, OTHER_NAMESPACE, PENDING, QUEUED, RUNNING

# ---- promtool ------------------------------------------------------------------------------------------


def exercise_everything(metrics: Metrics, clock: FakeClock) -> WorkQueue:
    ns = "ml"
    metrics.init_controller("trainingjob", 2)
    metrics.reconcile_total.labels(controller="trainingjob", result="success").inc()
    metrics.reconcile_errors.labels(controller="trainingjob").inc()
    metrics.reconcile_time.labels(controller="trainingjob").observe(0.03)
    metrics.active_workers.labels(controller="trainingjob").set(1)
    metrics.set_leader("trainingjob-operator", True)
    rest = metrics.rest_metrics()
    rest.request("201", "POST", "127.0.0.1:6443")
    rest.observe_duration("POST", "127.0.0.1:6443", 0.01)
    metrics.created.labels(namespace=ns).inc()
    metrics.completed.labels(namespace=ns, result="Completed").inc()
    metrics.failed.labels(namespace=ns, reason="BackoffLimitExceeded").inc()
    metrics.restarts.labels(namespace=ns, reason=restart_reason("disruption")).inc()
    metrics.time_to_running.labels(namespace=ns).observe(42.0)
    metrics.time_to_complete.labels(namespace=ns, result="Completed").observe(7200.0)
    metrics.reconciliations.labels(namespace=ns, result="requeue_after").inc()
    metrics.reconciliation_duration.labels(namespace=ns).observe(0.02)
    metrics.reconciliation_errors.labels(namespace=ns, error_type="Conflict").inc()
    metrics.invalid_spec.labels(namespace=ns).inc()
    metrics.queue_wait.labels(namespace=ns, cluster_queue="gpus").observe(30.0)
    metrics.evictions.labels(namespace=ns, reason=eviction_reason("Preempted")).inc()
    metrics.events_dropped.inc()
    metrics.track_jobs(lambda: [RUNNING, PENDING, COMPLETED, OTHER_NAMESPACE, QUEUED], FakeClock(NOW))
    queue = WorkQueue("trainingjob", clock, metrics.queue_metrics("trainingjob", "trainingjob"))
    metrics.track_queue(queue, "trainingjob")
    queue.add("ml/a")
    queue.add("ml/b")
    key, _ = queue.get()
    assert key is not None
    clock.advance(1.0)
    queue.done(key)
    queue.get()  # left in flight: unfinished work is non-zero
    clock.advance(2.0)
    queue.add_after("ml/c", 5.0)
    return queue


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (the Prometheus package) is not installed"
)
def test_promtool_finds_no_problems_in_the_exposition() -> None:
    clock = FakeClock()
    metrics = Metrics()
    queue = exercise_everything(metrics, clock)
    try:
        with serving(metrics.registry) as server:
            status, headers, body = get(server, "/metrics")
    finally:
        queue.shut_down()
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    text = body.decode()
    for name in (
        "controller_runtime_reconcile_total",
        "controller_runtime_reconcile_errors_total",
        "controller_runtime_reconcile_time_seconds_bucket",
        "controller_runtime_active_workers",
        "controller_runtime_max_concurrent_reconciles",
        "workqueue_depth",
        "workqueue_adds_total",
        "workqueue_retries_total",
        "workqueue_queue_duration_seconds_bucket",
        "workqueue_work_duration_seconds_bucket",
        "workqueue_unfinished_work_seconds",
        "workqueue_longest_running_processor_seconds",
        "leader_election_master_status",
        "rest_client_requests_total",
        "rest_client_request_duration_seconds_bucket",
        "trainingjob_jobs",
        "trainingjob_progress_percent",
        "trainingjob_loss",
        "trainingjob_gpu_utilization_percent",
        "trainingjob_duration_seconds",
        "trainingjob_created_total",
        "trainingjob_completed_total",
        "trainingjob_failed_total",
        "trainingjob_restarts_total",
        "trainingjob_time_to_running_seconds_bucket",
        "trainingjob_time_to_complete_seconds_bucket",
        "trainingjob_reconciliation_total",
        "trainingjob_reconciliation_duration_seconds_bucket",
        "trainingjob_reconciliation_errors_total",
        "trainingjob_invalid_spec_total",
        "trainingjob_events_dropped_total",
        "process_cpu_seconds_total",
    ):
        assert f"\n{name}{{" in text or f"\n{name} " in text, name
    series = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert not [name for name in series if name.endswith("_created")]
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, timeout=60, check=False
    )
    problems = (result.stdout + result.stderr).decode()
    assert result.returncode == 0, problems
    assert problems.strip() == ""


# ---- HTTP servers --------------------------------------------------------------------------------------


class Switch:
    def __init__(self, ok: bool, reason: str) -> None:
        self.ok = ok
        self.reason = reason

    def __call__(self) -> tuple[bool, str]:
        return self.ok, self.reason


@pytest.fixture
def registry() -> CollectorRegistry:
    metrics = Metrics(process_metrics=False)
    metrics.created.labels(namespace="ml").inc()
    return metrics.registry


@contextmanager
def serving(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    """A plain-HTTP metrics server on a free loopback port (--metrics-secure=false)."""
    server = MetricsServer("127.0.0.1", 0, registry)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def probing(
    ready: Check | Mapping[str, Check], healthy: Check | Mapping[str, Check]
) -> Iterator[ProbeServer]:
    server = ProbeServer("127.0.0.1", 0, Probes(ready=ready, healthy=healthy))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def get(
    server: HttpServer, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - http to a local server
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers.items()), error.read()


def test_server_binds_a_free_port_and_serves_metrics(registry: CollectorRegistry) -> None:
    with serving(registry) as server:
        assert server.port > 0
        status, headers, body = get(server, "/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert 'trainingjob_created_total{namespace="ml"} 1.0' in body.decode()


def test_server_honours_openmetrics_and_gzip(registry: CollectorRegistry) -> None:
    with serving(registry) as server:
        status, headers, body = get(
            server, "/metrics", {"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"}
        )
        assert status == 200
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.decode().endswith("# EOF\n")
        status, headers, body = get(server, "/metrics", {"Accept-Encoding": "gzip"})
        assert status == 200
        assert headers["Content-Encoding"] == "gzip"
        assert b"trainingjob_created_total" in gzip.decompress(body)


def test_server_filters_by_name(registry: CollectorRegistry) -> None:
    with serving(registry) as server:
        _, _, body = get(server, "/metrics?name[]=trainingjob_created_total")
    assert b'trainingjob_created_total{namespace="ml"} 1.0' in body
    assert b"trainingjob_invalid_spec" not in body


def test_readyz_and_healthz() -> None:
    ready = Switch(False, "informer caches not synced")
    healthy = Switch(True, "")
    with probing(ready, healthy) as server:
        assert get(server, "/healthz")[::2] == (200, b"ok")
        assert get(server, "/livez")[::2] == (200, b"ok")
        status, _, body = get(server, "/readyz")
        assert (status, body) == (503, b"informer caches not synced\n")
        status, _, body = get(server, "/readyz?verbose")
        assert status == 503
        assert body.decode().splitlines() == [
            "[+]ping ok",
            "[-]ready failed: informer caches not synced",
            "readyz check failed",
        ]
        ready.ok = True
        assert get(server, "/readyz")[::2] == (200, b"ok")
        status, _, body = get(server, "/readyz?verbose")
        assert (status, body.decode().splitlines()) == (
            200,
            ["[+]ping ok", "[+]ready ok", "readyz check passed"],
        )
        healthy.ok, healthy.reason = False, "worker thread died"
        assert get(server, "/healthz")[::2] == (503, b"worker thread died\n")


def test_named_checks_added_and_removed_and_a_check_that_raises() -> None:
    def explode() -> tuple[bool, str]:
        raise RuntimeError("boom")

    ready = {"informers": lambda: (True, ""), "leader": lambda: (False, "not the leader")}
    with probing(ready, explode) as server:
        status, _, body = get(server, "/readyz")
        assert (status, body) == (503, b"leader: not the leader\n")
        _, _, body = get(server, "/readyz?verbose=1")
        assert body.decode().splitlines() == [
            "[+]ping ok",
            "[+]informers ok",
            "[-]leader failed: not the leader",
            "readyz check failed",
        ]
        status, _, body = get(server, "/healthz")
        assert status == 503
        assert b"RuntimeError: boom" in body
        server.probes.remove_ready_check("leader")
        server.probes.add_ready_check("kueue", lambda: (True, ""))
        _, _, body = get(server, "/readyz?verbose")
        assert body.decode().splitlines() == [
            "[+]ping ok",
            "[+]informers ok",
            "[+]kueue ok",
            "readyz check passed",
        ]


def test_each_server_serves_only_its_own_paths(registry: CollectorRegistry) -> None:
    """The probes carry nothing of /metrics, and /metrics's port answers no probe (the kubelet's
    probes go to their own port, whatever happens on the metrics port)."""
    with serving(registry) as metrics, probing(Switch(True, ""), Switch(True, "")) as probes:
        for path in ("/healthz", "/livez", "/readyz"):
            assert get(metrics, path)[0] == 404
        assert get(probes, "/metrics")[0] == 404


def test_unknown_paths_are_404_and_requests_are_not_logged(
    registry: CollectorRegistry, capfd: pytest.CaptureFixture[str]
) -> None:
    with serving(registry) as server:
        assert get(server, "/nope")[0] == 404
        assert get(server, "/")[0] == 404
        assert get(server, "/metrics")[0] == 200
    captured = capfd.readouterr()
    assert captured.err == ""


def test_concurrent_scrapes(registry: CollectorRegistry) -> None:
    results: list[int] = []
    lock = threading.Lock()
    with serving(registry) as server:

        def scrape_once() -> None:
            status = get(server, "/metrics")[0]
            with lock:
                results.append(status)

        threads = [threading.Thread(target=scrape_once) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert results == [200] * 8


@pytest.mark.parametrize("kind", ["metrics", "probes"])
def test_stop_closes_the_port(registry: CollectorRegistry, kind: str) -> None:
    if kind == "metrics":
        server: HttpServer = MetricsServer("127.0.0.1", 0, registry)
    else:
        server = ProbeServer("127.0.0.1", 0, Probes(ready=Switch(True, ""), healthy=Switch(True, "")))
    port = server.start()
    assert server.start() == port  # idempotent
    server.stop()
    server.stop()  # idempotent
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)


# ---- addresses -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":8080", ("", 8080)),
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("0.0.0.0:9090", ("0.0.0.0", 9090)),  # noqa: S104 - parsing only
        ("[::1]:8080", ("::1", 8080)),
        ("[::]:0", ("::", 0)),
        ("localhost:8443", ("localhost", 8443)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["8080", "", "host:", "host:http", ":70000", "::1:8080", "[::1:8080", ":-1"])
def test_parse_address_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid listen address"):
        parse_address(text)


@pytest.fixture(autouse=True)
def _no_server_threads_left() -> Iterator[None]:
    yield
    assert not [
        thread for thread in threading.enumerate() if thread.name in ("metrics-server", "probe-server")
    ]


def ipv6_loopback_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback_available(), reason="this machine has no IPv6 loopback")
def test_server_on_ipv6_loopback() -> None:
    host, port = parse_address("[::1]:0")
    server = ProbeServer(host, port, Probes(ready=Switch(True, ""), healthy=Switch(True, "")))
    bound = server.start()
    try:
        with urllib.request.urlopen(f"http://[::1]:{bound}/healthz", timeout=10) as response:
            assert response.read() == b"ok"
    finally:
        server.stop()
