"""EventRecorder against a scripted API server: Event shape, repeats folded into counts, bounded queue."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controller.planner.texts import objects_listed
from controller.runtime.client import KubeClient
from controller.runtime.clock import FakeClock
from controller.runtime.events import COMBINED_PREFIX, EventRecorder, truncate_message
from tests.unit.fakeapi import FakeApi, Recorded, Reply, running, status

DEADLINE_SECONDS = 10.0
EVENTS_PATH = "/api/v1/namespaces/ml/events"
NAME = re.compile(r"^bert\.[0-9a-f]{16}$")

JOB: dict[str, Any] = {
    "apiVersion": "ml.example.com/v1",
    "kind": "TrainingJob",
    "metadata": {
        "name": "bert",
        "namespace": "ml",
        "uid": "0b1c6a5e-1111-2222-3333-444455556666",
        "resourceVersion": "4711",
        "labels": {"team": "nlp"},
    },
    "spec": {"numWorkers": 2},
}


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as server:
        server.default("POST", EVENTS_PATH, Reply(201, {}))
        yield server


@pytest.fixture
def client(api: FakeApi) -> KubeClient:
    return KubeClient(api.api_client(), qps=0, burst=0, max_attempts=1)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def recorder(client: KubeClient, clock: FakeClock) -> Iterator[EventRecorder]:
    events = EventRecorder(client, component="trainingjob-operator", host="operator-0", clock=clock)
    yield events
    assert events.stop(DEADLINE_SECONDS)


def posts(api: FakeApi, count: int, path: str = EVENTS_PATH) -> list[Recorded]:
    return api.wait_for_requests(count, "POST", path, timeout=DEADLINE_SECONDS)


def patches(api: FakeApi, count: int, name: str) -> list[Recorded]:
    return api.wait_for_requests(count, "PATCH", f"{EVENTS_PATH}/{name}", timeout=DEADLINE_SECONDS)


def flushed(recorder: EventRecorder) -> None:
    assert recorder.flush(DEADLINE_SECONDS), "the recorder did not drain its queue in time"


def test_creates_an_event_with_the_full_shape(api: FakeApi, recorder: EventRecorder) -> None:
    recorder.record(JOB, "Normal", "PodsCreated", "Created 2 worker pods")
    (request,) = posts(api, 1)
    body = request.json()
    assert NAME.match(body["metadata"]["name"]), body["metadata"]["name"]
    assert body == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": body["metadata"]["name"], "namespace": "ml"},
        "involvedObject": {
            "apiVersion": "ml.example.com/v1",
            "kind": "TrainingJob",
            "name": "bert",
            "namespace": "ml",
            "uid": "0b1c6a5e-1111-2222-3333-444455556666",
            "resourceVersion": "4711",
        },
        "reason": "PodsCreated",
        "message": "Created 2 worker pods",
        "type": "Normal",
        "source": {"component": "trainingjob-operator", "host": "operator-0"},
        "reportingComponent": "trainingjob-operator",
        "reportingInstance": "operator-0",
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "count": 1,
    }
    assert request.headers["Content-Type"] == "application/json"


def test_a_repeat_patches_count_and_last_timestamp(
    api: FakeApi, recorder: EventRecorder, clock: FakeClock
) -> None:
    recorder.record(JOB, "Warning", "BackOff", "Restarting workers in 10s")
    name = posts(api, 1)[0].json()["metadata"]["name"]
    api.default("PATCH", f"{EVENTS_PATH}/{name}", Reply(200, {}))

    clock.advance(30)
    recorder.record(JOB, "Warning", "BackOff", "Restarting workers in 10s")
    (patch,) = patches(api, 1, name)
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    assert patch.json() == {
        "count": 2,
        "lastTimestamp": "2026-01-01T00:00:30Z",
        "message": "Restarting workers in 10s",
    }

    clock.advance(570)  # 10 minutes after the first, but only 9.5 after the previous occurrence
    recorder.record(JOB, "Warning", "BackOff", "Restarting workers in 10s")
    assert patches(api, 2, name)[1].json()["count"] == 3
    flushed(recorder)
    assert len(api.requests("POST")) == 1


def test_a_different_message_or_reason_or_type_creates_a_new_event(
    api: FakeApi, recorder: EventRecorder
) -> None:
    recorder.record(JOB, "Normal", "Running", "All 2 workers are running")
    recorder.record(JOB, "Normal", "Running", "All 4 workers are running")
    recorder.record(JOB, "Normal", "Scaled", "All 4 workers are running")
    recorder.record(JOB, "Warning", "Scaled", "All 4 workers are running")
    requests = posts(api, 4)
    names = [request.json()["metadata"]["name"] for request in requests]
    assert len(set(names)) == 4  # unique even though the fake clock did not move
    assert all(NAME.match(name) for name in names)
    flushed(recorder)
    assert api.requests("PATCH") == []


def test_a_repeat_after_the_window_creates_a_new_event(
    api: FakeApi, recorder: EventRecorder, clock: FakeClock
) -> None:
    recorder.record(JOB, "Normal", "Checkpoint", "Saved checkpoint")
    first = posts(api, 1)[0].json()
    clock.advance(601)
    recorder.record(JOB, "Normal", "Checkpoint", "Saved checkpoint")
    second = posts(api, 2)[1].json()
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert second["count"] == 1
    assert second["firstTimestamp"] == "2026-01-01T00:10:01Z"
    flushed(recorder)
    assert api.requests("PATCH") == []


def test_a_vanished_event_is_created_again(api: FakeApi, recorder: EventRecorder, clock: FakeClock) -> None:
    recorder.record(JOB, "Warning", "Stalled", "No progress for 600s")
    name = posts(api, 1)[0].json()["metadata"]["name"]
    # No PATCH script: the fake answers 404, as for an Event that expired or was deleted.
    clock.advance(60)
    recorder.record(JOB, "Warning", "Stalled", "No progress for 600s")
    patches(api, 1, name)
    recreated = posts(api, 2)[1].json()
    assert recreated["metadata"]["name"] == name
    assert recreated["count"] == 2
    assert recreated["firstTimestamp"] == "2026-01-01T00:00:00Z"
    assert recreated["lastTimestamp"] == "2026-01-01T00:01:00Z"

    api.default("PATCH", f"{EVENTS_PATH}/{name}", Reply(200, {}))
    recorder.record(JOB, "Warning", "Stalled", "No progress for 600s")
    assert patches(api, 2, name)[1].json()["count"] == 3


def test_many_different_messages_fold_into_one_combined_event(
    api: FakeApi, client: KubeClient, clock: FakeClock
) -> None:
    recorder = EventRecorder(
        client, component="trainingjob-operator", host="operator-0", clock=clock, max_similar=3
    )
    try:
        for index in range(3):
            recorder.record(JOB, "Normal", "Waiting", f"Waiting for {3 - index} pods")
        combined = posts(api, 3)[2].json()
        assert combined["message"] == COMBINED_PREFIX + "Waiting for 1 pods"
        api.default("PATCH", f"{EVENTS_PATH}/{combined['metadata']['name']}", Reply(200, {}))
        recorder.record(JOB, "Normal", "Waiting", "Waiting for 0 pods")
        patch = patches(api, 1, combined["metadata"]["name"])[0].json()
        assert patch["count"] == 2
        assert patch["message"] == COMBINED_PREFIX + "Waiting for 0 pods"
        flushed(recorder)
        assert len(api.requests("POST")) == 3
    finally:
        assert recorder.stop(DEADLINE_SECONDS)


def test_a_full_queue_drops_without_blocking(
    api: FakeApi, client: KubeClient, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    drops: list[int] = []
    recorder = EventRecorder(
        client,
        component="trainingjob-operator",
        host="operator-0",
        clock=clock,
        max_queue=3,
        on_drop=lambda: drops.append(1),
        start=False,
    )
    finished = threading.Event()

    def flood() -> None:
        for index in range(10):
            recorder.record(JOB, "Normal", "Progress", f"epoch {index}")
        finished.set()

    with caplog.at_level(logging.WARNING, logger="controller.runtime.events"):
        threading.Thread(target=flood, daemon=True).start()
        assert finished.wait(DEADLINE_SECONDS), "record() blocked on a full queue"
    assert recorder.dropped == 7
    assert len(drops) == 7
    warnings = [r for r in caplog.records if "event queue is full" in r.getMessage()]
    assert len(warnings) == 1  # once per burst, not once per event

    recorder.start()
    assert recorder.stop(DEADLINE_SECONDS)
    messages = [request.json()["message"] for request in api.requests("POST")]
    assert messages == ["epoch 0", "epoch 1", "epoch 2"]


def test_stop_drains_the_queue_then_refuses_new_events(api: FakeApi, client: KubeClient) -> None:
    recorder = EventRecorder(
        client, component="trainingjob-operator", host="operator-0", clock=FakeClock(), start=False
    )
    for index in range(5):
        recorder.record(JOB, "Normal", "Progress", f"epoch {index}")
    recorder.start()
    assert recorder.stop(DEADLINE_SECONDS)
    assert len(api.requests("POST")) == 5
    recorder.record(JOB, "Normal", "Progress", "after stop")
    assert len(api.requests("POST")) == 5
    assert recorder.dropped == 0


def test_api_errors_drop_the_event_and_keep_going(api: FakeApi, recorder: EventRecorder) -> None:
    api.script("POST", EVENTS_PATH, Reply(403, status(403, "Forbidden", "events is forbidden")))
    recorder.record(JOB, "Normal", "First", "refused")
    recorder.record(JOB, "Normal", "Second", "accepted")
    requests = posts(api, 2)
    assert [request.json()["reason"] for request in requests] == ["First", "Second"]
    flushed(recorder)
    # The refused event was not remembered: its repeat is a create, not a patch of an Event that never was.
    recorder.record(JOB, "Normal", "First", "refused")
    assert posts(api, 3)[2].json()["count"] == 1


def test_record_never_raises(api: FakeApi, recorder: EventRecorder) -> None:
    recorder.record({"kind": "TrainingJob"}, "Normal", "NoMetadata", "x")
    recorder.record({"metadata": "garbage"}, "Normal", "BadMetadata", "x")
    recorder.record(JOB, "Info", "BadType", "x")  # type: ignore[arg-type]
    flushed(recorder)
    assert api.requests() == []


def test_long_messages_are_truncated_to_1024_bytes(api: FakeApi, recorder: EventRecorder) -> None:
    recorder.record(JOB, "Warning", "Failed", "é" * 2000)
    message = posts(api, 1)[0].json()["message"]
    assert message == "é" * 512
    assert len(message.encode()) == 1024
    assert truncate_message("a" * 1023 + "é") == "a" * 1023
    assert truncate_message("short") == "short"


def test_cluster_scoped_objects_get_events_in_default(api: FakeApi, recorder: EventRecorder) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1", "uid": "n-1"}}
    api.default("POST", "/api/v1/namespaces/default/events", Reply(201, {}))
    recorder.record(node, "Warning", "GPUUnhealthy", "GPU 3 fell off the bus")
    body = posts(api, 1, "/api/v1/namespaces/default/events")[0].json()
    assert body["metadata"]["namespace"] == "default"
    assert "namespace" not in body["involvedObject"]
    assert body["involvedObject"]["kind"] == "Node"


def test_the_server_assigned_name_is_used_for_repeats(
    api: FakeApi, recorder: EventRecorder, clock: FakeClock
) -> None:
    api.script("POST", EVENTS_PATH, Reply(201, {"metadata": {"name": "bert.server-name"}}))
    api.default("PATCH", f"{EVENTS_PATH}/bert.server-name", Reply(200, {}))
    recorder.record(JOB, "Normal", "Started", "Job started")
    posts(api, 1)
    clock.advance(1)
    recorder.record(JOB, "Normal", "Started", "Job started")
    assert patches(api, 1, "bert.server-name")[0].json()["count"] == 2


class RecordingSink:
    """An in-memory EventSink that records which thread wrote what, for the multi-writer tests."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, str, dict[str, Any]]] = []
        self.names: dict[str, str] = {}

    def create(self, res: Any, ns: str | None, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.calls.append(
                ("create", threading.current_thread().name, body["involvedObject"]["name"], body)
            )
        return body

    def patch(self, res: Any, ns: str | None, name: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        with self.lock:
            involved = name.split(".", maxsplit=1)[0]
            self.calls.append(("patch", threading.current_thread().name, involved, body))
        return {"metadata": {"name": name}}


def job_named(name: str) -> dict[str, Any]:
    return {**JOB, "metadata": {**JOB["metadata"], "name": name, "uid": f"uid-{name}"}}


def test_several_writers_keep_each_objects_events_on_one_thread_and_aggregated(clock: FakeClock) -> None:
    sink = RecordingSink()
    recorder = EventRecorder(
        sink, component="trainingjob-operator", host="operator-0", clock=clock, writers=3
    )
    jobs = [job_named(f"job{index}") for index in range(8)]
    for _ in range(3):
        for job in jobs:
            recorder.record(job, "Normal", "Created", "created pod")
    assert recorder.flush(DEADLINE_SECONDS)
    assert recorder.stop(DEADLINE_SECONDS)
    threads_used = {thread for _, thread, _, _ in sink.calls}
    assert len(threads_used) > 1
    for job in jobs:
        name = job["metadata"]["name"]
        mine = [call for call in sink.calls if call[2] == name]
        assert [kind for kind, _, _, _ in mine] == ["create", "patch", "patch"]
        assert len({thread for _, thread, _, _ in mine}) == 1
        assert mine[-1][3]["count"] == 3


class GatedSink(RecordingSink):
    """Blocks every create until the test opens the gate; `entered` is set when a create is waiting."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def create(self, res: Any, ns: str | None, body: dict[str, Any]) -> dict[str, Any]:
        self.entered.set()
        assert self.gate.wait(DEADLINE_SECONDS)
        return super().create(res, ns, body)


def test_a_burst_of_drops_warns_once_until_the_queue_has_half_drained(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    sink = GatedSink()
    recorder = EventRecorder(
        sink, component="trainingjob-operator", host="operator-0", clock=clock, max_queue=4, start=False
    )
    with caplog.at_level(logging.WARNING, logger="controller.runtime.events"):
        for index in range(5):  # four queued, the fifth dropped: the burst starts
            recorder.record(job_named(f"a{index}"), "Normal", "Created", "x")
        recorder.start()
        assert sink.entered.wait(DEADLINE_SECONDS)  # the writer took one: three queued
        recorder.record(job_named("b0"), "Normal", "Created", "x")  # fits, but the queue is not half empty
        recorder.record(job_named("b1"), "Normal", "Created", "x")  # dropped: still the same burst
    warnings = [r for r in caplog.records if "event queue is full" in r.getMessage()]
    assert len(warnings) == 1
    assert recorder.dropped == 2
    sink.gate.set()
    assert recorder.stop(DEADLINE_SECONDS)
    assert len([call for call in sink.calls if call[0] == "create"]) == 5


def test_the_objects_of_one_reconcile_are_listed_in_one_event_message() -> None:
    created = [("Pod", "a-worker-1"), ("Service", "a-master"), ("ConfigMap", "a-config")]
    created += [("Service", "a-headless"), ("Pod", "a-worker-0")]
    assert objects_listed(created) == (
        "configmap: a-config; services: a-headless, a-master; pods: a-worker-0, a-worker-1"
    )
    gang = [("Pod", f"b-worker-{index}") for index in reversed(range(100))]
    listed = objects_listed(gang)
    assert listed.startswith("pods: b-worker-0, b-worker-1, ")
    assert listed.endswith("b-worker-6, ... b-worker-99 (100)")
