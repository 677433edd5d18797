"""controller.planner.supporting: the job's non-pod objects are created once and only repaired where the
operator owns them, so server defaults and other controllers' additions never cause writes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from builders.configmap import TRAINER_SOURCES_NAME
from builders.podgroup import GangScheduler
from controller.planner.supporting import OWNED_FIELDS, desired_objects, diff_objects
from crd import contract
from crd.spec import parse
from tests.unit.lifecycle_world import make_job

JsonDict = dict[str, Any]


def existing(objects: list[JsonDict]) -> dict[tuple[str, str], JsonDict]:
    """The objects as the cache would hold them after creation: server-populated fields added."""
    stored: dict[tuple[str, str], JsonDict] = {}
    for number, obj in enumerate(objects):
        copy_ = copy.deepcopy(obj)
        copy_["metadata"].update(
            {
                "uid": f"uid-{number}",
                "resourceVersion": str(100 + number),
                "creationTimestamp": "2026-03-01T12:00:00Z",
            }
        )
        if copy_["kind"] == "Service":
            copy_["spec"].update(
                {
                    "type": "ClusterIP",
                    "clusterIPs": ["None"],
                    "sessionAffinity": "None",
                    "ipFamilies": ["IPv4"],
                    "ipFamilyPolicy": "SingleStack",
                    "internalTrafficPolicy": "Cluster",
                }
            )
            copy_["status"] = {"loadBalancer": {}}
        if copy_["kind"] == "ServiceAccount":
            copy_["secrets"] = [{"name": "token"}]
        if copy_["kind"] == "PersistentVolumeClaim":
            copy_["spec"].update({"volumeName": "pv-1", "volumeMode": "Filesystem"})
            copy_["status"] = {"phase": "Bound"}
        if copy_["kind"] == "PodGroup":
            copy_["spec"]["queue"] = "default"  # Volcano's admission webhook fills the queue in
            copy_["status"] = {"phase": "Running", "running": 2}
        stored[(copy_["kind"], copy_["metadata"]["name"])] = copy_
    return stored


def kinds_and_names(objects: list[JsonDict]) -> list[tuple[str, str]]:
    return [(obj["kind"], obj["metadata"]["name"]) for obj in objects]


def test_objects_are_listed_in_creation_order() -> None:
    job = make_job()
    assert kinds_and_names(desired_objects(parse(job), None)) == [
        ("ConfigMap", TRAINER_SOURCES_NAME),
        ("ServiceAccount", "trainingjob-trainer"),
        ("RoleBinding", "trainingjob-trainer"),
        ("Service", "mnist-headless"),
        ("Service", "mnist-master"),
    ]


def test_checkpoint_claim_and_pod_group_are_added_when_needed() -> None:
    job = make_job({"spec.checkpoint.enabled": True})
    listed = kinds_and_names(desired_objects(parse(job), "volcano"))
    assert listed[-2:] == [("PersistentVolumeClaim", "mnist-checkpoints"), ("PodGroup", "mnist")]


def test_a_job_with_its_own_service_account_gets_no_rbac() -> None:
    job = make_job({"spec.serviceAccountName": "trainer"})
    kinds = [kind for kind, _ in kinds_and_names(desired_objects(parse(job), None))]
    assert "ServiceAccount" not in kinds
    assert "RoleBinding" not in kinds


def test_nothing_existing_creates_everything() -> None:
    job = make_job()
    desired = desired_objects(parse(job), None)
    creates, patches = diff_objects(desired, {})
    assert creates == desired
    assert patches == []


@pytest.mark.parametrize("gang", [None, "coscheduling", "volcano"])
def test_server_populated_fields_cause_no_writes(gang: GangScheduler | None) -> None:
    job = make_job({"spec.checkpoint.enabled": True, "spec.scheduling.scheduleTimeoutSeconds": 60})
    desired = desired_objects(parse(job), gang)
    creates, patches = diff_objects(desired, existing(desired))
    assert creates == []
    assert patches == []


def test_a_missing_object_is_recreated_alone() -> None:
    job = make_job()
    desired = desired_objects(parse(job), None)
    stored = existing(desired)
    del stored[("Service", "mnist-master")]
    creates, patches = diff_objects(desired, stored)
    assert kinds_and_names(creates) == [("Service", "mnist-master")]
    assert patches == []


def test_a_changed_world_size_changes_no_supporting_object() -> None:
    # The world size is in the pods (their environment and num-workers annotation), built anew by the
    # gang restart the planner decides; the Services and the shared objects do not depend on it.
    before = make_job()
    after = make_job(workers=3)
    stored = existing(desired_objects(parse(before), None))
    assert diff_objects(desired_objects(parse(after), None), stored) == ([], [])


def test_an_edited_shared_role_binding_is_repaired() -> None:
    desired = desired_objects(parse(make_job()), None)
    stored = existing(desired)
    stored[("RoleBinding", "trainingjob-trainer")]["subjects"].append({"kind": "User", "name": "eve"})
    _, patches = diff_objects(desired, stored)
    assert [(patch.kind, patch.name) for patch in patches] == [("RoleBinding", "trainingjob-trainer")]
    assert patches[0].body == {
        "subjects": [{"kind": "ServiceAccount", "name": "trainingjob-trainer", "namespace": "ml"}]
    }
    assert patches[0].api_version == "rbac.authorization.k8s.io/v1"


def test_without_trainer_rights_the_role_binding_is_not_wanted() -> None:
    desired = desired_objects(parse(make_job()), None, trainer_rights=False)
    assert ("RoleBinding", "trainingjob-trainer") not in kinds_and_names(desired)
    assert ("ServiceAccount", "trainingjob-trainer") in kinds_and_names(desired)


def test_a_config_map_patch_removes_keys_the_operator_no_longer_writes() -> None:
    job = make_job()
    desired = desired_objects(parse(job), None)
    stored = existing(desired)
    stored[("ConfigMap", TRAINER_SOURCES_NAME)]["data"]["old.py"] = "print()"
    _, patches = diff_objects(desired, stored)
    assert len(patches) == 1
    body = patches[0].body
    assert body["data"]["old.py"] is None
    assert body["data"][contract.TRAINER_FILE] == desired[0]["data"][contract.TRAINER_FILE]


def test_a_service_whose_selector_was_edited_is_repaired() -> None:
    job = make_job()
    desired = desired_objects(parse(job), None)
    stored = existing(desired)
    stored[("Service", "mnist-master")]["spec"]["selector"] = {"app": "other"}
    stored[("Service", "mnist-master")]["metadata"]["labels"]["extra"] = "label"  # not owned: ignored
    _, patches = diff_objects(desired, stored)
    assert [(patch.kind, patch.name) for patch in patches] == [("Service", "mnist-master")]
    assert patches[0].body == {"spec": {"selector": desired[4]["spec"]["selector"]}}


def test_a_pod_group_with_a_stale_min_member_is_patched() -> None:
    before = make_job()
    after = make_job(workers=4)
    stored = existing(desired_objects(parse(before), "volcano"))
    _, patches = diff_objects(desired_objects(parse(after), "volcano"), stored)
    group = [patch for patch in patches if patch.kind == "PodGroup"]
    assert len(group) == 1
    assert group[0].body["spec"]["minMember"] == 4
    assert "queue" not in group[0].body["spec"]


def test_claims_and_accounts_are_create_only() -> None:
    assert OWNED_FIELDS["PersistentVolumeClaim"] == ()
    assert OWNED_FIELDS["ServiceAccount"] == ()
    before = make_job({"spec.checkpoint.enabled": True})
    stored = existing(desired_objects(parse(before), None))
    stored[("PersistentVolumeClaim", "mnist-checkpoints")]["spec"]["resources"] = {
        "requests": {"storage": "1Ti"}
    }
    _, patches = diff_objects(desired_objects(parse(before), None), stored)
    assert patches == []
