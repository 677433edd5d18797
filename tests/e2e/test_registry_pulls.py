"""A TrainingJob's image pulled from a registry with its imagePullSecrets, on the real node, and what
the job says when the pull fails (README, "Bad input and faults").

Why: the pull path is what users depend on (a private image, a registry over TLS, credentials from a
Secret) and every other test's image reaches the node another way. The local cluster's registry
(testbed/node/registry.py: the CNCF distribution project's, TLS from the cluster's CA, htpasswd)
serves an image pushed here; the node's containerd pulls it with the credentials the kubelet takes
from the pod's imagePullSecrets. A wrong Secret and a registry that is down each leave the workers
waiting in ImagePullBackOff, and the job's condition names the registry's own reason (401
Unauthorized; connection refused), so that whoever reads `kubectl describe trainingjob` knows what to
fix; a registry that comes back is pulled from at the kubelet's next attempt, with no restart of the
gang.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from testbed import REGISTRY, Image, Kubectl
from tests.cluster import SESSION
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import condition, job_manifest, pods_of, status_of, wait, wait_for_state
from tests.e2e.realnode import create_pull_secret, job_on_node

JsonDict = dict[str, Any]

pytestmark = pytest.mark.slow

SECRET = "registry-credentials"
# The kubelet's reasons for a container whose image cannot be pulled: the first failure, then its back-off.
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff")


def pushed(node_images: Callable[[str], Image]) -> str:
    """The base image (Debian's Python) pushed under a tag of this test's own, so that the node
    pulls it (an image the node holds already is not pulled again); its reference."""
    path_and_tag = f"team/trainer:{uuid.uuid4().hex[:8]}"
    REGISTRY.push(node_images("base"), path_and_tag)
    return REGISTRY.reference(path_and_tag)


def pulling_job(name: str, image: str) -> JsonDict:
    """One worker of `image` printing a line, with the pull Secret SECRET, on the real node."""
    manifest = job_manifest(
        name,
        numWorkers=1,
        image=image,
        command=["python3", "-c", "print('pulled and ran')"],
        podTemplate={"spec": {"imagePullSecrets": [{"name": SECRET}]}},
    )
    return job_on_node(manifest, memory="64Mi")


def waiting_on_the_pull(kubectl: Kubectl, namespace: str, name: str, because: str) -> JsonDict:
    """The job's status once its Running condition names a failed pull and `because`."""

    def stuck() -> JsonDict | None:
        status = status_of(kubectl, namespace, name)
        running = condition(status, "Running") or {}
        message = str(running.get("message") or "")
        return status if any(f in message for f in PULL_FAILURES) and because in message else None

    return wait(f"the job's condition to say the pull failed with {because!r}", stuck, timeout=180)


def test_a_job_pulls_its_private_image_with_its_pull_secret(
    registry: Kubectl, namespace: str, start_operator: StartOperator, node_images: Callable[[str], Image]
) -> None:
    start_operator()
    image = pushed(node_images)
    create_pull_secret(registry, namespace, SECRET)
    registry.apply(pulling_job("private", image), "-n", namespace)

    wait_for_state(registry, namespace, "private", "Completed", timeout=180)
    (pod,) = pods_of(registry, namespace, "private")
    (container,) = pod["status"]["containerStatuses"]
    digest, _ = REGISTRY.manifest(image)
    # A pulled image's ID is a repository digest at the registry it came from (containerd names an
    # image by the repository it first pulled it from; other tests push the same image elsewhere).
    assert container["imageID"].startswith(f"{REGISTRY.host}/"), container
    assert container["imageID"].endswith(f"@{digest}"), container
    assert container["image"].startswith(f"{REGISTRY.host}/"), container  # its name there, likewise
    assert pod["spec"]["containers"][0]["image"] == image
    log = registry.run("logs", pod["metadata"]["name"], "-n", namespace)
    assert log.strip() == "pulled and ran"


def test_a_wrong_pull_secret_is_the_registrys_401_in_the_jobs_condition(
    registry: Kubectl, namespace: str, start_operator: StartOperator, node_images: Callable[[str], Image]
) -> None:
    start_operator()
    image = pushed(node_images)
    create_pull_secret(registry, namespace, SECRET, password="not-the-password")
    registry.apply(pulling_job("unauthorized", image), "-n", namespace)

    status = waiting_on_the_pull(registry, namespace, "unauthorized", "401 Unauthorized")
    assert status["state"] == "Initializing"
    running = condition(status, "Running")
    assert running is not None
    assert running["reason"] in PULL_FAILURES
    assert "pod unauthorized-worker-0: container trainer is waiting" in running["message"]
    assert image in running["message"]


def test_a_registry_that_is_down_is_its_reason_in_the_jobs_condition_until_it_is_back(
    registry: Kubectl, namespace: str, start_operator: StartOperator, node_images: Callable[[str], Image]
) -> None:
    start_operator()
    image = pushed(node_images)
    create_pull_secret(registry, namespace, SECRET)
    SESSION.stop(REGISTRY.name)
    try:
        registry.apply(pulling_job("unreachable", image), "-n", namespace)
        status = waiting_on_the_pull(registry, namespace, "unreachable", "connection refused")
        assert status["state"] == "Initializing"
        assert REGISTRY.host in (condition(status, "Running") or {})["message"]
        (pod,) = pods_of(registry, namespace, "unreachable")
    finally:
        SESSION.start(REGISTRY.name)
    # The kubelet's next attempt pulls it; the same pod runs (the gang was not restarted).
    done = wait_for_state(registry, namespace, "unreachable", "Completed", timeout=360)
    assert done.get("restartCount", 0) == 0
    (after,) = pods_of(registry, namespace, "unreachable")
    assert after["metadata"]["uid"] == pod["metadata"]["uid"]
