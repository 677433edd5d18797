"""The tracking finalizer's rules (controller/planner/tracking.py, podstate.failed_before_deletion):
which pods may go, which are orphans, and when a deleted pod's exit is a failure of its own."""

from __future__ import annotations

from typing import Any

from builders.pods import build_pod
from controller.planner import podstate, tracking
from controller.planner.tracking import Release
from crd import contract
from crd.spec import parse
from tests.unit.lifecycle_world import JOB_UID, make_job

JsonDict = dict[str, Any]


def pod(
    name: str = "mnist-worker-1",
    *,
    phase: str = "Running",
    deleted_at: str | None = None,
    grace: int = 30,
    finalizers: tuple[str, ...] = (contract.TRACKING_FINALIZER,),
    owner: str | None = JOB_UID,
    exit_code: int | None = None,
    finished_at: str = "2026-03-01T12:00:10Z",
) -> JsonDict:
    metadata: JsonDict = {"name": name, "uid": f"uid-{name}", "finalizers": list(finalizers)}
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "uid": owner, "controller": True}
        ]
    if deleted_at is not None:
        metadata["deletionTimestamp"] = deleted_at
        metadata["deletionGracePeriodSeconds"] = grace
    status: JsonDict = {"phase": phase}
    if exit_code is not None:
        terminated = {"exitCode": exit_code, "finishedAt": finished_at}
        status["containerStatuses"] = [{"name": contract.CONTAINER_NAME, "state": {"terminated": terminated}}]
    return {"metadata": metadata, "status": status}


def test_every_pod_the_operator_builds_carries_the_finalizer() -> None:
    built = build_pod(parse(make_job()), 0, attempt=0, resume_from=None)
    assert built["metadata"]["finalizers"] == [contract.TRACKING_FINALIZER]


def test_only_pods_that_ended_or_are_being_deleted_are_released() -> None:
    pods = [
        pod("a", phase="Running"),
        pod("b", phase="Pending"),
        pod("c", phase="Succeeded"),
        pod("d", phase="Failed"),
        pod("e", phase="Running", deleted_at="2026-03-01T12:00:40Z"),
        pod("f", phase="Failed", finalizers=()),
    ]
    assert tracking.releases(pods) == (
        Release("c", "uid-c", 0),
        Release("d", "uid-d", 0),
        Release("e", "uid-e", 0),
    )


def test_the_release_names_where_the_finalizer_is() -> None:
    held = pod(phase="Failed", finalizers=("example.com/other", contract.TRACKING_FINALIZER))
    assert tracking.releases([held]) == (Release("mnist-worker-1", "uid-mnist-worker-1", 1),)


def test_orphans_are_the_pods_the_living_job_does_not_control() -> None:
    ours, earlier, unowned = pod("a"), pod("b", owner="uid-of-an-earlier-job"), pod("c", owner=None)
    untracked = pod("d", owner="uid-of-an-earlier-job", finalizers=())
    assert [release.name for release in tracking.orphans([ours, earlier, unowned, untracked], JOB_UID)] == [
        "b",
        "c",
    ]
    # No job under the key: every tracked pod is an orphan, running or not.
    assert [release.name for release in tracking.orphans([ours, earlier, untracked], None)] == ["a", "b"]


def test_a_failure_before_the_deletion_is_the_pods_own() -> None:
    # Deleted at 12:00:20 with 30 s of grace (deletionTimestamp 12:00:50); the trainer failed at 12:00:10.
    failed = pod(phase="Failed", exit_code=1, deleted_at="2026-03-01T12:00:50Z")
    assert podstate.deletion_start(failed) is not None
    assert podstate.failed_before_deletion(failed)


def test_an_exit_after_the_deletion_is_the_deletions_doing() -> None:
    killed = pod(
        phase="Failed", exit_code=143, finished_at="2026-03-01T12:00:21Z", deleted_at="2026-03-01T12:00:50Z"
    )
    assert not podstate.failed_before_deletion(killed)
    # In the same second: the deletion's (times have whole seconds).
    same = pod(
        phase="Failed", exit_code=1, finished_at="2026-03-01T12:00:20Z", deleted_at="2026-03-01T12:00:50Z"
    )
    assert not podstate.failed_before_deletion(same)


def test_a_shortened_grace_period_keeps_the_deletions_start() -> None:
    # The kubelet confirms with grace 0: the API server moves deletionTimestamp back by the difference
    # (12:00:50 - 30 s = 12:00:20), so the deletion still started at 12:00:20.
    confirmed = pod(
        phase="Failed",
        exit_code=143,
        finished_at="2026-03-01T12:00:21Z",
        deleted_at="2026-03-01T12:00:20Z",
        grace=0,
    )
    assert not podstate.failed_before_deletion(confirmed)


def test_a_success_or_a_live_pod_is_never_a_failure_before_deletion() -> None:
    assert not podstate.failed_before_deletion(
        pod(phase="Succeeded", exit_code=0, deleted_at="2026-03-01T12:00:50Z")
    )
    assert not podstate.failed_before_deletion(pod(phase="Failed", exit_code=1))
