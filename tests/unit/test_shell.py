"""The reconciler and the manager in process (tests/unit/shell_scene.py): the order of their writes, what
they do with refused creates and failed calls, and the manager's wiring of the delete handler to the
reconciler. Each test reads the requests the fake API server received, in order."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from controller.planner.supporting import desired_objects
from controller.planner.texts import MESSAGE_LIMIT
from controller.resources import PODS
from controller.runtime.errors import Conflict, ServerError
from controller.runtime.events import MESSAGE_LIMIT_BYTES
from crd import contract
from crd.spec import parse
from tests.unit.fakeapi import FakeApi, Reply, Stream, event, items_list, running, status
from tests.unit.lifecycle_world import NAMESPACE, make_job, world
from tests.unit.shell_scene import JOB_PATH, PODS_PATH, Scene, manager_for, stored

DEADLINE_SECONDS = 10.0
SERVICES = f"/api/v1/namespaces/{NAMESPACE}/services"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
ACCOUNTS = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts"
BINDINGS = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NAMESPACE}/rolebindings"
W0, W1 = f"{PODS_PATH}/mnist-worker-0", f"{PODS_PATH}/mnist-worker-1"
FORBIDDEN = 'pods "mnist-worker-0" is forbidden: exceeded quota: gpus'


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as fake:
        yield fake


def refusal(code: int, reason: str, message: str) -> Reply:
    return Reply(code, status(code, reason, message))


def created() -> Reply:
    return Reply(201, {})


def expected(scene: Scene, *writes: str) -> list[tuple[str, str]]:
    """Writes by name: "status" (the job's status PATCH) or "pod" (a pod POST)."""
    requests = {"status": ("PATCH", scene.status_path), "pod": ("POST", PODS_PATH)}
    return [requests[write] for write in writes]


def condition(status_: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(entry for entry in status_["conditions"] if entry["type"] == type_)


# ------------------------------------------------------------------------------------ write order


def test_status_comes_first_then_the_shared_objects_then_the_pods_and_services_last(
    api: FakeApi,
) -> None:
    scene = Scene(api, make_job(), executor=ThreadPoolExecutor(8))
    for path in (SERVICES, CONFIGMAPS, ACCOUNTS, BINDINGS, PODS_PATH):
        scene.always("POST", path, created())

    result, actions = scene.reconcile()

    assert actions[0] == ("PATCH", scene.status_path)
    posted = [path for method, path in actions[1:] if method == "POST"]
    everything = [CONFIGMAPS, ACCOUNTS, BINDINGS, SERVICES, SERVICES, PODS_PATH, PODS_PATH]
    assert sorted(posted) == sorted(everything)
    # The shared objects go together (the RoleBinding binds a ClusterRole that exists already), the pods
    # after them, and the Services after the pods (so their endpoints are written once, with the pods).
    assert sorted(posted[:3]) == sorted([CONFIGMAPS, ACCOUNTS, BINDINGS])
    assert posted[3:] == [PODS_PATH, PODS_PATH, SERVICES, SERVICES]
    assert len(actions) == 8
    assert not result.rate_limited


def test_a_blocked_job_tries_its_objects_first_and_writes_status_only_when_the_outcome_changes(
    api: FakeApi,
) -> None:
    scene = Scene(api, make_job()).with_supporting_objects()
    scene.answer("POST", PODS_PATH, *[refusal(403, "Forbidden", FORBIDDEN)] * 3)

    first, actions = scene.reconcile()
    # Nothing said the job was blocked: both pods are tried at once, and both are refused.
    assert actions == expected(scene, "status", "pod", "pod", "status")
    assert first.rate_limited
    blocked = scene.status()
    assert (condition(blocked, "Created")["status"], condition(blocked, "Created")["reason"]) == (
        "False",
        "FailedCreate",
    )
    assert FORBIDDEN in blocked["message"]
    assert blocked["state"] == "Pending"
    assert scene.expectations.satisfied(scene.key)

    scene.deliver_status()
    again, actions = scene.reconcile()
    # Blocked now: the first pod is refused for a reason every pod shares, so the second is not tried
    # (slow start), and the same refusal has nothing to write.
    assert actions == expected(scene, "pod")
    assert again.rate_limited

    other = "pods is forbidden: the namespace is being terminated"
    scene.answer("POST", PODS_PATH, refusal(403, "Forbidden", other))
    _, actions = scene.reconcile()
    assert actions == expected(scene, "pod", "status")
    assert other in scene.status()["message"]

    scene.deliver_status()
    scene.answer("POST", PODS_PATH, created(), created())
    unblocked, actions = scene.reconcile()
    assert actions == expected(scene, "pod", "pod", "status")
    assert not unblocked.rate_limited
    assert condition(scene.status(), "Created")["reason"] == "Creating"


def test_a_job_nothing_blocks_sends_its_first_batch_as_large_as_the_create_pool(api: FakeApi) -> None:
    scene = Scene(api, make_job(workers=8), pool_size=4).with_supporting_objects()
    quota = "exceeded quota: pods"
    scene.answer("POST", PODS_PATH, refusal(403, "Forbidden", quota), *[created()] * 3)

    result, actions = scene.reconcile()

    # One batch of four (the pool's size), all tried although the first is refused; the refusal holds
    # for every pod, so the second batch is not sent.
    assert actions == expected(scene, "status", *["pod"] * 4, "status")
    assert result.rate_limited


def test_pods_are_created_in_doubling_batches_until_one_is_refused(api: FakeApi) -> None:
    # A pool of one: batches of 1, 2, 4, ... as for a blocked job (slow start).
    scene = Scene(api, make_job(workers=8), pool_size=1).with_supporting_objects()
    quota = "exceeded quota: pods"
    scene.answer(
        "POST", PODS_PATH, *[created()] * 3, created(), refusal(403, "Forbidden", quota), created(), created()
    )

    result, actions = scene.reconcile()

    # Batches of 1, 2 and 4: the third has a refusal, so the last pod is not tried.
    assert actions == expected(scene, "status", *["pod"] * 7, "status")
    assert result.rate_limited
    pending = scene.expectations.pending(scene.key)
    assert pending is not None
    assert len(pending.creates) == 6  # the created pods, until the cache shows them
    assert "mnist-worker-7" not in pending.creates


def test_an_existing_pod_of_the_job_counts_as_created(api: FakeApi) -> None:
    scene = Scene(api, make_job()).with_supporting_objects()
    ours = {
        "metadata": {"name": "mnist-worker-0", "ownerReferences": [{"uid": scene.job["metadata"]["uid"]}]}
    }
    scene.answer("POST", PODS_PATH, refusal(409, "AlreadyExists", "exists"), created())
    scene.answer("GET", W0, Reply(200, ours))

    result, actions = scene.reconcile()

    assert actions == expected(scene, "status", "pod", "pod")
    assert not result.rate_limited
    assert condition(scene.status(), "Created")["reason"] == "Creating"


def test_an_existing_pod_of_someone_else_blocks_the_job(api: FakeApi) -> None:
    scene = Scene(api, make_job()).with_supporting_objects()
    scene.answer("POST", PODS_PATH, refusal(409, "AlreadyExists", "exists"), created())
    scene.answer("GET", W0, Reply(200, {"metadata": {"name": "mnist-worker-0"}}))

    result, actions = scene.reconcile()

    assert actions == expected(scene, "status", "pod", "pod", "status")
    assert result.rate_limited
    assert (
        scene.status()["message"] == "Pod mnist-worker-0 already exists and is not owned by this TrainingJob"
    )


# ---------------------------------------------------------------------------------- refused objects


@pytest.mark.parametrize(
    ("code", "reason"), [(400, "BadRequest"), (413, "RequestEntityTooLarge"), (422, "Invalid")]
)
def test_an_object_the_api_server_refuses_fails_the_job_in_one_status_write(
    api: FakeApi, code: int, reason: str
) -> None:
    message = 'Pod in version "v1" cannot be handled as a Pod: json: cannot unmarshal string into affinity'
    scene = Scene(api, make_job({"spec.ttlSecondsAfterFinished": 600})).with_supporting_objects()
    scene.always("POST", PODS_PATH, refusal(code, reason, message))

    result, actions = scene.reconcile()

    assert actions == expected(scene, "status", "pod", "pod", "status")
    failed = scene.status()
    assert failed["state"] == "Failed"
    assert failed["failureReason"] == "InvalidSpec"
    assert failed["message"] == f"invalid spec: Pod mnist-worker-0: {message}"
    assert (condition(failed, "Failed")["status"], condition(failed, "Failed")["reason"]) == (
        "True",
        "InvalidSpec",
    )
    assert (condition(failed, "Running")["status"], condition(failed, "Running")["reason"]) == (
        "False",
        "InvalidSpec",
    )
    # Finished like any failed job: completion time and duration, the workers column, the deadline
    # clock stopped; the start the first write recorded stays.
    assert failed["completionTime"]
    assert failed["startTime"]
    assert failed["duration"] == "0s"
    assert failed["workers"] == {"pending": 0, "active": 0, "succeeded": 0, "failed": 0}
    assert "runningSince" not in failed
    assert not result.rate_limited
    assert result.requeue_after == pytest.approx(600, abs=1)  # ttlSecondsAfterFinished
    reasons = [body["reason"] for body in scene.recorded_events()]
    assert reasons.count("FailedCreate") == 2  # one per refused pod (both went in the first batch)
    assert "InvalidSpec" in reasons
    assert scene.metrics.invalid_spec.labels(namespace=NAMESPACE)._value.get() == 1

    scene.deliver_status()
    _, actions = scene.reconcile()
    assert actions == []  # failed for good: no retry, no write


def test_a_huge_api_error_is_cut_to_fit_status_and_events(api: FakeApi) -> None:
    unknown = "x" * 40_000
    message = f'Pod "mnist-worker-0" is invalid: spec.affinity.{unknown}: Unsupported value'
    scene = Scene(api, make_job()).with_supporting_objects()
    scene.always("POST", PODS_PATH, refusal(422, "Invalid", message))

    scene.reconcile()

    failed = scene.status()
    assert failed["state"] == "Failed"
    assert len(failed["message"]) <= MESSAGE_LIMIT
    assert failed["message"].endswith("...")
    assert all(len(entry["message"]) <= MESSAGE_LIMIT for entry in failed["conditions"])
    events = scene.recorded_events()
    assert events
    assert all(len(body["message"].encode()) <= MESSAGE_LIMIT_BYTES for body in events)
    assert any(body["message"].endswith("...") for body in events if body["reason"] == "FailedCreate")


# ------------------------------------------------------------------------------------ failed calls


def test_expectations_are_lowered_when_a_pod_create_fails(api: FakeApi) -> None:
    scene = Scene(api, make_job()).with_supporting_objects()
    scene.always("POST", PODS_PATH, refusal(500, "InternalError", "etcd timeout"))

    with pytest.raises(ServerError):
        scene.reconcile()

    assert scene.expectations.satisfied(scene.key)
    assert scene.expectations.pending(scene.key) is None


def test_expectations_are_lowered_when_a_pod_delete_fails(api: FakeApi) -> None:
    running_job = world()
    running_job.run_to_running()
    running_job.update_spec(suspend=True)
    scene = Scene(api, running_job.job).with_supporting_objects()
    for pod in running_job.pods.values():
        scene.caches.pods.add(pod)
    scene.always("DELETE", W0, refusal(500, "InternalError", "etcd timeout"))
    scene.always("DELETE", W1, Reply(200, {}))

    with pytest.raises(ServerError):
        scene.reconcile()

    writes = [(request.method, request.path) for request in api.requests() if request.method != "GET"]
    assert writes == [("PATCH", scene.status_path), ("DELETE", W0), ("DELETE", W1)]
    # The delete that went through waits for the cache to show it; the failed one is not waited for.
    pending = scene.expectations.pending(scene.key)
    assert pending is not None
    assert pending.deletes == {running_job.pod(1)["metadata"]["uid"]}


# ------------------------------------------------------------------------------------- the manager


def test_building_the_manager_talks_to_nothing(api: FakeApi) -> None:
    manager_for(api)
    assert api.requests() == []


def _release_of(request: Any, pod: dict[str, Any]) -> None:
    """`request` removes exactly the tracking finalizer of exactly `pod`."""
    assert request.json() == [
        {"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]},
        {"op": "test", "path": "/metadata/finalizers/0", "value": contract.TRACKING_FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]


def test_a_pod_preempted_and_deleted_before_the_reconcile_is_a_disruption_and_released_after(
    api: FakeApi,
) -> None:
    # The pod informer delivers rank 1 preempted and deleted (held by its tracking finalizer); the
    # manager's reconciler counts the disruption, writes it, and only then lets the pod go.
    scene = world({"spec.failurePolicy.backoffLimit": 0})
    scene.run_to_running()
    before = copy.deepcopy(list(scene.pods.values()))
    scene.disrupt(1, "PreemptionByScheduler")
    deleted = copy.deepcopy(scene.pod(1))
    manager = manager_for(api)
    job = dict(scene.job, metadata={**scene.job["metadata"], "resourceVersion": "7"})
    manager.watches.caches.jobs.add(job)
    for number, obj in enumerate(desired_objects(parse(job), None)):
        manager.watches.caches.owned[obj["kind"]].add(stored(obj, number))
    api.script(
        "GET",
        "/api/v1/pods",
        Reply(200, items_list(before, "10")),
        Stream((event("MODIFIED", deleted),), stall=True),
    )
    api.default("GET", "/api/v1/pods", Stream(stall=True))
    status_path = f"{JOB_PATH}/mnist/status"
    api.default("PATCH", status_path, Reply(200, {"metadata": {"resourceVersion": "8"}}))
    api.default("PATCH", W1, Reply(200, {}))
    api.default("DELETE", W0, Reply(200, {}))
    pods = next(informer for informer in manager.watches.informers if informer.resource == PODS)
    stop = threading.Event()
    thread = threading.Thread(target=pods.run, args=(stop,), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        cache = manager.watches.caches.pods
        while (
            not (cache.get(f"{NAMESPACE}/mnist-worker-1") or {}).get("metadata", {}).get("deletionTimestamp")
        ):
            assert time.monotonic() < deadline, "the pod informer did not deliver the deletion"
            time.sleep(0.01)
    finally:
        stop.set()
        pods.stop()
        thread.join(DEADLINE_SECONDS)

    manager.reconciler.reconcile(f"{NAMESPACE}/mnist")

    writes = [request for request in api.requests() if request.method in ("PATCH", "DELETE")]
    assert [(request.method, request.path) for request in writes] == [
        ("PATCH", status_path),
        ("PATCH", W1),
        ("DELETE", W0),
    ]
    written = writes[0].json()["status"]
    assert written["state"] == "Restarting"
    assert written["lastRestartReason"] == "PreemptionByScheduler"
    assert written["restarts"] == {"disruption": 1}
    _release_of(writes[1], deleted)


def test_no_pod_is_released_when_the_status_write_is_refused(api: FakeApi) -> None:
    finished = world()
    finished.run_to_running()
    finished.exit(1, 1)
    scene = Scene(api, finished.job).with_supporting_objects()
    for pod in finished.pods.values():
        scene.caches.pods.add(pod)
    scene.always("PATCH", scene.status_path, refusal(409, "Conflict", "the object has been modified"))

    with pytest.raises(Conflict):
        scene.reconcile()

    assert [request.method for request in api.requests() if request.method in ("PATCH", "DELETE")] == [
        "PATCH"
    ]


def test_an_unchanged_status_is_confirmed_before_pods_are_released(api: FakeApi) -> None:
    # The job was written Completed, then the operator stopped before it let its pods go. The status
    # is right as it is; but a cache behind another leader's last write must not release on it, so it
    # is confirmed (a PATCH of the resourceVersion precondition alone) before the releases.
    completed = world()
    completed.run_to_running()
    completed.succeed()
    completed.step()
    assert completed.state == "Completed"
    for pod in completed.pods.values():
        pod["metadata"]["finalizers"] = [contract.TRACKING_FINALIZER]
    scene = Scene(api, completed.job).with_supporting_objects()
    for pod in completed.pods.values():
        scene.caches.pods.add(pod)
    scene.always("PATCH", W0, Reply(200, {}))
    scene.always("PATCH", W1, Reply(200, {}))

    _, actions = scene.reconcile()

    assert actions == [("PATCH", scene.status_path), ("PATCH", W0), ("PATCH", W1)]
    (confirm,) = api.requests("PATCH", scene.status_path)
    assert confirm.json() == {"metadata": {"resourceVersion": "1"}}


def test_pods_of_a_deleted_job_are_released(api: FakeApi) -> None:
    gone = world()
    gone.run_to_running()
    scene = Scene(api, gone.job).with_supporting_objects()
    for pod in gone.pods.values():
        scene.caches.pods.add(pod)
    scene.caches.jobs.delete(scene.job)
    scene.always("PATCH", W0, Reply(200, {}))
    scene.always("PATCH", W1, Reply(200, {}))

    _, actions = scene.reconcile()

    assert actions == [("PATCH", W0), ("PATCH", W1)]
    for request, pod in zip(api.requests("PATCH"), (gone.pod(0), gone.pod(1)), strict=True):
        _release_of(request, pod)


def test_a_reconcile_waiting_for_the_cache_releases_none_of_the_jobs_pods(api: FakeApi) -> None:
    live = world()
    live.run_to_running()
    live.succeed(1)
    scene = Scene(api, live.job).with_supporting_objects()
    for pod in live.pods.values():
        scene.caches.pods.add(pod)
    scene.expectations.expect_creates(scene.key, ["mnist-worker-2"])

    _, actions = scene.reconcile()

    assert actions == []


def test_a_delete_we_expect_is_seen_when_the_cache_already_shows_the_pod_terminating(api: FakeApi) -> None:
    # An eviction deleted the pod first: its event came before our own delete raised the expectation,
    # and the tracking finalizer keeps the pod Terminating, so no later event may come.
    live = world(graceful=True)
    live.run_to_running()
    scene = Scene(api, live.job).with_supporting_objects()
    live.disrupt(1, "EvictionByEvictionAPI")
    for pod in live.pods.values():
        scene.caches.pods.add(pod)
    scene.expectations.expect_deletes(scene.key, [live.pod(1)["metadata"]["uid"]])
    scene.always("PATCH", W1, Reply(200, {}))
    scene.always("DELETE", W0, Reply(200, {}))

    _, actions = scene.reconcile()

    assert actions[0] == ("PATCH", scene.status_path)
