"""The REST client against a scripted API server over real HTTP: retries, mapping, pacing, metrics, watch."""

from __future__ import annotations

from typing import Any

import kubernetes
import pytest

from controller import resources as kube
from controller.runtime.client import KubeClient, PatchType
from controller.runtime.errors import (
    AlreadyExists,
    Conflict,
    Invalid,
    NotFound,
    ServerError,
    TooManyRequests,
    TransportError,
)
from controller.runtime.resource import Resource
from tests.unit import kube_support
from tests.unit.fakeapi import Drop, FakeApi, Reply, Stream, running, status
from tests.unit.kube_support import POD_PATH, CountingMetrics, RecordingClock, pod

# The shared fixtures, bound here so that pytest finds them for this module's tests.
api = kube_support.api
clock = kube_support.clock
metrics = kube_support.metrics
client = kube_support.client


# ---- paths --------------------------------------------------------------------------------------------


def test_core_and_group_paths() -> None:
    assert kube.PODS.path() == "/api/v1/pods"
    assert kube.PODS.path("ns") == "/api/v1/namespaces/ns/pods"
    assert kube.PODS.path("ns", "p", "status") == "/api/v1/namespaces/ns/pods/p/status"
    assert (
        kube.LEASES.path("kube-system", "l") == "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l"
    )
    assert kube.NODES.path(name="n1") == "/api/v1/nodes/n1"
    assert kube.NAMESPACES.path(name="ns") == "/api/v1/namespaces/ns"
    assert kube.CRDS.path(name="a.b") == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/a.b"
    assert kube.PRIORITYCLASSES.path() == "/apis/scheduling.k8s.io/v1/priorityclasses"
    assert (
        kube.TRAININGJOBS.path("ns", "j", "status")
        == "/apis/ml.example.com/v1/namespaces/ns/trainingjobs/j/status"
    )
    assert kube.ROLEBINDINGS.api_version == "rbac.authorization.k8s.io/v1"
    assert kube.PODS.api_version == "v1"


def test_path_refuses_wrong_scope() -> None:
    with pytest.raises(ValueError, match="cluster-scoped"):
        kube.NODES.path("ns")
    with pytest.raises(ValueError, match="needs a namespace"):
        kube.PODS.path(name="p")
    with pytest.raises(ValueError, match="subresource needs a name"):
        kube.PODS.path("ns", subresource="status")


def test_path_segments_are_escaped() -> None:
    assert Resource("", "v1", "things", "Thing").path("ns", "a/b") == "/api/v1/namespaces/ns/things/a%2Fb"


# ---- requests -----------------------------------------------------------------------------------------


def test_get_sends_auth_and_returns_the_dict(
    api: FakeApi, client: KubeClient, metrics: CountingMetrics
) -> None:
    api.script("GET", POD_PATH, Reply(200, pod()))
    assert client.get(kube.PODS, "ns", "p") == pod()
    (sent,) = api.requests("GET", POD_PATH)
    assert sent.headers["authorization"] == "Bearer test-token"
    assert sent.headers["Accept"] == "application/json"
    assert metrics.calls == [("200", "GET", client.host)]
    assert client.host == api.url.removeprefix("http://")


def test_list_query_parameters(api: FakeApi, client: KubeClient) -> None:
    api.script("GET", "/api/v1/namespaces/ns/pods", Reply(200, {"items": []}))
    client.list(
        kube.PODS,
        "ns",
        label_selector="a=b",
        field_selector="status.phase=Running",
        resource_version="0",
        limit=50,
        continue_="tok",
    )
    (sent,) = api.requests("GET")
    assert sent.query == {
        "labelSelector": "a=b",
        "fieldSelector": "status.phase=Running",
        "resourceVersion": "0",
        "limit": "50",
        "continue": "tok",
    }


def test_create_and_replace_send_json(api: FakeApi, client: KubeClient) -> None:
    api.script("POST", "/api/v1/namespaces/ns/pods", Reply(201, pod()))
    api.script("PUT", POD_PATH, Reply(200, pod(rv="2")))
    assert client.create(kube.PODS, "ns", pod()) == pod()
    assert client.replace(kube.PODS, "ns", "p", pod())["metadata"]["resourceVersion"] == "2"
    created, replaced = api.requests()
    assert created.headers["Content-Type"] == "application/json"
    assert created.json() == pod()
    assert replaced.json() == pod()


def test_a_write_whose_answer_is_not_wanted_returns_nothing_and_still_maps_refusals(
    api: FakeApi, client: KubeClient
) -> None:
    api.script("POST", "/api/v1/namespaces/ns/pods", Reply(201, pod()))
    api.script("PATCH", POD_PATH, Reply(200, pod(rv="2")))
    api.script("POST", "/api/v1/namespaces/ns/pods", Reply(409, status(409, "AlreadyExists", "exists")))
    assert client.create(kube.PODS, "ns", pod(), answer=False) == {}
    assert client.patch(kube.PODS, "ns", "p", {"metadata": {"labels": {"a": "b"}}}, answer=False) == {}
    with pytest.raises(AlreadyExists):
        client.create(kube.PODS, "ns", pod(), answer=False)
    created, patched, _ = api.requests()
    assert created.json() == pod()
    assert patched.json() == {"metadata": {"labels": {"a": "b"}}}


def test_a_server_address_with_a_path_keeps_it_in_every_request(api: FakeApi, clock: RecordingClock) -> None:
    """An API server behind a proxy that serves it under a path (a cluster manager's proxy URL)."""
    configuration = api.configuration()
    configuration.host = api.url + "/k8s/clusters/c-1/"
    proxied = KubeClient(kubernetes.client.ApiClient(configuration), qps=0, burst=0, clock=clock)
    api.script("GET", "/k8s/clusters/c-1" + POD_PATH, Reply(200, pod()))
    api.script("POST", "/k8s/clusters/c-1/api/v1/namespaces/ns/pods", Reply(201, pod()))
    assert proxied.get(kube.PODS, "ns", "p") == pod()
    proxied.close()
    assert proxied.create(kube.PODS, "ns", pod()) == pod()
    assert [(sent.method, sent.path) for sent in api.requests()] == [
        ("GET", "/k8s/clusters/c-1" + POD_PATH),
        ("POST", "/k8s/clusters/c-1/api/v1/namespaces/ns/pods"),
    ]


def test_requests_through_a_proxy_go_to_the_proxy(api: FakeApi, clock: RecordingClock) -> None:
    """A kubeconfig's proxy-url: the official client's proxy manager carries every request."""
    configuration = api.configuration()
    configuration.host = "http://api-server.invalid:6443"
    configuration.proxy = api.url
    proxied = KubeClient(kubernetes.client.ApiClient(configuration), qps=0, burst=0, clock=clock)
    api.script("GET", POD_PATH, Reply(200, pod()))
    assert proxied.get(kube.PODS, "ns", "p") == pod()
    (sent,) = api.requests("GET", POD_PATH)
    assert sent.headers["Host"] == "api-server.invalid:6443"


def test_429_is_retried_and_retry_after_honoured(
    api: FakeApi, client: KubeClient, clock: RecordingClock, metrics: CountingMetrics
) -> None:
    api.script(
        "GET", POD_PATH, Reply(429, status(429, "TooManyRequests"), {"Retry-After": "3"}), Reply(200, pod())
    )
    assert client.get(kube.PODS, "ns", "p") == pod()
    assert len(api.requests()) == 2
    assert clock.sleeps == [3.0]
    assert [code for code, _, _ in metrics.calls] == ["429", "200"]


def test_503_is_retried(
    api: FakeApi, client: KubeClient, clock: RecordingClock, metrics: CountingMetrics
) -> None:
    api.script(
        "GET",
        POD_PATH,
        Reply(503, status(503, "ServiceUnavailable")),
        Reply(503, b"upstream"),
        Reply(200, pod()),
    )
    assert client.get(kube.PODS, "ns", "p") == pod()
    assert [code for code, _, _ in metrics.calls] == ["503", "503", "200"]
    assert len(clock.sleeps) == 2
    # Jittered exponential: the second wait is drawn from a range twice as far out as the first.
    assert 0.01 <= clock.sleeps[0] < 0.02
    assert 0.02 <= clock.sleeps[1] < 0.04


def test_retries_stop_after_max_attempts(
    api: FakeApi, clock: RecordingClock, metrics: CountingMetrics
) -> None:
    client = KubeClient(api.api_client(), 0, 0, metrics, clock, max_attempts=3, backoff_initial=0.01)
    api.default("GET", POD_PATH, Reply(500, status(500, "InternalError")))
    with pytest.raises(ServerError):
        client.get(kube.PODS, "ns", "p")
    assert len(api.requests()) == 3
    assert len(clock.sleeps) == 2


def test_retries_stop_after_max_elapsed(api: FakeApi, clock: RecordingClock) -> None:
    client = KubeClient(api.api_client(), 0, 0, None, clock, max_attempts=10, max_elapsed=5.0)
    api.default("GET", POD_PATH, Reply(429, status(429, "TooManyRequests"), {"Retry-After": "3"}))
    with pytest.raises(TooManyRequests) as raised:
        client.get(kube.PODS, "ns", "p")
    assert raised.value.retry_after == 3.0
    assert len(api.requests()) == 2


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (Reply(422, status(422, "Invalid", "spec.x: Required value")), Invalid),
        (Reply(404, status(404, "NotFound")), NotFound),
        (Reply(409, status(409, "AlreadyExists")), AlreadyExists),
        (Reply(409, status(409, "Conflict", "the object has been modified")), Conflict),
    ],
)
def test_client_errors_are_not_retried(
    api: FakeApi, client: KubeClient, metrics: CountingMetrics, answer: Reply, expected: type[Exception]
) -> None:
    api.default("POST", "/api/v1/namespaces/ns/pods", answer)
    with pytest.raises(expected) as raised:
        client.create(kube.PODS, "ns", pod())
    assert type(raised.value) is expected
    assert len(api.requests()) == 1
    assert metrics.calls == [(str(answer.status), "POST", client.host)]


def test_dropped_connection_is_retried_then_raised(
    api: FakeApi, clock: RecordingClock, metrics: CountingMetrics
) -> None:
    client = KubeClient(api.api_client(), 0, 0, metrics, clock, max_attempts=3, backoff_initial=0.01)
    api.default("GET", POD_PATH, Drop())
    with pytest.raises(TransportError):
        client.get(kube.PODS, "ns", "p")
    assert len(api.requests()) == 3
    assert metrics.calls == [("<error>", "GET", client.host)] * 3


def test_dropped_connection_then_success(api: FakeApi, client: KubeClient, metrics: CountingMetrics) -> None:
    api.script("GET", POD_PATH, Drop(), Reply(200, pod()))
    assert client.get(kube.PODS, "ns", "p") == pod()
    assert [code for code, _, _ in metrics.calls] == ["<error>", "200"]


def test_connection_refused_is_a_transport_error(clock: RecordingClock) -> None:
    with running() as api:
        configuration = api.configuration()
    client = KubeClient(kubernetes.client.ApiClient(configuration), 0, 0, None, clock, max_attempts=2)
    with pytest.raises(TransportError):
        client.get(kube.PODS, "ns", "p")


def test_read_timeout_is_a_transport_error(api: FakeApi, clock: RecordingClock) -> None:
    client = KubeClient(api.api_client(), 0, 0, None, clock, max_attempts=1, timeout=0.2)
    api.script("GET", "/api/v1/pods", Stream(stall=True))
    with pytest.raises(TransportError):
        client.request("GET", "/api/v1/pods")


def test_qps_limit_paces_requests(api: FakeApi, clock: RecordingClock) -> None:
    client = KubeClient(api.api_client(), qps=2.0, burst=2, clock=clock)
    api.default("GET", POD_PATH, Reply(200, pod()))
    for _ in range(5):
        client.get(kube.PODS, "ns", "p")
    # The burst of two goes out at once, then one request every 1/qps seconds.
    assert clock.sleeps == [0.5, 0.5, 0.5]


def test_qps_zero_disables_limiting(api: FakeApi, client: KubeClient, clock: RecordingClock) -> None:
    api.default("GET", POD_PATH, Reply(200, pod()))
    for _ in range(20):
        client.get(kube.PODS, "ns", "p")
    assert clock.sleeps == []


def test_delete_sends_preconditions(api: FakeApi, client: KubeClient) -> None:
    api.script("DELETE", POD_PATH, Reply(200, pod()), Reply(200, None))
    assert (
        client.delete(kube.PODS, "ns", "p", uid="u-1", resource_version="7", grace_period_seconds=0) == pod()
    )
    assert client.delete(kube.PODS, "ns", "p", propagation="Foreground") is None
    first, second = api.requests("DELETE")
    assert first.json() == {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "propagationPolicy": "Background",
        "gracePeriodSeconds": 0,
        "preconditions": {"uid": "u-1", "resourceVersion": "7"},
    }
    assert second.json() == {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}


def test_delete_precondition_failure_is_a_conflict(api: FakeApi, client: KubeClient) -> None:
    api.script(
        "DELETE", POD_PATH, Reply(409, status(409, "Conflict", "Precondition failed: UID in precondition"))
    )
    with pytest.raises(Conflict):
        client.delete(kube.PODS, "ns", "p", uid="old")


@pytest.mark.parametrize(
    ("patch_type", "body", "content_type"),
    [
        ("merge", {"metadata": {"labels": {"a": "b"}}}, "application/merge-patch+json"),
        ("json", [{"op": "add", "path": "/metadata/labels/a", "value": "b"}], "application/json-patch+json"),
        ("strategic", {"metadata": {"labels": {"a": "b"}}}, "application/strategic-merge-patch+json"),
    ],
)
def test_patch_content_types(
    api: FakeApi, client: KubeClient, patch_type: PatchType, body: Any, content_type: str
) -> None:
    api.script("PATCH", POD_PATH, Reply(200, pod()))
    client.patch(kube.PODS, "ns", "p", body, patch_type=patch_type)
    (sent,) = api.requests("PATCH")
    assert sent.headers["Content-Type"] == content_type
    assert sent.json() == body
    assert sent.query == {}


def test_apply_patch_sends_field_manager_and_force(api: FakeApi, client: KubeClient) -> None:
    path = "/apis/ml.example.com/v1/namespaces/ns/trainingjobs/j/status"
    api.script("PATCH", path, Reply(200, {"kind": "TrainingJob"}))
    client.patch(
        kube.TRAININGJOBS,
        "ns",
        "j",
        {"status": {}},
        patch_type="apply",
        subresource="status",
        field_manager="trainingjob-operator",
    )
    (sent,) = api.requests("PATCH")
    assert sent.headers["Content-Type"] == "application/apply-patch+yaml"
    assert sent.query == {"fieldManager": "trainingjob-operator", "force": "true"}
    assert sent.json() == {"status": {}}


def test_apply_patch_needs_a_field_manager(client: KubeClient) -> None:
    with pytest.raises(ValueError, match="field manager"):
        client.patch(kube.PODS, "ns", "p", {}, patch_type="apply")


def test_json_patch_needs_a_list(client: KubeClient) -> None:
    with pytest.raises(ValueError, match="list of operations"):
        client.patch(kube.PODS, "ns", "p", {"op": "add"}, patch_type="json")
