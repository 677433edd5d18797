"""What a TrainingJob asks its pods to do beyond a tenant's ordinary rights, listed by field path.

Why: the operator creates a job's pods with its own identity, so without a check anyone who may create
a TrainingJob could have the operator make a host-level pod, or run code under a more powerful
ServiceAccount of the namespace: a confused deputy. The admission policy `trainingjob-escalation`
(crd/escalation_policy.py renders it from crd/escalation_cel.py) refuses those settings to a requester
who could not make such a pod directly, and refuses pods the namespace's Pod Security level would refuse
anyway. This module lists the same findings in Python: for the operator, so that it can refuse to
start a job carrying such settings while the policy is missing from the cluster (fail closed), and for
the tests, which put the same cases through both and compare the lists.

What escalates (every control of the "baseline" Pod Security Standard that a job can carry, as
kube-apiserver 1.34's PodSecurity admission checks it; each with why it is in, or out):
- host namespaces (hostNetwork, hostPID, hostIPC), privileged containers, Windows hostProcess: the
  node's network, processes, IPC or the whole host;
- capabilities added beyond the baseline's default set (SYS_ADMIN, NET_ADMIN, ...), and
  networking.rdmaEnabled, with which the operator adds IPC_LOCK (RDMA_CAPABILITIES) to the trainer;
- hostPath volumes and hostPorts: the node's files and ports;
- seccomp Unconfined, an AppArmor profile other than the runtime's default or a local one (the field or
  the deprecated annotation), SELinux options other than the container types (or any user or role), a
  procMount other than Default: each turns off a confinement the runtime gives every container;
- sysctls outside the baseline's namespaced safe set: they change the node's kernel for everyone;
- a probe's or lifecycle handler's `host` (baseline since 1.34): the kubelet would connect anywhere on
  the job's behalf;
- spec.serviceAccountName naming another account than the trainers' own (TRAINER_ACCOUNT, the default):
  the pods get that account's token and its rights.
Out: what "baseline" allows (running as root, the default capabilities, other volume types, Secrets and
claims of the namespace: a tenant can read what any workload of the namespace can), and the
"restricted"-only controls, which matter only where the namespace enforces "restricted": then
`pod_security_violations` lists them, judging the pods as the operator builds them (its defaults in
crd/contract.py: the pod's seccomp profile, the trainer's dropped capabilities, no privilege escalation,
and its non-root user where it knows the image allows it). Ephemeral containers and the seccomp
annotations are out: the template cannot carry the former, and PodSecurity checks the latter only for
versions before 1.19.

Findings are strings: a field path, and `=value` where the value says what was asked
(`spec.podTemplate.spec.containers[0].securityContext.capabilities.add=SYS_ADMIN`). A list is judged per
container: its values that escalate, joined by commas. The order is the policy's (crd/escalation_cel.py
builds each list in the same order), so the policy's message and `escalation_message` are one string.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from crd import contract
from crd.kube_schemas import schema

JsonDict = Mapping[str, Any]

POLICY_NAME: Final = contract.ESCALATION_POLICY
# What a platform team grants instead of pod creation (docs/security.md): the verb `use` on
# `trainingjobs/privileged` lets a user's jobs carry the settings above the baseline (a subresource no
# rule on `trainingjobs` grants, not even one of every verb: it has to be named); the verb `use` on
# `serviceaccounts`, with the account's name as resourceName, lets a user's jobs run as that account
# (whoever holds every verb there may impersonate the account anyway).
USE_VERB: Final = "use"
PRIVILEGED_SUBRESOURCE: Final = "privileged"
PRIVILEGED_RESOURCE: Final = f"{contract.PLURAL}/{PRIVILEGED_SUBRESOURCE}"

TEMPLATE: Final = "spec.podTemplate.spec"
CONTAINER_KINDS: Final = ("containers", "initContainers")
ENFORCE_LABEL: Final = "pod-security.kubernetes.io/enforce"
BASELINE: Final = "baseline"
RESTRICTED: Final = "restricted"

# The "baseline" standard's allowed values (PodSecurity admission, the latest version).
BASELINE_CAPABILITIES: Final = (
    *("AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE"),
    *("SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"),
)
SAFE_SYSCTLS: Final = (
    *("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start"),
    *("net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports"),
    *("net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl"),
    *("net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"),
)
CONFINED_PROFILE_TYPES: Final = ("RuntimeDefault", "Localhost")
SELINUX_TYPES: Final = ("", "container_t", "container_init_t", "container_kvm_t", "container_engine_t")
APPARMOR_ANNOTATION_PREFIX: Final = "container.apparmor.security.beta.kubernetes.io/"
PROBES: Final = ("livenessProbe", "readinessProbe", "startupProbe")
PROBE_HANDLERS: Final = ("httpGet", "tcpSocket")
LIFECYCLE_HOOKS: Final = ("postStart", "preStop")
# "restricted": the volume types it allows, and the one capability a container may add.
RESTRICTED_VOLUME_TYPES: Final = (
    *("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "image", "persistentVolumeClaim"),
    *("projected", "secret"),
)
RESTRICTED_ADDABLE_CAPABILITY: Final = "NET_BIND_SERVICE"
WINDOWS: Final = "windows"


def _template_volume_types() -> tuple[str, ...]:
    properties = schema("PodTemplateSpec")["properties"]["spec"]["properties"]["volumes"]["items"]
    return tuple(sorted(set(properties["properties"]) - {"name"}))


# The volume types the template accepts that "restricted" forbids (hostPath is baseline's finding).
UNRESTRICTED_VOLUME_TYPES: Final = tuple(
    kind for kind in _template_volume_types() if kind not in (*RESTRICTED_VOLUME_TYPES, "hostPath")
)
# The checkpoint storage types the operator mounts as a volume of the same kind (builders/pods.py).
CHECKPOINT_VOLUME_TYPES: Final = {"pvc": "persistentVolumeClaim", "nfs": "nfs"}


def _get(value: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class _Pod:
    """The parts of a TrainingJob spec that become its pods, as the policy's variables name them."""

    def __init__(self, spec: JsonDict) -> None:
        self.spec = spec
        self.template: JsonDict = _get(spec, "podTemplate", "spec") or {}
        self.context: JsonDict = self.template.get("securityContext") or {}
        self.annotations: JsonDict = _get(spec, "podTemplate", "metadata", "annotations") or {}
        self.windows = _get(self.template, "os", "name") == WINDOWS
        trainers = [
            c for c in self.template.get("containers") or [] if c.get("name") == contract.CONTAINER_NAME
        ]
        self.trainer: JsonDict | None = trainers[0] if trainers else None

    def containers(self, kind: str) -> list[JsonDict]:
        return list(self.template.get(kind) or [])

    def each(self, kind: str) -> Iterator[tuple[str, JsonDict]]:
        """(path, container) of `kind`, the index as the policy finds it: that of the first container
        of its name (containers are a list-map of names)."""
        names = [container.get("name") for container in self.containers(kind)]
        for container in self.containers(kind):
            yield f"{TEMPLATE}.{kind}[{names.index(container.get('name'))}]", container


Control = Callable[[_Pod], list[str]]


# ----------------------------------------------------------------------------- the baseline's controls


def _host_namespaces(pod: _Pod) -> list[str]:
    return [
        f"{TEMPLATE}.{field}=true"
        for field in ("hostNetwork", "hostPID", "hostIPC")
        if pod.template.get(field)
    ]


def _bad_profile(context: JsonDict, field: str) -> str | None:
    kind = _get(context, field, "type")
    return None if kind is None or kind in CONFINED_PROFILE_TYPES else str(kind)


def _context_findings(path: str, context: JsonDict) -> list[str]:
    """A securityContext's (the pod's or a container's) settings that leave the baseline."""
    found = []
    if _get(context, "windowsOptions", "hostProcess") is True:
        found.append(f"{path}.windowsOptions.hostProcess=true")
    selinux = context.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in SELINUX_TYPES:
        found.append(f"{path}.seLinuxOptions.type={selinux['type']}")
    found += [f"{path}.seLinuxOptions.{key}={selinux[key]}" for key in ("user", "role") if selinux.get(key)]
    for field in ("seccompProfile", "appArmorProfile"):
        bad = _bad_profile(context, field)
        if bad is not None:
            found.append(f"{path}.{field}.type={bad}")
    return found


def _pod_context(pod: _Pod) -> list[str]:
    path = f"{TEMPLATE}.securityContext"
    sysctls = list(pod.context.get("sysctls") or [])
    return _context_findings(path, pod.context) + [
        f"{path}.sysctls[{sysctls.index(s)}].name={s.get('name')}"
        for s in sysctls
        if s.get("name") not in SAFE_SYSCTLS
    ]


def _host_paths(pod: _Pod) -> list[str]:
    volumes = pod.containers("volumes")
    return [f"{TEMPLATE}.volumes[{volumes.index(v)}].hostPath" for v in volumes if "hostPath" in v]


def _per_container(find: Callable[[str, JsonDict], list[str]]) -> Control:
    """A control judged per container: containers first, then init containers, each in order."""

    def control(pod: _Pod) -> list[str]:
        return [
            finding for kind in CONTAINER_KINDS for path, c in pod.each(kind) for finding in find(path, c)
        ]

    return control


def _container_context(path: str, container: JsonDict) -> list[str]:
    context = container.get("securityContext") or {}
    found = [f"{path}.securityContext.privileged=true"] if context.get("privileged") is True else []
    added = [cap for cap in _get(context, "capabilities", "add") or [] if cap not in BASELINE_CAPABILITIES]
    if added:
        found.append(f"{path}.securityContext.capabilities.add={','.join(added)}")
    found += _context_findings(f"{path}.securityContext", context)
    if context.get("procMount", "Default") != "Default":
        found.append(f"{path}.securityContext.procMount={context['procMount']}")
    return found


def _host_ports(path: str, container: JsonDict) -> list[str]:
    """A port's index is that of the first port of its key (containerPort, protocol), as the policy's."""
    ports = list(container.get("ports") or [])
    keys = [(p.get("containerPort"), p.get("protocol", "TCP")) for p in ports]
    found = [
        f"{path}.ports[{keys.index(key)}].hostPort={p['hostPort']}"
        for p, key in zip(ports, keys, strict=True)
        if p.get("hostPort")
    ]
    return [", ".join(found)] if found else []


def _handler_hosts(path: str, container: JsonDict) -> list[str]:
    found = [
        f"{path}.{probe}.{handler}.host={host}"
        for probe in PROBES
        for handler in PROBE_HANDLERS
        if (host := _get(container, probe, handler, "host"))
    ]
    found += [
        f"{path}.lifecycle.{hook}.httpGet.host={host}"
        for hook in LIFECYCLE_HOOKS
        if (host := _get(container, "lifecycle", hook, "httpGet", "host"))
    ]
    return found


def _apparmor_annotations(pod: _Pod) -> list[str]:
    """The deprecated AppArmor annotations, in the template's order (the policy iterates a map, whose
    order is not defined: with more than one such annotation the message may list them differently)."""
    return [
        f"spec.podTemplate.metadata.annotations[{key}]={value}"
        for key, value in pod.annotations.items()
        if key.startswith(APPARMOR_ANNOTATION_PREFIX)
        and not (value in ("", "runtime/default") or str(value).startswith("localhost/"))
    ]


def _rdma(pod: _Pod) -> list[str]:
    """RDMA adds IPC_LOCK to the trainer, unless the template's trainer states its own capabilities.add
    (a merge replaces the operator's list)."""
    rdma = _get(pod.spec, "networking", "rdmaEnabled") is True
    replaced = (
        pod.trainer is not None and _get(pod.trainer, "securityContext", "capabilities", "add") is not None
    )
    return ["spec.networking.rdmaEnabled=true"] if rdma and not replaced else []


BASELINE_CONTROLS: Final[tuple[Control, ...]] = (
    _host_namespaces,
    _pod_context,
    _host_paths,
    _per_container(_container_context),
    _per_container(_host_ports),
    _per_container(_handler_hosts),
    _apparmor_annotations,
    _rdma,
)


def pod_escalations(spec: JsonDict) -> list[str]:
    """The settings of `spec` (a TrainingJob's spec, as stored) that give its pods more than the
    "baseline" Pod Security Standard allows, each a field path and what it asks for."""
    pod = _Pod(spec)
    return [finding for control in BASELINE_CONTROLS for finding in control(pod)]


def service_account_escalation(spec: JsonDict) -> str | None:
    """`spec.serviceAccountName=<name>` when the pods run as an account other than the trainers' own."""
    name = spec.get("serviceAccountName") or ""
    return None if name in ("", contract.TRAINER_ACCOUNT) else f"spec.serviceAccountName={name}"


def escalations(spec: JsonDict) -> list[str]:
    """Everything in `spec` that needs a right beyond creating TrainingJobs (the pod settings above the
    baseline, then another ServiceAccount): what the operator must not start without the policy."""
    account = service_account_escalation(spec)
    return pod_escalations(spec) + ([account] if account else [])


# --------------------------------------------------------------------- "restricted", as the pods are built


def checkpoint_volume_type(spec: JsonDict) -> str | None:
    """The volume type of the checkpoint volume the operator mounts into the trainer, if any."""
    checkpoint = spec.get("checkpoint") or {}
    if not (checkpoint.get("enabled") is True or checkpoint.get("resumeFrom")):
        return None
    return CHECKPOINT_VOLUME_TYPES.get(_get(checkpoint, "storage", "type") or "pvc")


# The operator's own volumes in the trainer, by name: their types (the checkpoint volume's is the storage's).
OPERATOR_VOLUME_TYPES: Final = {
    contract.CONFIG_VOLUME: "configMap",
    contract.SHM_VOLUME: "emptyDir",
    contract.GCS_CREDENTIALS_VOLUME: "secret",
    contract.TOKEN_VOLUME: "projected",
}


def _writable_mount_types(pod: _Pod) -> list[str]:
    """The volume types of the trainer's mounts a process could write to, as far as the spec says."""
    types = [checkpoint_volume_type(pod.spec) or ""] if checkpoint_volume_type(pod.spec) else []
    volumes = {v.get("name"): next((k for k in v if k != "name"), "") for v in pod.containers("volumes")}
    for mount in (pod.trainer or {}).get("volumeMounts") or []:
        if mount.get("readOnly") is not True:
            name = mount.get("name")
            types.append(OPERATOR_VOLUME_TYPES.get(name) or volumes.get(name) or "")
    return types


def operator_sets_non_root(spec: JsonDict) -> bool:
    """Whether the operator runs the trainer as a non-root user (builders/podsecurity.py): no user or
    group in the template, and either an MPI job (whose SSH servers need an ordinary user) or its
    reference trainer in a framework's default image with nothing writable mounted whose owner it
    cannot know."""
    pod = _Pod(spec)
    image = spec.get("image")
    command = spec.get("command")
    trainer_context = (pod.trainer or {}).get("securityContext") or {}
    no_identity = not any(field in pod.context for field in contract.NON_ROOT_POD_FIELDS) and not any(
        field in trainer_context for field in contract.NON_ROOT_CONTAINER_FIELDS
    )
    reference_trainer = (
        (image is None or image in contract.NON_ROOT_IMAGES)
        and (command is None or tuple(command) in contract.NON_ROOT_COMMANDS)
        and all(kind in contract.NON_ROOT_VOLUME_TYPES for kind in _writable_mount_types(pod))
    )
    return no_identity and (spec.get("framework") == "mpi" or reference_trainer)


def _restricted_volumes(pod: _Pod) -> list[str]:
    volumes = pod.containers("volumes")
    found = [
        f"{TEMPLATE}.volumes[{volumes.index(v)}].{','.join(k for k in UNRESTRICTED_VOLUME_TYPES if k in v)}"
        for v in volumes
        if any(kind in v for kind in UNRESTRICTED_VOLUME_TYPES)
    ]
    if checkpoint_volume_type(pod.spec) == "nfs":
        found.append("spec.checkpoint.storage.type=nfs")
    return found


def _is_trainer(kind: str, container: JsonDict) -> bool:
    return kind == "containers" and container.get("name") == contract.CONTAINER_NAME


def _escalation_and_capabilities(pod: _Pod) -> list[str]:
    """No privilege escalation, ALL dropped, nothing added but NET_BIND_SERVICE (the baseline's finding
    names the capabilities it forbids); the trainer has the operator's defaults where the template sets
    nothing. PodSecurity exempts Windows pods. (A privileged trainer gets no allowPrivilegeEscalation
    from the operator, which the Pod API requires: that job has the baseline's finding already.)"""
    if pod.windows:
        return []
    found = []
    for kind in CONTAINER_KINDS:
        for path, container in pod.each(kind):
            trainer = _is_trainer(kind, container)
            context = container.get("securityContext") or {}
            escalation = context.get("allowPrivilegeEscalation")
            if (
                contract.ALLOW_PRIVILEGE_ESCALATION if escalation is None and trainer else escalation
            ) is not False:
                found.append(f"{path}.securityContext.allowPrivilegeEscalation must be false")
    for kind in CONTAINER_KINDS:
        for path, container in pod.each(kind):
            capabilities = _get(container, "securityContext", "capabilities") or {}
            dropped = capabilities.get("drop")
            if dropped is None and _is_trainer(kind, container):
                dropped = contract.DROPPED_CAPABILITIES
            if "ALL" not in (dropped or []):
                found.append(f"{path}.securityContext.capabilities.drop must include ALL")
            added = [
                cap
                for cap in capabilities.get("add") or []
                if cap in BASELINE_CAPABILITIES and cap != RESTRICTED_ADDABLE_CAPABILITY
            ]
            if added:
                found.append(f"{path}.securityContext.capabilities.add={','.join(added)}")
    return found


def _unset_non_root(pod: _Pod) -> list[str]:
    """The containers, by name, that run as whatever user their image says."""
    names = [
        str(container.get("name"))
        for kind in CONTAINER_KINDS
        for _, container in pod.each(kind)
        if _get(container, "securityContext", "runAsNonRoot") is None
        and not (_is_trainer(kind, container) and operator_sets_non_root(pod.spec))
    ]
    if pod.trainer is None and not operator_sets_non_root(pod.spec):
        names.insert(0, contract.CONTAINER_NAME)
    return names


def _non_root(pod: _Pod) -> list[str]:
    """runAsNonRoot true on the pod or on every container, and never user 0. The operator sets it only
    where it knows the trainer works that way (`operator_sets_non_root`); otherwise the template must."""
    path = f"{TEMPLATE}.securityContext"
    found = [f"{path}.runAsNonRoot=false"] if pod.context.get("runAsNonRoot") is False else []
    found += [f"{path}.runAsUser=0"] if pod.context.get("runAsUser") == 0 else []
    for kind in CONTAINER_KINDS:
        for container_path, container in pod.each(kind):
            context = container.get("securityContext") or {}
            found += (
                [f"{container_path}.securityContext.runAsNonRoot=false"]
                if context.get("runAsNonRoot") is False
                else []
            )
            found += (
                [f"{container_path}.securityContext.runAsUser=0"] if context.get("runAsUser") == 0 else []
            )
    unset = _unset_non_root(pod)
    if pod.context.get("runAsNonRoot") is not True and unset:
        found.append(
            f"{path}.runAsNonRoot must be true (unset on {', '.join(unset)}; the operator sets it only for "
            "its reference trainer in a framework's default image and for MPI jobs, as it cannot know "
            "another image's user)"
        )
    return found


RESTRICTED_CONTROLS: Final[tuple[Control, ...]] = (
    _restricted_volumes,
    _escalation_and_capabilities,
    _non_root,
)


def pod_security_violations(spec: JsonDict, level: str) -> list[str]:
    """What the namespace's Pod Security `level` (its enforce label) would refuse in the pods the operator
    builds for `spec`: the baseline's findings, and for "restricted" its own after them."""
    if level == BASELINE:
        return pod_escalations(spec)
    if level == RESTRICTED:
        pod = _Pod(spec)
        return pod_escalations(spec) + [
            finding for control in RESTRICTED_CONTROLS for finding in control(pod)
        ]
    return []


# ------------------------------------------------------------------------------------------ the messages

# The characters of findings a message shows: the API server replaces a message over 5 KiB with the
# policy's static one, which names no field.
MESSAGE_FINDINGS_LIMIT: Final = 3000


def clip(findings: list[str]) -> str:
    text = "; ".join(findings)
    return text if len(text) <= MESSAGE_FINDINGS_LIMIT else text[:MESSAGE_FINDINGS_LIMIT] + " ..."


def escalation_message(findings: list[str], namespace: str) -> str:
    return (
        f"{clip(findings)}: more than the baseline Pod Security Standard allows, which needs the right "
        f"to create pods in namespace {namespace} (or the verb {USE_VERB} on {PRIVILEGED_RESOURCE} in "
        f"{contract.GROUP} there)"
    )


def service_account_message(name: str, namespace: str) -> str:
    return (
        f"spec.serviceAccountName={name}: running a job's pods as ServiceAccount {name} needs the right "
        f"to create pods in namespace {namespace} (or the verb {USE_VERB} on serviceaccounts/{name} there)"
    )


def pod_security_message(violations: list[str], namespace: str, level: str) -> str:
    return f'namespace {namespace} enforces Pod Security "{level}", which the pods would fail: ' + clip(
        violations
    )
