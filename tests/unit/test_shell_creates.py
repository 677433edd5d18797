"""The shell's creates as the API server and the informers see them: a job's Services after its pods,
expected like them, and no Event for an object that was there already.

In-process, against the fake API server (tests/unit/fakeapi.py), as tests/unit/test_shell.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from builders.shared import build_shared
from crd.spec import parse
from tests.unit.fakeapi import FakeApi, Reply, running, status
from tests.unit.lifecycle_world import NAMESPACE, make_job
from tests.unit.shell_scene import PODS_PATH, Scene, stored

SERVICES = f"/api/v1/namespaces/{NAMESPACE}/services"


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as fake:
        yield fake


def created() -> Reply:
    return Reply(201, {})


def with_shared_objects(scene: Scene) -> Scene:
    """The namespace's trainer ConfigMap and RBAC exist; the job's Services and pods do not."""
    for number, obj in enumerate(build_shared(parse(scene.job)), start=10):
        scene.caches.owned[obj["kind"]].add(stored(obj, number))
    return scene


def posted(scene: Scene, path: str) -> list[dict[str, Any]]:
    return [json.loads(request.body) for request in scene.api.requests("POST", path)]


def test_a_reconcile_the_pods_bring_waits_for_the_services_created_after_them(api: FakeApi) -> None:
    scene = with_shared_objects(Scene(api, make_job()))
    scene.always("POST", PODS_PATH, created())
    scene.always("POST", SERVICES, created())

    _, actions = scene.reconcile()
    assert [path for _, path in actions[1:]] == [PODS_PATH, PODS_PATH, SERVICES, SERVICES]

    # The pod informer delivers the pods before the Services' informer delivers them.
    for number, pod in enumerate(posted(scene, PODS_PATH), start=50):
        scene.caches.pods.add(stored(pod, number))
        assert scene.expectations.created(scene.key, str(pod["metadata"]["name"]))
    scene.deliver_status()
    waiting, actions = scene.reconcile()
    assert actions == []  # no second create of the Services the cache does not show yet
    assert waiting.requeue_after is not None

    for number, service in enumerate(posted(scene, SERVICES), start=60):
        scene.caches.owned["Service"].add(stored(service, number))
        assert scene.expectations.created(scene.key, str(service["metadata"]["name"]))
    _, actions = scene.reconcile()
    assert ("POST", SERVICES) not in actions
    assert len(api.requests("POST", SERVICES)) == 2


def test_a_refused_service_is_not_waited_for(api: FakeApi) -> None:
    scene = with_shared_objects(Scene(api, make_job()))
    scene.always("POST", PODS_PATH, created())
    quota = 'services "mnist-headless" is forbidden: exceeded quota: services'
    scene.answer("POST", SERVICES, Reply(403, status(403, "Forbidden", quota)), created())

    result, _ = scene.reconcile()

    assert result.rate_limited
    pending = scene.expectations.pending(scene.key)
    assert pending is not None
    assert pending.creates == {"mnist-worker-0", "mnist-worker-1", "mnist-master"}


def test_an_object_found_there_already_is_not_announced_as_created(api: FakeApi) -> None:
    scene = with_shared_objects(Scene(api, make_job()))
    scene.always("POST", PODS_PATH, created())
    scene.always("POST", SERVICES, created())
    ours = {
        "metadata": {"name": "mnist-headless", "ownerReferences": [{"uid": scene.job["metadata"]["uid"]}]}
    }
    scene.answer("POST", SERVICES, Reply(409, status(409, "AlreadyExists", "exists")), created())
    scene.answer("GET", f"{SERVICES}/mnist-headless", Reply(200, ours))

    result, _ = scene.reconcile()

    assert not result.rate_limited
    messages = [body["message"] for body in scene.recorded_events() if body["reason"] == "SuccessfulCreate"]
    assert messages == ["Created service: mnist-master; pods: mnist-worker-0, mnist-worker-1"]
