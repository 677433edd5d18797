"""Manifests of the fields with Kubernetes' own types (spec.podTemplate, spec.scheduling.affinity,
spec.env[].valueFrom) that the API server must refuse (with the field its error names) or accept.

Part of the admission table of tests/unit/crd_cases.py, which explains the layers: wrong types are
refused by the schemas generated from the API server's OpenAPI, duplicates by their list keys, fields
they leave out or do not know by strict field validation, and what the operator owns
(crd/schema_podtemplate.py) by CEL rules whose messages name the field.
"""

from __future__ import annotations

from typing import Any

from crd import contract
from crd.schema_podtemplate import OWNED_POD_FIELDS
from tests.unit.crd_case_model import InvalidCase, case, job, transition

T = "spec.podTemplate"
PROXY = {"name": "proxy", "image": "envoyproxy/envoy:v1.31.0"}
DATA_VOLUME = {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}

# A value of the right type for each owned pod field (so only its CEL rule refuses it).
OWNED_SAMPLES: dict[str, Any] = {
    "restartPolicy": "Always",
    "hostname": "host",
    "hostnameOverride": "host",
    "subdomain": "sub",
    "nodeName": "gpu-node-0",
    "serviceAccountName": "trainer",
    "schedulerName": "volcano",
    "priorityClassName": "high",
    "priority": 1000,
    "nodeSelector": {"pool": "a100"},
    "affinity": {"nodeAffinity": {}},
    "tolerations": [{"key": "k", "operator": "Exists"}],
    "activeDeadlineSeconds": 60,
}


def template(spec: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if metadata is not None:
        body["metadata"] = metadata
    if spec is not None:
        body["spec"] = spec
    return body


def trainer(**fields: Any) -> dict[str, Any]:
    return {"name": contract.CONTAINER_NAME, **fields}


def _with_template(id_: str, spec: dict[str, Any], field: str, layer: Any, **changes: Any) -> InvalidCase:
    return case(id_, {T: template(spec), **changes}, field, layer)


def _schema_cases() -> list[InvalidCase]:
    return [
        _with_template(
            "podTemplate-port-string",
            {"containers": [{**PROXY, "ports": [{"containerPort": "http"}]}]},
            f"{T}.spec.containers[0].ports[0].containerPort",
            "schema",
        ),
        _with_template("podTemplate-volumes-not-a-list", {"volumes": "data"}, f"{T}.spec.volumes", "schema"),
        _with_template("podTemplate-hostIPC-string", {"hostIPC": "yes"}, f"{T}.spec.hostIPC", "schema"),
        _with_template(
            "podTemplate-pull-policy-unknown",
            {"containers": [trainer(imagePullPolicy="Sometimes")]},
            f"{T}.spec.containers[0].imagePullPolicy",
            "schema",
        ),
        _with_template(
            "podTemplate-memory-not-quantity",
            {"containers": [trainer(resources={"limits": {"memory": "lots"}})]},
            f"{T}.spec.containers[0].resources.limits.memory",
            "schema",
        ),
        _with_template(
            "podTemplate-volume-without-name",
            {"volumes": [{"emptyDir": {}}]},
            f"{T}.spec.volumes[0].name",
            "schema",
        ),
        case(
            "podTemplate-label-value-invalid",
            {T: template(metadata={"labels": {"team": "vision team"}})},
            f"{T}.metadata.labels.team",
            "schema",
        ),
    ]


def _list_cases() -> list[InvalidCase]:
    return [
        _with_template(
            "podTemplate-volumes-same-name",
            {"volumes": [DATA_VOLUME, {"name": "data", "emptyDir": {}}]},
            f"{T}.spec.volumes[1]",
            "list",
        ),
        _with_template(
            "podTemplate-containers-same-name",
            {"containers": [PROXY, PROXY]},
            f"{T}.spec.containers[1]",
            "list",
        ),
    ]


def _unknown_field_cases() -> list[InvalidCase]:
    return [
        _with_template(
            "podTemplate-ephemeralContainers",
            {"ephemeralContainers": [{"name": "debug", "image": "busybox"}]},
            f"{T}.spec.ephemeralContainers",
            "unknown-field",
        ),
        _with_template(
            "podTemplate-deprecated-volume-type",
            {"volumes": [{"name": "code", "gitRepo": {"repository": "https://example.com/x.git"}}]},
            f"{T}.spec.volumes[0].gitRepo",
            "unknown-field",
        ),
        case(
            "podTemplate-metadata-name",
            {T: template(metadata={"name": "x"})},
            f"{T}.metadata.name",
            "unknown-field",
        ),
    ]


def _owned_field_cases() -> list[InvalidCase]:
    assert set(OWNED_SAMPLES) == set(OWNED_POD_FIELDS)
    return [
        _with_template(f"podTemplate-owned-{field}", {field: value}, f"{T}.spec.{field}", "cel")
        for field, value in OWNED_SAMPLES.items()
    ]


def _trainer_cases() -> list[InvalidCase]:
    checkpointing = {"spec.checkpoint.enabled": True}
    return [
        *(
            _with_template(
                f"podTemplate-trainer-{field}",
                {"containers": [trainer(**{field: value})]},
                f"{T}.spec.containers[0].{field}",
                "cel",
            )
            for field, value in (("image", "my/image:1"), ("command", ["bash"]), ("args", ["--fast"]))
        ),
        _with_template(
            "podTemplate-trainer-reserved-env",
            {"containers": [trainer(env=[{"name": "WORLD_SIZE", "value": "8"}])]},
            f"{T}.spec.containers[0].env",
            "cel",
        ),
        _with_template(
            "podTemplate-trainer-reserved-env-prefix",
            {"containers": [trainer(env=[{"name": "HP_LR", "value": "0.1"}])]},
            f"{T}.spec.containers[0].env",
            "cel",
        ),
        _with_template(
            "podTemplate-trainer-gpus",
            {"containers": [trainer(resources={"limits": {contract.GPU_RESOURCE: 2}})]},
            f"{T}.spec.containers[0].resources",
            "cel",
        ),
        _with_template(
            "podTemplate-trainer-master-port",
            {"containers": [trainer(ports=[{"containerPort": 29500}])]},
            f"{T}.spec.containers",
            "cel",
        ),
        _with_template(
            "podTemplate-trainer-port-named-dist",
            {"containers": [trainer(ports=[{"containerPort": 7000, "name": contract.DIST_PORT_NAME}])]},
            f"{T}.spec.containers",
            "cel",
        ),
        _with_template(
            "podTemplate-trainer-metrics-port",
            {"containers": [trainer(ports=[{"containerPort": 9100}])]},
            f"{T}.spec.containers",
            "cel",
            **{"spec.monitoring.enabled": True, "spec.monitoring.metricsPort": 9100},
        ),
        _with_template(
            "podTemplate-trainer-mount-over-shm",
            {
                "volumes": [DATA_VOLUME],
                "containers": [trainer(volumeMounts=[{"name": "data", "mountPath": "/dev/shm"}])],
            },
            f"{T}.spec.containers",
            "cel",
        ),
        _with_template(
            "podTemplate-trainer-mount-under-config",
            {
                "volumes": [DATA_VOLUME],
                "containers": [
                    trainer(volumeMounts=[{"name": "data", "mountPath": "/etc/trainingjob/data"}])
                ],
            },
            f"{T}.spec.containers",
            "cel",
        ),
        _with_template(
            "podTemplate-trainer-mount-dot-dot",
            {
                "volumes": [DATA_VOLUME],
                "containers": [
                    trainer(volumeMounts=[{"name": "data", "mountPath": "/data/../etc/trainingjob"}])
                ],
            },
            f"{T}.spec.containers",
            "cel",
        ),
        _with_template(
            "podTemplate-trainer-mount-over-checkpoints",
            {
                "volumes": [DATA_VOLUME],
                "containers": [trainer(volumeMounts=[{"name": "data", "mountPath": "/checkpoints"}])],
            },
            f"{T}.spec.containers",
            "cel",
            **checkpointing,
        ),
    ]


def _container_cases() -> list[InvalidCase]:
    return [
        _with_template(
            "podTemplate-sidecar-without-image",
            {"containers": [{"name": "proxy"}]},
            f"{T}.spec.containers[0]",
            "cel",
        ),
        _with_template(
            "podTemplate-init-container-named-trainer",
            {"initContainers": [{"name": contract.CONTAINER_NAME, "image": "busybox"}]},
            f"{T}.spec.initContainers[0].name",
            "cel",
        ),
        _with_template(
            "podTemplate-init-container-without-image",
            {"initContainers": [{"name": "fetch"}]},
            f"{T}.spec.initContainers[0]",
            "cel",
        ),
        _with_template(
            "podTemplate-init-and-sidecar-same-name",
            {"initContainers": [{"name": "proxy", "image": "busybox"}], "containers": [PROXY]},
            f"{T}.spec.initContainers",
            "cel",
        ),
        _with_template(
            "podTemplate-volume-named-config",
            {"volumes": [{"name": contract.CONFIG_VOLUME, "emptyDir": {}}]},
            f"{T}.spec.volumes[0].name",
            "cel",
        ),
        _with_template(
            "podTemplate-mount-of-missing-volume",
            {"containers": [{**PROXY, "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]},
            f"{T}.spec.containers",
            "cel",
        ),
        _with_template(
            "podTemplate-init-mount-of-missing-volume",
            {
                "initContainers": [
                    {"name": "fetch", "image": "busybox", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}
                ]
            },
            f"{T}.spec.initContainers",
            "cel",
        ),
        _with_template(
            "podTemplate-mount-of-the-token-volume-without-it",
            {
                "automountServiceAccountToken": True,
                "containers": [
                    {**PROXY, "volumeMounts": [{"name": contract.TOKEN_VOLUME, "mountPath": "/t"}]}
                ],
            },
            f"{T}.spec.containers",
            "cel",
        ),
        _with_template(
            "podTemplate-trainer-mount-over-the-token",
            {
                "volumes": [DATA_VOLUME],
                "containers": [
                    trainer(volumeMounts=[{"name": "data", "mountPath": contract.TOKEN_MOUNT_PATH}])
                ],
            },
            f"{T}.spec.containers",
            "cel",
        ),
        _with_template(
            "podTemplate-mount-of-checkpoints-without-storage",
            {
                "containers": [
                    {**PROXY, "volumeMounts": [{"name": contract.CHECKPOINT_VOLUME, "mountPath": "/c"}]}
                ]
            },
            f"{T}.spec.containers",
            "cel",
        ),
    ]


def _metadata_cases() -> list[InvalidCase]:
    def meta(id_: str, metadata: dict[str, Any], field: str) -> InvalidCase:
        return case(id_, {T: template(metadata=metadata)}, f"{T}.metadata.{field}", "cel")

    return [
        meta("podTemplate-label-training-job", {"labels": {contract.JOB_NAME_LABEL: "other"}}, "labels"),
        meta("podTemplate-label-operator-prefix", {"labels": {contract.ATTEMPT_LABEL: "3"}}, "labels"),
        meta("podTemplate-label-key-invalid", {"labels": {"team name": "a"}}, "labels"),
        meta(
            "podTemplate-annotation-progress",
            {"annotations": {contract.PROGRESS_ANNOTATION: "{}"}},
            "annotations",
        ),
        meta(
            "podTemplate-owner-references",
            {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "1"}]},
            "ownerReferences",
        ),
    ]


def _transition_cases() -> list[InvalidCase]:
    sidecar = {T: template({"containers": [PROXY]})}
    other = {T: template({"containers": [{**PROXY, "image": "envoyproxy/envoy:v1.32.0"}]})}
    return [
        transition("podTemplate-added", {}, sidecar, T),
        transition("podTemplate-changed", sidecar, other, T),
    ]


def _affinity_and_value_from_cases() -> list[InvalidCase]:
    """Free-form before their schemas were generated: wrong types and unknown kinds now stop at
    admission instead of at the pod create (issue 15)."""
    affinity = "spec.scheduling.affinity"
    required = f"{affinity}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    terms = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Near"}]}]}
    return [
        case(
            "env-valueFrom-fieldRef-string",
            {"spec.env": [{"name": "X", "valueFrom": {"fieldRef": "metadata.name"}}]},
            "spec.env[0].valueFrom.fieldRef",
            "schema",
        ),
        case(
            "affinity-term-string",
            {affinity: {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "a"}}},
            required,
            "schema",
        ),
        case(
            "affinity-operator-unknown",
            {affinity: {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}}},
            f"{required}.nodeSelectorTerms[0].matchExpressions[0].operator",
            "schema",
        ),
        case(
            "affinity-misspelled-kind",
            {affinity: {"nodeAfinity": {}}},
            f"{affinity}.nodeAfinity",
            "unknown-field",
        ),
        case(
            "env-valueFrom-unknown-source",
            {"spec.env": [{"name": "X", "valueFrom": {"vaultRef": {"path": "x"}}}]},
            "spec.env[0].valueFrom.vaultRef",
            "unknown-field",
        ),
        case(
            "env-valueFrom-empty",
            {"spec.env": [{"name": "TOKEN", "valueFrom": {}}]},
            "spec.env[0].valueFrom",
            "cel",
        ),
    ]


def embedded_type_cases() -> list[InvalidCase]:
    return [
        *_affinity_and_value_from_cases(),
        *_schema_cases(),
        *_list_cases(),
        *_unknown_field_cases(),
        *_owned_field_cases(),
        *_trainer_cases(),
        *_container_cases(),
        *_metadata_cases(),
        *_transition_cases(),
    ]


def podtemplate_manifests() -> dict[str, dict[str, Any]]:
    """Templates the API server must accept: every kind of setting the template is for."""
    byo = template(
        {
            "volumes": [
                DATA_VOLUME,
                {"name": "code", "configMap": {"name": "training-code"}},
                {"name": "cache", "emptyDir": {"sizeLimit": "20Gi"}},
            ],
            "imagePullSecrets": [{"name": "registry-credentials"}],
            "runtimeClassName": "nvidia",
            "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
            "shareProcessNamespace": True,
            "terminationGracePeriodSeconds": 120,
            "containers": [
                trainer(
                    volumeMounts=[
                        {"name": "data", "mountPath": "/data", "readOnly": True},
                        {"name": "code", "mountPath": "/code"},
                        {"name": "cache", "mountPath": "/root/.cache"},
                    ],
                    env=[{"name": "HF_HOME", "value": "/root/.cache/huggingface"}],
                    envFrom=[{"secretRef": {"name": "wandb"}}],
                    imagePullPolicy="Always",
                    resources={"requests": {"cpu": "4", "memory": "16Gi"}},
                    ports=[{"containerPort": 6006, "name": "tensorboard"}],
                    readinessProbe={"tcpSocket": {"port": 29500}},
                    lifecycle={"preStop": {"sleep": {"seconds": 5}}},
                ),
                {**PROXY, "ports": [{"containerPort": 15090, "name": "http-envoy-prom"}]},
            ],
            "initContainers": [
                {
                    "name": "fetch-data",
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", "ls /data"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                },
                {"name": "log-shipper", "image": "fluent/fluent-bit:3.1", "restartPolicy": "Always"},
            ],
        },
        metadata={"labels": {"team": "vision"}, "annotations": {"sidecar.istio.io/inject": "true"}},
    )
    checkpoint_reader = template(
        {"containers": [{**PROXY, "volumeMounts": [{"name": contract.CHECKPOINT_VOLUME, "mountPath": "/c"}]}]}
    )
    token_reader = template(
        {"containers": [{**PROXY, "volumeMounts": [{"name": contract.TOKEN_VOLUME, "mountPath": "/t"}]}]}
    )
    return {
        "podTemplate-bring-your-own": job({T: byo}),
        "podTemplate-sidecar-mounts-the-token": job({T: token_reader}),
        "podTemplate-token-mounted-everywhere": job({T: template({"automountServiceAccountToken": True})}),
        "podTemplate-no-token": job({T: template({"automountServiceAccountToken": False})}),
        "podTemplate-sidecar-reads-checkpoints": job({T: checkpoint_reader, "spec.checkpoint.enabled": True}),
        "podTemplate-empty": job({T: {}}),
    }
