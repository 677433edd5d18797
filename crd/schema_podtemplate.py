"""The schema of spec.podTemplate: the generated core/v1 PodTemplateSpec plus the operator's rules.

A podTemplate is a partial pod that the operator merges onto each worker pod it builds
(builders/podtemplate.py). Its shape is Kubernetes' own (crd/kube_schemas.json, generated from the API
server's OpenAPI), so wrong types are refused at admission exactly as the Pod API would refuse them.
What this module adds are the rules that make the merge safe: the fields the operator owns (the
trainer's name, image, command, distributed environment and ports, the pod's restart policy, host name,
service account, owner references and scheduling, which spec.scheduling states) are refused with a
message naming the field, and mistakes the Pod API would only report when the pod is created (a mount
of a volume nobody defines, a sidecar without an image, a volume named like one of the operator's)
are refused before the job is stored.

Rules that need other spec fields (the checkpoint volume, the master and metrics ports) sit on the
spec object and are built by `spec_rules`.
"""

from __future__ import annotations

from crd import contract
from crd.kube_schemas import schema
from crd.openapi import Rule, Schema, rule
from crd.schema_parts import cel_list

TRAINER = contract.CONTAINER_NAME
TEMPLATE = "spec.podTemplate"

# Label keys and values as the API server checks them (a qualified name; a value of up to 63 characters).
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

# Pod fields the operator sets, or that repeat a spec field with its own meaning: refused, and why.
OWNED_POD_FIELDS: dict[str, str] = {
    "restartPolicy": "is set by the operator (Never): a failed worker is restarted with its whole gang, "
    "as spec.failurePolicy says",
    "hostname": "is set by the operator: each worker is <job>-worker-<index> under the job's headless "
    "Service, which the distributed environment names",
    "hostnameOverride": "cannot be set: the operator names each worker <job>-worker-<index>, which the "
    "distributed environment names",
    "subdomain": "is set by the operator: the job's headless Service",
    "nodeName": "cannot be set: workers are placed by the scheduler (spec.scheduling)",
    "serviceAccountName": "cannot be set here: use spec.serviceAccountName",
    "schedulerName": "cannot be set here: use spec.scheduling.schedulerName (gang scheduling sets it too)",
    "priorityClassName": "cannot be set here: use spec.scheduling.priority",
    "priority": "cannot be set: the API server computes it from spec.scheduling.priority",
    "nodeSelector": "cannot be set here: use spec.scheduling.nodeSelector",
    "affinity": "cannot be set here: use spec.scheduling.affinity",
    "tolerations": "cannot be set here: use spec.scheduling.tolerations",
    "activeDeadlineSeconds": "cannot be set here: use spec.failurePolicy.activeDeadlineSeconds, which "
    "ends the whole job",
}
# Fields of the trainer container that spec fields state.
OWNED_TRAINER_FIELDS: dict[str, str] = {"image": "spec.image", "command": "spec.command", "args": "spec.args"}


def _operator_key(key: str, exact: tuple[str, ...]) -> str:
    return f"({key} in {cel_list(exact)} || {key}.startsWith('{contract.OPERATOR_KEY_PREFIX}'))"


def _metadata_rules(metadata: Schema) -> None:
    properties = metadata["properties"]
    labels, annotations = properties["labels"], properties["annotations"]
    labels["additionalProperties"]["pattern"] = LABEL_VALUE_PATTERN
    operator_labels = ", ".join(contract.OPERATOR_LABELS)
    labels["x-kubernetes-validations"] = [
        rule(
            f"self.all(k, !{_operator_key('k', contract.OPERATOR_LABELS)})",
            message=f"{TEMPLATE}.metadata.labels: {operator_labels} and {contract.OPERATOR_KEY_PREFIX}* "
            "are set by the operator",
        ),
        rule(
            f"self.all(k, k.matches('{QUALIFIED_NAME_PATTERN}'))",
            message=f"{TEMPLATE}.metadata.labels: a key must be a qualified name ([prefix/]name, the name "
            "at most 63 characters of letters, digits, '-', '_' and '.')",
        ),
    ]
    annotations["x-kubernetes-validations"] = [
        rule(
            f"self.all(k, !{_operator_key('k', contract.OPERATOR_ANNOTATIONS)})",
            message=f"{TEMPLATE}.metadata.annotations: {', '.join(contract.OPERATOR_ANNOTATIONS)} and "
            f"{contract.OPERATOR_KEY_PREFIX}* are set by the operator",
        ),
        rule(
            f"self.all(k, k.matches('{QUALIFIED_NAME_PATTERN}'))",
            message=f"{TEMPLATE}.metadata.annotations: a key must be a qualified name ([prefix/]name)",
        ),
    ]
    metadata["description"] = (
        "Labels and annotations added to every worker pod, next to the operator's own (which they may not "
        "set). Other metadata (name, namespace, owner references) is the operator's."
    )
    metadata["x-kubernetes-validations"] = [
        rule(
            "!has(self.ownerReferences)",
            message=f"{TEMPLATE}.metadata.ownerReferences is set by the operator: every worker pod is "
            "owned by its TrainingJob",
            field_path=".ownerReferences",
        )
    ]


def _owned_field_rules() -> list[Rule]:
    return [
        rule(f"!has(self.{field})", message=f"{TEMPLATE}.spec.{field} {why}", field_path=f".{field}")
        for field, why in OWNED_POD_FIELDS.items()
    ]


def _reserved_env() -> str:
    prefixes = " && ".join(f"!e.name.startsWith('{p}')" for p in contract.RESERVED_ENV_PREFIXES)
    return f"!(e.name in {cel_list(contract.RESERVED_ENV_NAMES)}) && {prefixes}"


def _container_rules() -> list[Rule]:
    is_sidecar = f"self.name != '{TRAINER}'"
    rules = [
        rule(
            f"{is_sidecar} || !has(self.{field})",
            message=f"{TEMPLATE}.spec.containers[{TRAINER}].{field} cannot be set here: use {spec_field}",
            field_path=f".{field}",
        )
        for field, spec_field in OWNED_TRAINER_FIELDS.items()
    ]
    gpu = f"'{contract.GPU_RESOURCE}'"
    rules += [
        rule(
            f"{is_sidecar} || !has(self.env) || self.env.all(e, {_reserved_env()})",
            message=f"{TEMPLATE}.spec.containers[{TRAINER}].env: a variable the operator sets cannot be set "
            "(see kubectl explain trainingjob.spec.env)",
            field_path=".env",
        ),
        rule(
            f"{is_sidecar} || !has(self.resources) || "
            f"((!has(self.resources.limits) || !({gpu} in self.resources.limits)) && "
            f"(!has(self.resources.requests) || !({gpu} in self.resources.requests)))",
            message=f"{TEMPLATE}.spec.containers[{TRAINER}].resources: {contract.GPU_RESOURCE} is set from "
            "spec.gpusPerWorker",
            field_path=".resources",
        ),
        rule(
            f"self.name == '{TRAINER}' || has(self.image)",
            message_expression=f"'{TEMPLATE}.spec.containers[' + self.name + ']: a sidecar needs an image'",
        ),
    ]
    return rules


def _init_container_rules() -> list[Rule]:
    return [
        rule(
            f"self.name != '{TRAINER}'",
            message=f"{TEMPLATE}.spec.initContainers: {TRAINER} is the name of the operator's trainer "
            "container",
            field_path=".name",
        ),
        rule(
            "has(self.image)",
            message_expression=f"'{TEMPLATE}.spec.initContainers[' + self.name + ']: an image is required'",
        ),
    ]


def _volume_rules() -> list[Rule]:
    return [
        rule(
            f"!(self.name in {cel_list(contract.OPERATOR_VOLUMES)})",
            message_expression=(
                f"'{TEMPLATE}.spec.volumes: ' + self.name + ' is a volume of the operator "
                f"({', '.join(contract.OPERATOR_VOLUMES)}); mount it, or name yours differently'"
            ),
            field_path=".name",
        )
    ]


def _spec_rules() -> list[Rule]:
    return [
        *_owned_field_rules(),
        rule(
            "!has(self.initContainers) || !has(self.containers) || "
            "self.initContainers.all(i, !self.containers.exists(c, c.name == i.name))",
            message=f"{TEMPLATE}.spec: an init container and a container have the same name",
            field_path=".initContainers",
        ),
    ]


def _describe(spec: Schema) -> None:
    properties = spec["properties"]
    properties["containers"]["description"] = (
        f"Containers merged by name onto the worker pod's. The one named {TRAINER} overrides settings of "
        "the operator's trainer container (volumeMounts, env, envFrom, ports, resources other than "
        f"{contract.GPU_RESOURCE}, securityContext, probes, lifecycle, imagePullPolicy, ...); its image, "
        "command and args come from spec.image, spec.command and spec.args. Any other container is a "
        "sidecar added after the trainer."
    )
    properties["initContainers"]["description"] = (
        "Init containers of every worker pod, in order. One with restartPolicy Always is a native "
        "sidecar: it starts before the trainer and runs beside it."
    )
    properties["volumes"]["description"] = (
        "Volumes added to every worker pod (datasets, code, caches). They may not take the names of the "
        f"operator's volumes ({', '.join(contract.OPERATOR_VOLUMES)}), which containers may mount. The "
        "deprecated in-tree volume types are left out: use their CSI drivers."
    )
    for field, why in OWNED_POD_FIELDS.items():
        properties[field]["description"] = f"Refused at admission: {field} {why}."
    properties["automountServiceAccountToken"]["description"] = (
        "Unset: the pod's ServiceAccount token (bound to the pod) is mounted into the trainer container "
        f"only, from the operator's volume {contract.TOKEN_VOLUME}, so sidecars and init containers get "
        "none. Set: Kubernetes decides as for any pod (true mounts the token into every container, false "
        "into none: the trainer's progress reports then need a token of their own)."
    )
    for field, spec_field in OWNED_TRAINER_FIELDS.items():
        container = properties["containers"]["items"]["properties"][field]
        container["description"] = (
            f"{container['description']} Not for the {TRAINER} container: use {spec_field}."
        )
    owned = ", ".join(OWNED_POD_FIELDS)
    spec["description"] = (
        "Pod settings merged onto every worker pod as a strategic merge patch would: lists merged by their "
        "keys (containers, initContainers, volumes, imagePullSecrets by name; env by name; ports by "
        "containerPort; volumeMounts by mountPath), maps merged, the template's scalars winning. Refused "
        f"here: {owned} (the operator's, or stated by spec fields)."
    )


def pod_template() -> Schema:
    """spec.podTemplate: a partial core/v1 PodTemplateSpec with the operator's rules."""
    template = schema("PodTemplateSpec")
    template["description"] = (
        "A partial pod template merged onto every worker pod the operator builds: labels and annotations, "
        "volumes, image pull secrets, security contexts, init containers and sidecars, runtime class, DNS "
        f"settings, and overrides of the trainer container (the container named {TRAINER}). Its schema is "
        "Kubernetes' own PodTemplateSpec. Immutable."
    )
    properties = template["properties"]
    _metadata_rules(properties["metadata"])
    spec = properties["spec"]
    spec.pop("required", None)  # a partial pod: the operator provides the trainer container
    _describe(spec)
    spec["x-kubernetes-validations"] = _spec_rules()
    spec_properties = spec["properties"]
    spec_properties["containers"]["items"]["x-kubernetes-validations"] = _container_rules()
    spec_properties["initContainers"]["items"]["x-kubernetes-validations"] = _init_container_rules()
    spec_properties["volumes"]["items"]["x-kubernetes-validations"] = _volume_rules()
    return template


# ------------------------------------------------------------------------- rules on the spec object

SPEC_TEMPLATE = "self.podTemplate.spec"
HAS_TEMPLATE_SPEC = f"has(self.podTemplate) && has({SPEC_TEMPLATE})"


def _checkpoint_in_use() -> str:
    return (
        "has(self.checkpoint) && ((has(self.checkpoint.enabled) && self.checkpoint.enabled) || "
        "(has(self.checkpoint.resumeFrom) && self.checkpoint.resumeFrom != ''))"
    )


def _storage_type() -> str:
    return (
        "(has(self.checkpoint.storage) && has(self.checkpoint.storage.type) ? "
        "self.checkpoint.storage.type : 'pvc')"
    )


def checkpoint_volume_in_use() -> str:
    """CEL: the operator mounts a checkpoint volume (pvc or nfs storage in use)."""
    return f"({_checkpoint_in_use()} && {_storage_type()} in ['pvc', 'nfs'])"


def _gcs_credentials_in_use() -> str:
    return (
        f"({_checkpoint_in_use()} && {_storage_type()} == 'gcs' && has(self.checkpoint.storage.gcs) && "
        "has(self.checkpoint.storage.gcs.credentialsSecret))"
    )


def _token_volume_in_use() -> str:
    return f"!({HAS_TEMPLATE_SPEC} && has({SPEC_TEMPLATE}.automountServiceAccountToken))"


def _known_volume(name: str) -> str:
    always = cel_list((contract.CONFIG_VOLUME, contract.SHM_VOLUME))
    return (
        f"{name} in {always} || "
        f"({name} == '{contract.TOKEN_VOLUME}' && {_token_volume_in_use()}) || "
        f"({name} == '{contract.CHECKPOINT_VOLUME}' && {checkpoint_volume_in_use()}) || "
        f"({name} == '{contract.GCS_CREDENTIALS_VOLUME}' && {_gcs_credentials_in_use()}) || "
        f"({name} == '{contract.MPI_VOLUME}' && has(self.framework) && self.framework == 'mpi') || "
        f"(has({SPEC_TEMPLATE}.volumes) && {SPEC_TEMPLATE}.volumes.exists(v, v.name == {name}))"
    )


def _mounts_rule(kind: str) -> Rule:
    return rule(
        f"!({HAS_TEMPLATE_SPEC}) || !has({SPEC_TEMPLATE}.{kind}) || {SPEC_TEMPLATE}.{kind}.all(c, "
        f"!has(c.volumeMounts) || c.volumeMounts.all(m, {_known_volume('m.name')}))",
        message=(
            f"{TEMPLATE}.spec.{kind}[].volumeMounts: a mount names a volume that is not defined: define "
            f"it in {TEMPLATE}.spec.volumes, or mount one of the operator's ({contract.CONFIG_VOLUME}, "
            f"{contract.SHM_VOLUME}; {contract.CHECKPOINT_VOLUME} with pvc or nfs checkpoint storage; "
            f"{contract.GCS_CREDENTIALS_VOLUME} with a GCS credentials Secret; {contract.TOKEN_VOLUME} "
            f"unless automountServiceAccountToken is set; {contract.MPI_VOLUME} with framework mpi)"
        ),
        field_path=f".podTemplate.spec.{kind}",
    )


def _trainer_rule(condition: str, message: str) -> Rule:
    return rule(
        f"!({HAS_TEMPLATE_SPEC}) || !has({SPEC_TEMPLATE}.containers) || "
        f"{SPEC_TEMPLATE}.containers.all(c, c.name != '{TRAINER}' || {condition})",
        message=message,
        field_path=".podTemplate.spec.containers",
    )


def _trainer_ports_rule() -> Rule:
    master = (
        "(!has(self.networking) || !has(self.networking.masterPort) || p.containerPort != "
        "self.networking.masterPort)"
    )
    metrics = (
        "(!has(self.monitoring) || !has(self.monitoring.enabled) || !self.monitoring.enabled || "
        "!has(self.monitoring.metricsPort) || p.containerPort != self.monitoring.metricsPort)"
    )
    names = f"(!has(p.name) || !(p.name in {cel_list(contract.OPERATOR_PORT_NAMES)}))"
    return _trainer_rule(
        f"!has(c.ports) || c.ports.all(p, {names} && {master} && {metrics})",
        f"{TEMPLATE}.spec.containers[{TRAINER}].ports: the operator's ports (named "
        f"{' and '.join(contract.OPERATOR_PORT_NAMES)}: networking.masterPort, and monitoring.metricsPort "
        "when monitoring is enabled) cannot be set",
    )


def _trainer_mounts_rule() -> Rule:
    reserved = cel_list(contract.RESERVED_MOUNT_PATHS)
    under = "(m.mountPath == p || m.mountPath.startsWith(p + '/'))"
    mount_path = "self.checkpoint.mountPath"
    checkpoint = (
        f"(!{checkpoint_volume_in_use()} || !has({mount_path}) || "
        f"(m.mountPath != {mount_path} && !m.mountPath.startsWith({mount_path} + '/')))"
    )
    normal = "!m.mountPath.matches('//|/\\\\.\\\\.?(/|$)')"
    return _trainer_rule(
        f"!has(c.volumeMounts) || c.volumeMounts.all(m, {normal} && "
        f"!{reserved}.exists(p, {under}) && {checkpoint})",
        f"{TEMPLATE}.spec.containers[{TRAINER}].volumeMounts: a mountPath must be a normalised path outside "
        f"the operator's mounts ({', '.join(contract.RESERVED_MOUNT_PATHS)} and checkpoint.mountPath)",
    )


def spec_rules() -> list[Rule]:
    """The rules of spec.podTemplate that read other spec fields, for the spec object."""
    return [
        _mounts_rule("containers"),
        _mounts_rule("initContainers"),
        _trainer_ports_rule(),
        _trainer_mounts_rule(),
    ]
