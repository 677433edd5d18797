"""KubeClient's watches (events split across chunks, error events, refusals, rate limits, timeouts,
closing from another thread) and loading a kubeconfig (explicit, default location, in-cluster first),
against a fake API server.

Split out of tests/unit/test_kube.py (paths and requests).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from controller import resources as kube
from controller.runtime import boundedjson
from controller.runtime.client import KubeClient
from controller.runtime.clock import RealClock
from controller.runtime.errors import (
    ApiError,
    Gone,
    ServerError,
    TransportError,
)
from tests.unit import kube_support
from tests.unit.fakeapi import FakeApi, Reply, Stream, event, status
from tests.unit.kube_support import DEADLINE_SECONDS, POD_PATH, CountingMetrics, RecordingClock, pod

# The shared fixtures, bound here so that pytest finds them for this module's tests.
api = kube_support.api
clock = kube_support.clock
metrics = kube_support.metrics
client = kube_support.client


# ---- watch --------------------------------------------------------------------------------------------


def test_watch_yields_events_and_sends_watch_parameters(
    api: FakeApi, client: KubeClient, metrics: CountingMetrics
) -> None:
    api.script(
        "GET",
        "/api/v1/namespaces/ns/pods",
        Stream(
            (
                event("ADDED", pod(rv="5")),
                b"this is not json\n",
                b'{"type": "MODIFIED"}\n',
                event("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "9"}}),
                event("DELETED", pod(rv="10")),
            )
        ),
    )
    with client.watch(
        kube.PODS, "ns", resource_version="4", label_selector="a=b", timeout_seconds=321, read_timeout=5.0
    ) as stream:
        events = list(stream)
    assert [(kind, obj["metadata"]["resourceVersion"]) for kind, obj in events] == [
        ("ADDED", "5"),
        ("BOOKMARK", "9"),
        ("DELETED", "10"),
    ]
    (sent,) = api.requests("GET")
    assert sent.query == {
        "watch": "true",
        "resourceVersion": "4",
        "labelSelector": "a=b",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "321",
    }
    assert sent.headers["authorization"] == "Bearer test-token"
    assert metrics.calls == [("200", "GET", client.host)]


def test_a_watch_through_a_kubeconfig_proxy_goes_to_the_proxy(api: FakeApi, clock: RecordingClock) -> None:
    """Through a proxy the official client's proxy manager carries the stream (urllib3's response)."""
    configuration = api.configuration()
    configuration.host = "http://api-server.invalid:6443"
    configuration.proxy = api.url
    proxied = KubeClient(kubernetes.client.ApiClient(configuration), qps=0, burst=0, clock=clock)
    api.script("GET", "/api/v1/pods", Stream((event("ADDED", pod(rv="3")), event("DELETED", pod(rv="4")))))
    with proxied.watch(kube.PODS, resource_version="1", timeout_seconds=60, read_timeout=5.0) as stream:
        assert [(kind, obj["metadata"]["resourceVersion"]) for kind, obj in stream] == [
            ("ADDED", "3"),
            ("DELETED", "4"),
        ]
    (sent,) = api.requests("GET", "/api/v1/pods")
    assert sent.headers["Host"] == "api-server.invalid:6443"


def test_watch_event_split_across_chunks(api: FakeApi, client: KubeClient) -> None:
    line = b'{"type": "ADDED", "object": {"metadata": {"name": "p", "resourceVersion": "3"}}}\n'
    api.script("GET", "/api/v1/pods", Stream((line[:20], line[20:50], line[50:])))
    with client.watch(kube.PODS, resource_version="1", timeout_seconds=60, read_timeout=5.0) as stream:
        assert [obj["metadata"]["resourceVersion"] for _, obj in stream] == ["3"]


@pytest.mark.parametrize(
    ("error_status", "expected"),
    [
        (status(410, "Expired", "too old resource version: 1 (5)"), Gone),
        (status(410, "Gone"), Gone),
        ({"kind": "Status", "reason": "Expired", "message": "too old"}, Gone),
        (status(500, "InternalError"), ServerError),
    ],
)
def test_watch_error_event_raises_mapped_error(
    api: FakeApi, client: KubeClient, error_status: dict[str, Any], expected: type[Exception]
) -> None:
    api.script("GET", "/api/v1/pods", Stream((event("ADDED", pod()), event("ERROR", error_status))))
    stream = client.watch(kube.PODS, resource_version="1", timeout_seconds=60, read_timeout=5.0)
    events = iter(stream)
    assert next(events)[0] == "ADDED"
    with pytest.raises(expected):
        next(events)
    assert stream.closed


def test_watch_refused_maps_the_answer(api: FakeApi, client: KubeClient) -> None:
    api.script(
        "GET", "/api/v1/pods", Reply(410, status(410, "Expired")), Reply(403, status(403, "Forbidden"))
    )
    with pytest.raises(Gone):
        client.watch(kube.PODS, resource_version="1", timeout_seconds=60, read_timeout=5.0)
    with pytest.raises(ApiError) as raised:
        client.watch(kube.PODS, resource_version="1", timeout_seconds=60, read_timeout=5.0)
    assert raised.value.status == 403
    assert len(api.requests()) == 2  # never retried


def test_watch_is_rate_limited(api: FakeApi, clock: RecordingClock) -> None:
    client = KubeClient(api.api_client(), qps=1.0, burst=1, clock=clock)
    api.default("GET", "/api/v1/pods", Stream())
    for _ in range(3):
        with client.watch(kube.PODS, resource_version="1", timeout_seconds=60, read_timeout=5.0) as stream:
            assert list(stream) == []
    assert clock.sleeps == [1.0, 1.0]


def test_watch_read_timeout_is_a_transport_error(api: FakeApi, client: KubeClient) -> None:
    api.script("GET", "/api/v1/pods", Stream((event("ADDED", pod()),), stall=True))
    stream = client.watch(kube.PODS, resource_version="1", timeout_seconds=60, read_timeout=0.2)
    events = iter(stream)
    assert next(events)[0] == "ADDED"
    with pytest.raises(TransportError, match="timed out"):
        next(events)
    assert stream.closed


def test_watch_close_unblocks_a_reader_in_another_thread(api: FakeApi, client: KubeClient) -> None:
    api.script("GET", "/api/v1/pods", Stream((event("ADDED", pod()),), stall=True))
    stream = client.watch(kube.PODS, resource_version="1", timeout_seconds=60, read_timeout=60.0)
    first = threading.Event()
    outcome: list[object] = []

    def read() -> None:
        try:
            for _ in stream:
                first.set()
            outcome.append("ended")
        except Exception as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert first.wait(DEADLINE_SECONDS)
    started = RealClock().monotonic()
    stream.close()
    stream.close()  # idempotent
    reader.join(DEADLINE_SECONDS)
    assert not reader.is_alive()
    assert RealClock().monotonic() - started < 5.0
    assert outcome == ["ended"]


def test_watch_closed_before_iterating_yields_nothing(api: FakeApi, client: KubeClient) -> None:
    api.script("GET", "/api/v1/pods", Stream((event("ADDED", pod()),), stall=True))
    stream = client.watch(kube.PODS, resource_version="1", timeout_seconds=60, read_timeout=60.0)
    stream.close()
    assert list(stream) == []


# ---- configuration ------------------------------------------------------------------------------------


def write_kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [
            {"name": "alice", "user": {"token": "alice-token"}},
            {"name": "bob", "user": {"token": "bob-token"}},
        ],
        "contexts": [
            {"name": "as-alice", "context": {"cluster": "fake", "user": "alice"}},
            {"name": "as-bob", "context": {"cluster": "fake", "user": "bob"}},
        ],
        "current-context": "as-alice",
    }
    path.write_text(json.dumps(config))
    return path


def test_from_kubeconfig_explicit_path_and_context(api: FakeApi, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "config", api.url)
    api.default("GET", POD_PATH, Reply(200, pod()))
    client = kube.from_kubeconfig(str(kubeconfig), "as-bob", pool_size=7)
    assert client.get(kube.PODS, "ns", "p") == pod()
    (sent,) = api.requests()
    assert sent.headers["authorization"] == "Bearer bob-token"
    assert sent.headers["User-Agent"].startswith("trainingjob-operator/")
    assert client.api_client.configuration.connection_pool_maxsize == 7
    assert client.host == api.url.removeprefix("http://")


def test_from_kubeconfig_default_location(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "config", api.url)))
    api.default("GET", POD_PATH, Reply(200, pod()))
    kube.from_kubeconfig().get(kube.PODS, "ns", "p")
    (sent,) = api.requests()
    assert sent.headers["authorization"] == "Bearer alice-token"


def test_from_kubeconfig_prefers_in_cluster_to_the_default_location(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "config", api.url)))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    if Path(kubernetes.config.incluster_config.SERVICE_TOKEN_FILENAME).exists():
        pytest.skip("running inside a pod")
    with pytest.raises(kubernetes.config.ConfigException):
        kube.from_kubeconfig()


def test_only_custom_resources_answers_are_scanned_for_nesting_first(
    api: FakeApi, client: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A built-in kind's schema bounds its depth, so its answers skip the up-front scan (a pod create's
    answer is decoded for every pod); a custom resource's answer is always scanned."""
    scanned: list[int] = []
    real = boundedjson.nesting_exceeds

    def counting(payload: bytes, max_depth: int) -> bool:
        scanned.append(len(payload))
        return real(payload, max_depth)

    monkeypatch.setattr(boundedjson, "nesting_exceeds", counting)
    api.script("POST", "/api/v1/namespaces/ns/pods", Reply(201, pod()))
    api.script("PATCH", POD_PATH, Reply(200, pod(rv="2")))
    client.create(kube.PODS, "ns", pod())
    client.patch(kube.PODS, "ns", "p", {"metadata": {"labels": {"a": "b"}}})
    assert scanned == []
    job_path = "/apis/ml.example.com/v1/namespaces/ns/trainingjobs/j"
    api.script("PATCH", job_path + "/status", Reply(200, {"metadata": {"name": "j"}}))
    client.patch(kube.TRAININGJOBS, "ns", "j", {"status": {}}, subresource="status")
    assert len(scanned) == 1
