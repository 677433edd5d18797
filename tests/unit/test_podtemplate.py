"""Unit tests of builders/podtemplate.py: how spec.podTemplate is merged onto a worker pod.

They pin the strategic-merge semantics users rely on (the order of merged lists, what wins, the trainer
matched by its name), that the operator's own fields never come from the template, and that the merge
keys are Kubernetes' own.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from builders.pods import build_pod
from builders.podtemplate import (
    CONTAINER_LIST_KEYS,
    POD_LIST_KEYS,
    merge_keyed,
    merge_maps,
    merge_pod_template,
)
from crd import contract, kube_schemas
from crd.schema_podtemplate import OWNED_POD_FIELDS, OWNED_TRAINER_FIELDS
from crd.spec import parse
from tests.cluster import REPO
from tests.unit.builders_support import defaulted

JsonDict = dict[str, Any]
PROXY = {"name": "proxy", "image": "envoyproxy/envoy:v1.31.0"}


def pod_with(template: JsonDict | None, **changes: Any) -> JsonDict:
    all_changes = dict(changes)
    if template is not None:
        all_changes["spec.podTemplate"] = template
    pod: JsonDict = build_pod(parse(defaulted(all_changes)), 0, attempt=0, resume_from=None)
    return pod


def trainer_of(pod: JsonDict) -> JsonDict:
    trainers: list[JsonDict] = [c for c in pod["spec"]["containers"] if c["name"] == contract.CONTAINER_NAME]
    assert len(trainers) == 1
    return trainers[0]


def names(items: list[JsonDict], key: str = "name") -> list[Any]:
    return [item[key] for item in items]


def test_without_a_template_the_pod_is_the_operators() -> None:
    assert pod_with(None) == pod_with({}) == pod_with({"metadata": {}, "spec": {}})


def test_lists_merge_by_key_operator_items_first_then_the_templates_in_order() -> None:
    pod = pod_with(
        {
            "spec": {
                "volumes": [{"name": "zeta", "emptyDir": {}}, {"name": "alpha", "emptyDir": {}}],
                "initContainers": [{"name": "b", "image": "x"}, {"name": "a", "image": "x"}],
                "containers": [
                    PROXY,
                    {"name": contract.CONTAINER_NAME, "env": [{"name": "Z", "value": "1"}]},
                ],
                "imagePullSecrets": [{"name": "two"}, {"name": "one"}],
            }
        },
        **{"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}]},
    )
    spec = pod["spec"]
    assert names(spec["volumes"]) == ["config", "dshm", contract.TOKEN_VOLUME, "zeta", "alpha"]
    assert names(spec["initContainers"]) == ["b", "a"]
    # The trainer is matched by name wherever the template lists it, and stays first.
    assert names(spec["containers"]) == [contract.CONTAINER_NAME, "proxy"]
    assert names(spec["imagePullSecrets"]) == ["two", "one"]
    env = names(trainer_of(pod)["env"])
    assert env[-2:] == ["NCCL_DEBUG", "Z"]
    assert env[0] == "TRAININGJOB_NAME"


def test_an_item_with_the_key_of_an_existing_one_is_merged_in_place() -> None:
    pod = pod_with(
        {
            "spec": {
                "containers": [
                    {"name": contract.CONTAINER_NAME, "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}
                ]
            }
        },
        **{"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "LAST", "value": "1"}]},
    )
    env = trainer_of(pod)["env"]
    assert names(env)[-2:] == ["NCCL_DEBUG", "LAST"]
    assert env[-2] == {"name": "NCCL_DEBUG", "value": "WARN"}


def test_template_scalars_win_and_maps_merge() -> None:
    pod = pod_with(
        {
            "metadata": {"labels": {"team": "vision"}, "annotations": {"sidecar.istio.io/inject": "true"}},
            "spec": {
                "terminationGracePeriodSeconds": 300,
                "enableServiceLinks": True,
                "runtimeClassName": "nvidia",
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                "containers": [
                    {
                        "name": contract.CONTAINER_NAME,
                        "imagePullPolicy": "Always",
                        "securityContext": {"capabilities": {"drop": ["ALL"]}},
                        "resources": {"limits": {"memory": "64Gi"}, "requests": {"cpu": "8"}},
                    }
                ],
            },
        },
        **{"spec.resources": {"requests": {"cpu": "2", "memory": "8Gi"}}, "spec.gpusPerWorker": 2},
    )
    spec, trainer = pod["spec"], trainer_of(pod)
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["labels"][contract.JOB_NAME_LABEL] == "case-job"
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "true"
    assert contract.NUM_WORKERS_ANNOTATION in pod["metadata"]["annotations"]
    assert (spec["terminationGracePeriodSeconds"], spec["enableServiceLinks"]) == (300, True)
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": 1000,
    }
    assert trainer["imagePullPolicy"] == "Always"
    assert trainer["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert trainer["resources"] == {
        "requests": {"cpu": "8", "memory": "8Gi", contract.GPU_RESOURCE: "2"},
        "limits": {contract.GPU_RESOURCE: "2", "memory": "64Gi"},
    }


def test_lists_without_a_merge_key_are_replaced() -> None:
    pod = pod_with(
        {
            "spec": {
                "dnsConfig": {"nameservers": ["10.0.0.10"]},
                "containers": [
                    {"name": contract.CONTAINER_NAME, "envFrom": [{"secretRef": {"name": "wandb"}}]}
                ],
            }
        }
    )
    assert pod["spec"]["dnsConfig"] == {"nameservers": ["10.0.0.10"]}
    assert trainer_of(pod)["envFrom"] == [{"secretRef": {"name": "wandb"}}]
    assert merge_maps({"a": [1, 2], "b": {"c": 1}}, {"a": [3], "b": {"d": 2}}) == {
        "a": [3],
        "b": {"c": 1, "d": 2},
    }


def test_what_the_operator_owns_is_never_taken_from_the_template() -> None:
    """Admission refuses all of this; the merge ignores it anyway."""
    built = pod_with(None, **{"spec.monitoring.enabled": True, "spec.gpusPerWorker": 1})
    template = {
        "metadata": {
            "name": "other",
            "labels": {contract.JOB_NAME_LABEL: "other", contract.ATTEMPT_LABEL: "7"},
            "annotations": {contract.PROGRESS_ANNOTATION: "{}"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "1"}],
        },
        "spec": {
            "restartPolicy": "Always",
            "hostname": "h",
            "subdomain": "s",
            "serviceAccountName": "sa",
            "nodeSelector": {"a": "b"},
            "volumes": [{"name": contract.CONFIG_VOLUME, "emptyDir": {}}],
            "initContainers": [{"name": contract.CONTAINER_NAME, "image": "x"}],
            "containers": [
                {
                    "name": contract.CONTAINER_NAME,
                    "image": "other:1",
                    "command": ["bash"],
                    "args": ["-c"],
                    "env": [{"name": "WORLD_SIZE", "value": "99"}, {"name": "HP_X", "value": "1"}],
                    "ports": [{"containerPort": 29500}, {"containerPort": 7000, "name": "metrics"}],
                    "volumeMounts": [{"name": "data", "mountPath": contract.CONFIG_MOUNT_PATH}],
                    "resources": {"limits": {contract.GPU_RESOURCE: "8"}},
                }
            ],
        },
    }
    merged = pod_with(template, **{"spec.monitoring.enabled": True, "spec.gpusPerWorker": 1})
    assert merged == built


def test_ports_and_mounts_of_the_trainer_are_added_after_the_operators() -> None:
    pod = pod_with(
        {
            "spec": {
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
                "containers": [
                    {
                        "name": contract.CONTAINER_NAME,
                        "ports": [{"containerPort": 6006, "name": "tensorboard"}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }
                ],
            }
        }
    )
    trainer = trainer_of(pod)
    assert names(trainer["ports"]) == [contract.DIST_PORT_NAME, "tensorboard"]
    assert names(trainer["volumeMounts"], "mountPath") == [
        contract.CONFIG_MOUNT_PATH,
        contract.SHM_MOUNT_PATH,
        contract.TOKEN_MOUNT_PATH,
        "/data",
    ]


def test_merge_does_not_touch_its_inputs() -> None:
    pod = pod_with(None)
    template = {
        "spec": {"containers": [{"name": contract.CONTAINER_NAME, "env": [{"name": "A", "value": "1"}]}]}
    }
    pod_copy, template_copy = copy.deepcopy(pod), copy.deepcopy(template)
    merge_pod_template(pod, template)
    assert (pod, template) == (pod_copy, template_copy)


def test_merge_keyed_updates_in_place_and_appends_in_order() -> None:
    base: list[JsonDict] = [{"name": "a", "v": 1}, {"name": "b", "v": 1}]
    patch: list[JsonDict] = [{"name": "c", "v": 2}, {"name": "a", "w": 2}, {"name": "d"}]
    assert merge_keyed(base, patch, "name") == [
        {"name": "a", "v": 1, "w": 2},
        {"name": "b", "v": 1},
        {"name": "c", "v": 2},
        {"name": "d"},
    ]


def _list_maps(node: JsonDict) -> dict[str, str]:
    """Fields of a generated object schema that are list-maps, with their first (merge) key."""
    return {
        name: child["x-kubernetes-list-map-keys"][0]
        for name, child in node["properties"].items()
        if child.get("x-kubernetes-list-type") == "map"
    }


@pytest.mark.parametrize(
    ("keys", "path"),
    [(POD_LIST_KEYS, ("spec",)), (CONTAINER_LIST_KEYS, ("spec", "containers", "items"))],
    ids=["PodSpec", "Container"],
)
def test_merge_keys_are_kubernetes_own(keys: dict[str, str], path: tuple[str, ...]) -> None:
    """Kubernetes' patch merge key of each list is the first key of its list-map marker."""
    node = kube_schemas.schema("PodTemplateSpec")
    for part in path:
        node = node["properties"][part] if part != "items" else node["items"]
    assert _list_maps(node) == dict(keys)


def test_the_docs_name_every_field_the_template_cannot_set() -> None:
    docs = (REPO / "docs" / "pod-template.md").read_text(encoding="utf-8")
    for field in OWNED_POD_FIELDS:
        assert f"`spec.{field}`" in docs, field
    for field in OWNED_TRAINER_FIELDS:
        assert f"`{field}`" in docs, field
    for volume in contract.OPERATOR_VOLUMES:
        assert f"`{volume}`" in docs, volume
