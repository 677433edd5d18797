"""The REST client against a scripted API server over real HTTP: retries, mapping, pacing, metrics, watch."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from controller import resources as kube
from controller.runtime import boundedjson
from controller.runtime.client import KubeClient, PatchType
from controller.runtime.clock import FakeClock, RealClock
from controller.runtime.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Gone,
    Invalid,
    NotFound,
    ServerError,
    TooManyRequests,
    TransportError,
)
from controller.runtime.resource import Resource
from tests.unit.fakeapi import Drop, FakeApi, Reply, Stream, event, running, status

DEADLINE_SECONDS = 10.0
POD_PATH = "/api/v1/namespaces/ns/pods/p"


class RecordingClock(FakeClock):
    """A fake clock that remembers every non-zero sleep (retry waits and rate-limit waits)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.sleeps.append(seconds)
        super().sleep(seconds)


class CountingMetrics:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []

    def request(self, code: str, method: str, host: str) -> None:
        self.calls.append((code, method, host))


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as server:
        yield server


@pytest.fixture
def clock() -> RecordingClock:
    return RecordingClock()


@pytest.fixture
def metrics() -> CountingMetrics:
    return CountingMetrics()


@pytest.fixture
def client(api: FakeApi, clock: RecordingClock, metrics: CountingMetrics) -> KubeClient:
    return KubeClient(api.api_client(), qps=0, burst=0, metrics=metrics, clock=clock, backoff_initial=0.01)


def pod(name: str = "p", rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv},
    }


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
