"""Which HTTP client carries the operator's API requests, seen from a raw socket server: its own HTTP/1.1
client by default; urllib3 for every client the operator builds with --fast-http-client=false (or its
environment variable); urllib3, said once in the log, when the start-up check finds that urllib3's
connections cannot be borrowed (controller/runtime/borrowed.py)."""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
import urllib3
from urllib3.connection import HTTPConnection
from urllib3.util import ssl_ as urllib3_ssl

from controller import cli
from controller import resources as kube
from controller.metrics import Metrics
from controller.runtime import borrowed
from controller.runtime.client import KubeClient
from tests.unit.rawserver import RawServer, sent_by_http11

POD = b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns"}}'
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(POD),
    POD,
)


@pytest.fixture
def server() -> Iterator[RawServer]:
    raw = RawServer()
    yield raw
    raw.close()


def kubeconfig(server: RawServer, directory: Path) -> Path:
    path = directory / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "raw", "cluster": {"server": f"http://127.0.0.1:{server.port}"}}],
                "users": [{"name": "raw", "user": {"token": "test-token"}}],
                "contexts": [{"name": "raw", "context": {"cluster": "raw", "user": "raw"}}],
                "current-context": "raw",
            }
        )
    )
    return path


@pytest.mark.parametrize(
    ("argv", "environ", "through_http11"),
    [
        ([], {}, True),
        (["--fast-http-client=false"], {}, False),
        ([], {"TRAININGJOB_OPERATOR_FAST_HTTP_CLIENT": "false"}, False),
    ],
    ids=["default", "flag", "environment"],
)
def test_the_flag_chooses_the_client_of_every_client_the_operator_builds(
    server: RawServer, tmp_path: Path, argv: list[str], environ: dict[str, str], through_http11: bool
) -> None:
    args = cli.parser().parse([f"--kubeconfig={kubeconfig(server, tmp_path)}", *argv], environ=environ)
    metrics = Metrics()
    client = cli.connect(args, metrics, cli.pool_size(args))
    clients = [client, *cli.lease_and_events_clients(args, metrics, client)]
    for _ in clients:  # a connection each through HTTP/1.1 client; one for all through urllib3's pool
        server.script(ANSWER, ANSWER, ANSWER)
    for each in clients:
        assert each.get(kube.PODS, "ns", "p")["kind"] == "Pod"
    assert [sent_by_http11(request) for request in server.requests] == [through_http11] * 3
    assert all(b"\r\nauthorization: Bearer test-token\r\n" in request for request in server.requests)


class ConnectionOfItsOwn(HTTPConnection):
    """A connection class plugged into urllib3, as libraries do (this one changes nothing)."""


class PoolOfItsOwn(urllib3.HTTPConnectionPool):
    ConnectionCls = ConnectionOfItsOwn


def test_connections_that_cannot_be_borrowed_send_requests_through_urllib3_logged_once(
    server: RawServer, caplog: pytest.LogCaptureFixture
) -> None:
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.port}"
    api_client = kubernetes.client.ApiClient(configuration)
    api_client.rest_client.pool_manager.pool_classes_by_scheme = {
        "http": PoolOfItsOwn,
        "https": urllib3.HTTPSConnectionPool,
    }
    for _ in range(2):  # a connection each through the HTTP/1.1 client; one for both through urllib3
        server.script(ANSWER, ANSWER)
    with caplog.at_level(logging.WARNING, logger="controller.runtime.transport"):
        clients = [KubeClient(api_client, qps=0, burst=0) for _ in range(2)]
    for each in clients:
        assert each.get(kube.PODS, "ns", "p")["kind"] == "Pod"
    assert [sent_by_http11(request) for request in server.requests] == [False, False]
    (warning,) = [record for record in caplog.records if record.name == "controller.runtime.transport"]
    assert "API requests go through urllib3" in warning.getMessage()
    assert "ConnectionOfItsOwn" in warning.getMessage()


def test_the_official_clients_own_pools_can_be_borrowed_over_tcp_and_tls() -> None:
    for host in ("http://127.0.0.1:1", "https://127.0.0.1:1"):
        configuration = kubernetes.client.Configuration()
        configuration.host = host
        pool = kubernetes.client.ApiClient(configuration).rest_client.pool_manager.connection_from_url(host)
        assert borrowed.opener(pool) == pool._new_conn


class NotTheStandardLibrarysContext:
    """Where urllib3's pyOpenSSL backend puts its own context class (urllib3.contrib.pyopenssl)."""


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("SSLContext", NotTheStandardLibrarysContext, "pyOpenSSL"),
        ("ALPN_PROTOCOLS", ["h2"], "HTTP/2"),
    ],
    ids=["pyopenssl", "http2"],
)
def test_tls_from_another_library_or_offering_http2_is_not_borrowed(
    monkeypatch: pytest.MonkeyPatch, setting: str, value: object, named: str
) -> None:
    """What urllib3's pyOpenSSL and HTTP/2 injections change in urllib3.util.ssl_, changed the same way."""
    monkeypatch.setattr(urllib3_ssl, setting, value)
    pool = urllib3.HTTPSConnectionPool("127.0.0.1", 1, cert_reqs=ssl.CERT_REQUIRED)
    with pytest.raises(borrowed.Unsupported, match=named):
        borrowed.opener(pool)
