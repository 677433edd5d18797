"""The HTTP/1.1 client over TLS, on connections borrowed from the official client's urllib3 pool as the
operator borrows them (controller/runtime/borrowed.py), against a raw TLS server on 127.0.0.1 with a
certificate made for the test: requests on one kept-alive connection, a watch, a kept-alive connection
the server closed, and an answer sent before the request's body was read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest

from controller import resources as kube
from controller.runtime.client import KubeClient
from controller.runtime.errors import ApiError
from tests.unit.rawserver import RawServer, self_signed_certificate, sent_by_http11, server_context

POD = b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","resourceVersion":"1"}}'


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def server(certificate: tuple[Path, Path]) -> Iterator[RawServer]:
    raw = RawServer(tls=server_context(*certificate))
    yield raw
    raw.close()


@pytest.fixture
def client(server: RawServer, certificate: tuple[Path, Path]) -> KubeClient:
    """A client that verifies the server's certificate against the test's, as a kubeconfig's CA."""
    configuration = kubernetes.client.Configuration()
    configuration.host = f"https://127.0.0.1:{server.port}"
    configuration.ssl_ca_cert = str(certificate[0])
    configuration.api_key = {"authorization": "Bearer test-token"}
    return KubeClient(kubernetes.client.ApiClient(configuration), qps=0, burst=0, max_attempts=5)


def test_requests_over_tls_share_one_kept_alive_connection(server: RawServer, client: KubeClient) -> None:
    server.script(ok(POD), ok(POD), ok(POD))
    assert client.get(kube.PODS, "ns", "p")["metadata"]["name"] == "p"
    assert client.create(kube.PODS, "ns", {"metadata": {"name": "p"}})["kind"] == "Pod"
    assert client.get(kube.PODS, "ns", "p")["kind"] == "Pod"
    assert server.connections == 1
    assert [request.split(b" ", 2)[:2] for request in server.requests] == [
        [b"GET", b"/api/v1/namespaces/ns/pods/p"],
        [b"POST", b"/api/v1/namespaces/ns/pods"],
        [b"GET", b"/api/v1/namespaces/ns/pods/p"],
    ]
    assert all(sent_by_http11(request) for request in server.requests)
    assert b"\r\nauthorization: Bearer test-token\r\n" in server.requests[0]


def test_a_watch_over_tls_returns_its_events(server: RawServer, client: KubeClient) -> None:
    events = [b'{"type":"ADDED","object":%s}\n' % POD, b'{"type":"MODIFIED","object":%s}\n' % POD]
    server.script(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events)
        + b"0\r\n\r\n"
    )
    stream = client.watch(kube.PODS, "ns", resource_version="1", timeout_seconds=60, read_timeout=10.0)
    with stream:
        assert [kind for kind, _ in stream] == ["ADDED", "MODIFIED"]
    (request,) = server.requests
    assert request.startswith(b"GET /api/v1/namespaces/ns/pods?watch=true&resourceVersion=1&")
    assert sent_by_http11(request)


def test_a_kept_alive_tls_connection_the_server_closed_is_not_used_again(
    server: RawServer, client: KubeClient
) -> None:
    server.script(ok(POD), then_close=True)
    server.script(ok(POD))
    client.get(kube.PODS, "ns", "p")
    assert server.closed.acquire(timeout=10.0)
    assert client.get(kube.PODS, "ns", "p")["kind"] == "Pod"
    assert server.connections == 2


def test_a_refusal_sent_before_the_body_was_read_is_the_answer_over_tls(
    server: RawServer, client: KubeClient
) -> None:
    """The API server refuses a body over 3 MiB with 413 before reading it; over TLS the cut-short send
    ends in an EOF where OpenSSL expected more. The refusal is the answer, not retried."""
    too_large = b'{"kind":"Status","code":413,"reason":"RequestEntityTooLarge","message":"too large"}'
    server.script(
        b"HTTP/1.1 413 Request Entity Too Large\r\nContent-Length: %d\r\n\r\n%s"
        % (len(too_large), too_large),
        read_body=False,
    )
    with pytest.raises(ApiError) as refused:
        client.create(kube.CONFIGMAPS, "ns", {"metadata": {"name": "big"}, "data": {"x": "y" * (16 << 20)}})
    assert (refused.value.status, refused.value.reason) == (413, "RequestEntityTooLarge")
    assert server.connections == 1
