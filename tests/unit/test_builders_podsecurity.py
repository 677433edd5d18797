"""A worker pod's security settings (builders/podsecurity.py): each default of the "restricted" Pod Security
Standard, the cases where the trainer's non-root user is not defaulted, the token in the trainer alone,
and what spec.podTemplate overrides, field by field.
"""

from __future__ import annotations

from typing import Any

import pytest

from builders.pods import build_pod
from crd import contract
from crd.spec import parse
from tests.unit.builders_support import STORAGE, defaulted

JsonDict = dict[str, Any]
TEMPLATE = "spec.podTemplate"
NON_ROOT = {
    "runAsNonRoot": True,
    "runAsUser": contract.NON_ROOT_USER,
    "runAsGroup": contract.NON_ROOT_GROUP,
}
RESTRICTED_TRAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, **NON_ROOT}
SIDECAR = {"name": "proxy", "image": "envoy"}
INIT = {"name": "fetch", "image": "busybox"}
DATA_CLAIM = {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}


def pod(changes: JsonDict | None = None) -> JsonDict:
    return build_pod(parse(defaulted(changes)), 0, attempt=0, resume_from=None)


def with_template(spec: JsonDict, **changes: Any) -> JsonDict:
    return pod({TEMPLATE: {"spec": spec}, **changes})


def containers(built: JsonDict) -> dict[str, JsonDict]:
    spec = built["spec"]
    return {c["name"]: c for c in [*spec["containers"], *spec.get("initContainers", [])]}


def trainer_context(built: JsonDict) -> JsonDict:
    context = containers(built)[contract.CONTAINER_NAME]["securityContext"]
    assert isinstance(context, dict)
    return context


def trainer_template(**fields: Any) -> JsonDict:
    return {"name": contract.CONTAINER_NAME, **fields}


# ---------------------------------------------------------------------------------------------------
# The defaults


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"spec.framework": "tensorflow"},
        {"spec.framework": "jax"},
        {"spec.elastic": {"minWorkers": 1, "maxWorkers": 2}, "spec.scheduling.gangScheduling": False},
        # The default image named, and object storage (nothing on a volume).
        {"spec.image": contract.DEFAULT_IMAGES["pytorch"]},
        {"spec.checkpoint.enabled": True, STORAGE: {"type": "s3", "s3Bucket": "b"}},
        {
            "spec.checkpoint.enabled": True,
            STORAGE: {"type": "gcs", "gcs": {"bucket": "g", "credentialsSecret": "sa"}},
        },
    ],
    ids=["pytorch", "tensorflow", "jax", "elastic", "default-image-named", "s3", "gcs-with-key"],
)
def test_the_reference_trainer_in_a_default_image_gets_the_restricted_profile(changes: JsonDict) -> None:
    built = pod(changes)
    assert built["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert trainer_context(built) == RESTRICTED_TRAINER


def test_rdma_adds_its_capability_back_to_none() -> None:
    built = pod({"spec.networking.rdmaEnabled": True})
    assert trainer_context(built)["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"spec.image": "myteam/train:1"}, "an image the operator does not know"),
        ({"spec.command": ["torchrun", "/code/train.py"]}, "a program the operator does not know"),
        ({"spec.checkpoint.enabled": True}, "the checkpoint claim belongs to its provisioner"),
        ({"spec.checkpoint.resumeFrom": "/checkpoints/epoch-1"}, "a claim mounted to resume from"),
        (
            {"spec.checkpoint.enabled": True, STORAGE: {"type": "nfs", "nfs": {"server": "n", "path": "/x"}}},
            "an NFS export's owner is the server's",
        ),
        (
            {
                TEMPLATE: {
                    "spec": {
                        "volumes": [DATA_CLAIM],
                        "containers": [
                            trainer_template(volumeMounts=[{"name": "data", "mountPath": "/data"}])
                        ],
                    }
                }
            },
            "a claim the trainer may write to",
        ),
    ],
)
def test_no_user_is_chosen_where_the_operator_cannot_know_the_trainer_works_as_one(
    changes: JsonDict, why: str
) -> None:
    context = trainer_context(pod(changes))
    assert context == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}, why


@pytest.mark.parametrize(
    "mount",
    [
        {"name": "data", "mountPath": "/data", "readOnly": True},
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "code", "mountPath": "/code"},
        {"name": contract.TOKEN_VOLUME, "mountPath": "/token"},
    ],
    ids=["claim-read-only", "emptyDir", "configMap", "the-token"],
)
def test_volumes_any_user_may_use_keep_the_non_root_user(mount: JsonDict) -> None:
    volumes = [DATA_CLAIM, {"name": "scratch", "emptyDir": {}}, {"name": "code", "configMap": {"name": "c"}}]
    built = with_template({"volumes": volumes, "containers": [trainer_template(volumeMounts=[mount])]})
    assert trainer_context(built) == RESTRICTED_TRAINER


# ---------------------------------------------------------------------------------------------------
# What the template overrides


@pytest.mark.parametrize(
    "profile",
    [{"type": "Unconfined"}, {"type": "Localhost", "localhostProfile": "profiles/train.json"}],
)
def test_the_templates_seccomp_profile_wins(profile: JsonDict) -> None:
    built = with_template({"securityContext": {"seccompProfile": profile}})
    assert built["spec"]["securityContext"]["seccompProfile"] == profile


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        ({"allowPrivilegeEscalation": True}, {**RESTRICTED_TRAINER, "allowPrivilegeEscalation": True}),
        # A list is replaced: the runtime's default capabilities back.
        ({"capabilities": {"drop": []}}, {**RESTRICTED_TRAINER, "capabilities": {"drop": []}}),
        (
            {"capabilities": {"add": ["SYS_PTRACE"]}},
            {**RESTRICTED_TRAINER, "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]}},
        ),
        # The Pod API refuses no escalation for a privileged container, or one with CAP_SYS_ADMIN.
        ({"privileged": True}, {"capabilities": {"drop": ["ALL"]}, "privileged": True, **NON_ROOT}),
        (
            {"capabilities": {"add": ["CAP_SYS_ADMIN"]}},
            {"capabilities": {"drop": ["ALL"], "add": ["CAP_SYS_ADMIN"]}, **NON_ROOT},
        ),
        (
            {"privileged": True, "allowPrivilegeEscalation": True},
            {**RESTRICTED_TRAINER, "privileged": True, "allowPrivilegeEscalation": True},
        ),
        ({"readOnlyRootFilesystem": True}, {**RESTRICTED_TRAINER, "readOnlyRootFilesystem": True}),
    ],
    ids=["escalation", "capabilities-drop", "capabilities-add", "privileged", "sys-admin", "both", "other"],
)
def test_the_templates_trainer_settings_win_field_by_field(context: JsonDict, expected: JsonDict) -> None:
    built = with_template({"containers": [trainer_template(securityContext=context)]})
    assert trainer_context(built) == expected


@pytest.mark.parametrize(
    ("pod_context", "trainer"),
    [
        ({"runAsUser": 2000}, {}),
        ({"runAsGroup": 2000}, {}),
        ({"runAsNonRoot": True}, {}),
        ({"fsGroup": 2000}, {}),
        ({}, {"runAsUser": 0}),
        ({}, {"runAsNonRoot": False}),
        ({}, {"runAsGroup": 3000}),
    ],
)
def test_a_template_that_states_a_user_or_group_has_all_of_its_identity_and_none_of_the_operators(
    pod_context: JsonDict, trainer: JsonDict
) -> None:
    template: JsonDict = {"securityContext": pod_context}
    if trainer:
        template["containers"] = [trainer_template(securityContext=trainer)]
    built = with_template(template)
    assert built["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, **pod_context}
    assert trainer_context(built) == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        **trainer,
    }


def test_sidecars_and_init_containers_keep_their_own_settings() -> None:
    built = with_template(
        {"containers": [SIDECAR], "initContainers": [{**INIT, "securityContext": {"runAsUser": 0}}]}
    )
    assert "securityContext" not in containers(built)["proxy"]
    assert containers(built)["fetch"]["securityContext"] == {"runAsUser": 0}


# ---------------------------------------------------------------------------------------------------
# The token


def mounts(container: JsonDict) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}


def test_the_token_is_the_kubelets_projection_mounted_into_the_trainer_alone() -> None:
    built = with_template({"containers": [SIDECAR], "initContainers": [INIT]})
    spec = built["spec"]
    assert spec["automountServiceAccountToken"] is False
    (volume,) = [v for v in spec["volumes"] if v["name"] == contract.TOKEN_VOLUME]
    assert volume["projected"] == {
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]
                }
            },
        ]
    }
    by_name = containers(built)
    trainer_mount = next(
        m for m in by_name[contract.CONTAINER_NAME]["volumeMounts"] if m["name"] == contract.TOKEN_VOLUME
    )
    assert trainer_mount == {
        "name": contract.TOKEN_VOLUME,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
        "readOnly": True,
    }
    assert "volumeMounts" not in by_name["proxy"]
    assert "volumeMounts" not in by_name["fetch"]


def test_a_sidecar_that_mounts_the_token_volume_gets_it() -> None:
    token = {"name": contract.TOKEN_VOLUME, "mountPath": contract.TOKEN_MOUNT_PATH, "readOnly": True}
    built = with_template({"containers": [{**SIDECAR, "volumeMounts": [token]}]})
    assert mounts(containers(built)["proxy"]) == {contract.TOKEN_MOUNT_PATH: contract.TOKEN_VOLUME}


@pytest.mark.parametrize("automount", [True, False])
def test_a_template_that_sets_automount_gets_kubernetes_own_behaviour(automount: bool) -> None:
    built = with_template({"automountServiceAccountToken": automount, "containers": [SIDECAR]})
    spec = built["spec"]
    assert spec["automountServiceAccountToken"] is automount
    assert contract.TOKEN_VOLUME not in {v["name"] for v in spec["volumes"]}
    assert contract.TOKEN_MOUNT_PATH not in mounts(containers(built)[contract.CONTAINER_NAME])


def test_a_template_volume_named_like_the_token_is_not_taken() -> None:
    built = with_template({"volumes": [{"name": contract.TOKEN_VOLUME, "emptyDir": {}}]})
    (volume,) = [v for v in built["spec"]["volumes"] if v["name"] == contract.TOKEN_VOLUME]
    assert "projected" in volume
