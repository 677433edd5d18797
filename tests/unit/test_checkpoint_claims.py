"""The checkpoint claim the operator creates outlives its job unless asked otherwise
(spec.checkpoint.storage.pvc.create.whenDeleted): the builder, the planner and the reconciler.

Retain: the claim has no owner reference, so deleting the job (or its TTL) leaves it to the garbage
collector untouched; the job finds it again by its name and labels, and a job created again with the
same name uses it. Delete: the claim is owned by the job. A claim owned by the job although the job says
Retain (created before the field existed) is released: its owner reference is taken off.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from builders.pvc import build_checkpoint_pvc, release_claim_patch, reusable_claim
from controller.planner.supporting import desired_objects
from crd import contract
from crd.spec import parse
from tests.unit.fakeapi import FakeApi, Reply, running, status
from tests.unit.lifecycle_world import JOB_UID, NAMESPACE, make_job, world
from tests.unit.shell_scene import PODS_PATH, Scene, stored

JsonDict = dict[str, Any]
CLAIMS = f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims"
CLAIM = "mnist-checkpoints"
CHECKPOINTS = {"spec.checkpoint.enabled": True}
DELETE = {**CHECKPOINTS, "spec.checkpoint.storage.pvc.create.whenDeleted": "Delete"}
OWNER = {
    "apiVersion": contract.API_VERSION,
    "kind": contract.KIND,
    "name": "mnist",
    "uid": JOB_UID,
    "controller": True,
    "blockOwnerDeletion": True,
}


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as fake:
        yield fake


def claim_of(changes: dict[str, Any]) -> JsonDict:
    claim = build_checkpoint_pvc(parse(make_job(changes)))
    assert claim is not None
    return claim


# ---------------------------------------------------------------------------------------- builder


def test_the_claim_is_retained_by_default_it_has_no_owner() -> None:
    job = make_job(CHECKPOINTS)
    assert job["spec"]["checkpoint"]["storage"]["pvc"]["create"]["whenDeleted"] == "Retain"
    claim = claim_of(CHECKPOINTS)
    assert "ownerReferences" not in claim["metadata"]
    assert claim["metadata"]["labels"][contract.JOB_NAME_LABEL] == "mnist"
    assert claim["metadata"]["labels"][contract.MANAGED_BY_LABEL] == contract.MANAGED_BY_VALUE


def test_a_claim_to_delete_with_the_job_is_owned_by_it() -> None:
    assert claim_of(DELETE)["metadata"]["ownerReferences"] == [OWNER]


def test_which_claims_a_job_may_reuse() -> None:
    retained = claim_of(CHECKPOINTS)
    assert reusable_claim("mnist", retained)
    assert not reusable_claim("other", retained)  # another job's name
    foreign = copy.deepcopy(retained)
    foreign["metadata"]["ownerReferences"] = [{**OWNER, "uid": "an-earlier-job"}]
    assert not reusable_claim("mnist", foreign)  # still controlled (an earlier job being deleted)
    unlabelled = copy.deepcopy(retained)
    del unlabelled["metadata"]["labels"][contract.MANAGED_BY_LABEL]
    assert not reusable_claim("mnist", unlabelled)  # a claim the operator did not make
    renamed = copy.deepcopy(retained)
    renamed["metadata"]["name"] = "data"
    assert not reusable_claim("mnist", renamed)


def test_a_claim_owned_by_a_job_that_retains_it_is_released() -> None:
    job = parse(make_job(CHECKPOINTS))
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}
    owned = claim_of(DELETE)
    owned["metadata"]["ownerReferences"].append(other)
    assert release_claim_patch(job, owned) == {"metadata": {"ownerReferences": [other]}}
    assert release_claim_patch(job, claim_of(CHECKPOINTS)) is None
    assert release_claim_patch(parse(make_job(DELETE)), claim_of(DELETE)) is None
    assert release_claim_patch(parse(make_job()), claim_of(DELETE)) is None  # no checkpoints


# ---------------------------------------------------------------------------------------- planner


def test_the_job_creates_its_retained_claim_once() -> None:
    w = world(CHECKPOINTS)
    first = w.step()
    claims = [obj for obj in first.creates if obj["kind"] == "PersistentVolumeClaim"]
    assert [claim["metadata"]["name"] for claim in claims] == [CLAIM]
    assert "ownerReferences" not in claims[0]["metadata"]
    assert [obj for obj in w.step(1).creates if obj["kind"] == "PersistentVolumeClaim"] == []
    pod = w.pod(0)
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": CLAIM}


def test_a_job_of_the_same_name_uses_the_claim_an_earlier_one_retained() -> None:
    w = world(DELETE)
    earlier = stored(claim_of(CHECKPOINTS), 3)
    w.owned[("PersistentVolumeClaim", CLAIM)] = earlier  # as the reconciler finds it: by name and labels
    result = w.step()
    assert [obj["kind"] for obj in result.creates if obj["kind"] == "PersistentVolumeClaim"] == []
    assert result.patches == []  # never adopted: a claim the job did not create is never deleted with it


@pytest.mark.parametrize("finished", [False, True])
def test_a_claim_owned_by_a_job_that_retains_it_is_released_whatever_the_state(finished: bool) -> None:
    w = world(CHECKPOINTS)
    w.owned[("PersistentVolumeClaim", CLAIM)] = stored(claim_of(DELETE), 3)
    if finished:
        w.settle()
        w.start()
        w.succeed()
        w.step(1)
        assert w.state == "Completed"
        w.owned[("PersistentVolumeClaim", CLAIM)]["metadata"]["ownerReferences"] = [OWNER]
    result = w.step(1)
    assert [(patch.kind, patch.name, patch.body) for patch in result.patches] == [
        ("PersistentVolumeClaim", CLAIM, {"metadata": {"ownerReferences": []}})
    ]
    assert w.step(1).patches == []


def test_ttl_deletion_releases_the_claim_in_the_same_plan() -> None:
    w = world({**CHECKPOINTS, "spec.ttlSecondsAfterFinished": 0})
    w.settle()
    w.start()
    w.succeed()
    w.owned[("PersistentVolumeClaim", CLAIM)]["metadata"]["ownerReferences"] = [OWNER]
    result = w.step(1)
    assert result.delete_job
    # The reconciler makes the patches before it deletes the job.
    assert [patch.kind for patch in result.patches] == ["PersistentVolumeClaim"]


# ------------------------------------------------------------------------------------- reconciler


def checkpoint_scene(api: FakeApi, changes: dict[str, Any]) -> Scene:
    """The job's supporting objects are in the caches (its retained claim without an owner)."""
    return Scene(api, make_job(changes)).with_supporting_objects()


def test_the_reconciler_finds_the_retained_claim_by_its_labels(api: FakeApi) -> None:
    scene = checkpoint_scene(api, CHECKPOINTS)
    scene.always("POST", PODS_PATH, Reply(201, {}))
    _, actions = scene.reconcile()
    assert ("POST", CLAIMS) not in actions


def test_a_retained_claim_the_cache_does_not_show_yet_is_used(api: FakeApi) -> None:
    scene = Scene(api, make_job(CHECKPOINTS))
    for number, obj in enumerate(desired_objects(parse(scene.job), None), start=10):
        if obj["kind"] != "PersistentVolumeClaim":
            scene.caches.owned[obj["kind"]].add(stored(obj, number))
    scene.answer("POST", CLAIMS, Reply(409, status(409, "AlreadyExists", "exists")))
    scene.answer("GET", f"{CLAIMS}/{CLAIM}", Reply(200, stored(claim_of(CHECKPOINTS), 5)))
    scene.always("POST", PODS_PATH, Reply(201, {}))
    result, actions = scene.reconcile()
    assert ("POST", PODS_PATH) in actions
    assert not result.rate_limited
    assert "FailedCreate" not in str(scene.status())


def test_a_claim_of_the_same_name_that_something_else_controls_blocks_the_job(api: FakeApi) -> None:
    scene = Scene(api, make_job(CHECKPOINTS))
    for number, obj in enumerate(desired_objects(parse(scene.job), None), start=10):
        if obj["kind"] != "PersistentVolumeClaim":
            scene.caches.owned[obj["kind"]].add(stored(obj, number))
    foreign = stored(claim_of(DELETE), 5)
    foreign["metadata"]["ownerReferences"] = [{**OWNER, "uid": "an-earlier-job"}]
    scene.caches.owned["PersistentVolumeClaim"].add(foreign)
    scene.answer("POST", CLAIMS, Reply(409, status(409, "AlreadyExists", "exists")))
    scene.answer("GET", f"{CLAIMS}/{CLAIM}", Reply(200, foreign))
    result, _ = scene.reconcile()
    assert result.rate_limited
    assert scene.status()["message"] == (
        "PersistentVolumeClaim mnist-checkpoints already exists and is not owned by this TrainingJob"
    )


def test_the_reconciler_releases_an_owned_claim(api: FakeApi) -> None:
    scene = checkpoint_scene(api, CHECKPOINTS)
    owned = stored(claim_of(DELETE), 20)
    owned["metadata"]["ownerReferences"] = [{**OWNER, "uid": scene.job["metadata"]["uid"]}]
    scene.caches.owned["PersistentVolumeClaim"].add(owned)
    scene.always("POST", PODS_PATH, Reply(201, {}))
    scene.answer("PATCH", f"{CLAIMS}/{CLAIM}", Reply(200, {}))
    _, actions = scene.reconcile()
    assert ("PATCH", f"{CLAIMS}/{CLAIM}") in actions
    [patch] = api.requests("PATCH", f"{CLAIMS}/{CLAIM}")
    assert patch.json() == {"metadata": {"ownerReferences": []}}
