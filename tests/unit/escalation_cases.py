"""The escalation cases: TrainingJobs and what crd/escalation.py, and so the policy
`trainingjob-escalation`, must find in each.

tests/unit/test_escalation.py checks the Python function against `escalations` and `restricted`; the
end-to-end test (tests/e2e/test_tenant_escalation.py) sends every case to the API server as tenants with
different rights and in namespaces of each Pod Security level, and compares the policy's answer with the
message the Python function makes: the same cases through both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crd import contract
from tests.unit.crd_case_model import job

T = "spec.podTemplate.spec"
C0 = f"{T}.containers[0]"
I0 = f"{T}.initContainers[0]"
SIDECAR = {"name": "side", "image": "busybox:1.36"}
INIT = {"name": "setup", "image": "busybox:1.36"}
NON_ROOT = (
    f"{T}.securityContext.runAsNonRoot must be true (unset on {{}}; the operator sets it only for its "
    "reference trainer in a framework's default image and for MPI jobs, as it cannot know another image's "
    "user)"
)
# What "restricted" asks of a container of the template that says nothing of its security.
BARE = ("allowPrivilegeEscalation must be false", "capabilities.drop must include ALL")


@dataclass(frozen=True)
class EscalationCase:
    """`manifest`; what needs a right (`escalations`, the ServiceAccount last) and what "restricted"
    refuses besides the baseline's findings (`restricted`)."""

    id: str
    manifest: dict[str, Any]
    escalations: list[str] = field(default_factory=list)
    restricted: list[str] = field(default_factory=list)

    @property
    def pod_escalations(self) -> list[str]:
        return [finding for finding in self.escalations if not finding.startswith("spec.serviceAccountName=")]


def template(spec: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A job whose podTemplate.spec is `spec`, with dotted-path `changes` (`metadata__annotations` for
    podTemplate.metadata.annotations)."""
    annotations = changes.pop("annotations", None)
    found = {
        "spec.podTemplate": {
            "spec": spec,
            **({"metadata": {"annotations": annotations}} if annotations else {}),
        }
    }
    return job({**found, **{key.replace("__", "."): value for key, value in changes.items()}})


def trainer(**fields: Any) -> dict[str, Any]:
    return {"containers": [{"name": contract.CONTAINER_NAME, **fields}]}


def trainer_context(**context: Any) -> dict[str, Any]:
    return trainer(securityContext=context)


def sidecar_context(**context: Any) -> dict[str, Any]:
    return {"containers": [{**SIDECAR, "securityContext": context}]}


def bare(path: str) -> list[str]:
    return [f"{path}.securityContext.{what}" for what in BARE]


CASES = [
    # ------------------------------------------------------------ what needs a right: the baseline's controls
    EscalationCase(
        "privileged", template(trainer_context(privileged=True)), [f"{C0}.securityContext.privileged=true"]
    ),
    EscalationCase(
        "hostPath",
        template({"volumes": [{"name": "host", "hostPath": {"path": "/var/run"}}]}),
        [f"{T}.volumes[0].hostPath"],
    ),
    EscalationCase("hostNetwork", template({"hostNetwork": True}), [f"{T}.hostNetwork=true"]),
    EscalationCase("hostPID", template({"hostPID": True}), [f"{T}.hostPID=true"]),
    EscalationCase("hostIPC", template({"hostIPC": True}), [f"{T}.hostIPC=true"]),
    EscalationCase(
        "SYS_ADMIN",
        template(trainer_context(capabilities={"add": ["SYS_ADMIN"]})),
        [f"{C0}.securityContext.capabilities.add=SYS_ADMIN"],
    ),
    EscalationCase(
        "sidecar-capabilities",
        template(sidecar_context(capabilities={"add": ["NET_ADMIN", "CHOWN", "NET_RAW"]})),
        [f"{C0}.securityContext.capabilities.add=NET_ADMIN,NET_RAW"],
        [
            f"{C0}.securityContext.allowPrivilegeEscalation must be false",
            f"{C0}.securityContext.capabilities.drop must include ALL",
            f"{C0}.securityContext.capabilities.add=CHOWN",
            NON_ROOT.format("side"),
        ],
    ),
    EscalationCase(
        "init-privileged",
        template({"initContainers": [{**INIT, "securityContext": {"privileged": True}}]}),
        [f"{I0}.securityContext.privileged=true"],
        [*bare(I0), NON_ROOT.format("setup")],
    ),
    EscalationCase(
        "hostPort",
        template(trainer(ports=[{"containerPort": 7000}, {"containerPort": 7001, "hostPort": 7001}])),
        [f"{C0}.ports[1].hostPort=7001"],
    ),
    EscalationCase(
        "seccomp-unconfined-pod",
        template({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
        [f"{T}.securityContext.seccompProfile.type=Unconfined"],
    ),
    EscalationCase(
        "seccomp-unconfined-container",
        template(trainer_context(seccompProfile={"type": "Unconfined"})),
        [f"{C0}.securityContext.seccompProfile.type=Unconfined"],
    ),
    EscalationCase(
        "apparmor-unconfined",
        template({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}}),
        [f"{T}.securityContext.appArmorProfile.type=Unconfined"],
    ),
    EscalationCase(
        "apparmor-annotation",
        template({}, annotations={"container.apparmor.security.beta.kubernetes.io/trainer": "unconfined"}),
        [
            "spec.podTemplate.metadata.annotations[container.apparmor.security.beta.kubernetes.io/trainer]=unconfined"
        ],
    ),
    EscalationCase(
        "selinux",
        template({"securityContext": {"seLinuxOptions": {"type": "spc_t", "user": "system_u"}}}),
        [
            f"{T}.securityContext.seLinuxOptions.type=spc_t",
            f"{T}.securityContext.seLinuxOptions.user=system_u",
        ],
    ),
    EscalationCase(
        "selinux-role-on-a-container",
        template(trainer_context(seLinuxOptions={"role": "system_r"})),
        [f"{C0}.securityContext.seLinuxOptions.role=system_r"],
    ),
    EscalationCase(
        "procMount",
        template(trainer_context(procMount="Unmasked")),
        [f"{C0}.securityContext.procMount=Unmasked"],
    ),
    EscalationCase(
        "sysctl",
        template(
            {
                "securityContext": {
                    "sysctls": [
                        {"name": "net.ipv4.tcp_syncookies", "value": "1"},
                        {"name": "kernel.msgmax", "value": "65536"},
                    ]
                }
            }
        ),
        [f"{T}.securityContext.sysctls[1].name=kernel.msgmax"],
    ),
    EscalationCase(
        "windows-hostProcess",
        template({"securityContext": {"windowsOptions": {"hostProcess": True}}}),
        [f"{T}.securityContext.windowsOptions.hostProcess=true"],
    ),
    EscalationCase(
        "windows-hostProcess-container",
        template(trainer_context(windowsOptions={"hostProcess": True})),
        [f"{C0}.securityContext.windowsOptions.hostProcess=true"],
    ),
    EscalationCase(
        "probe-host",
        template(trainer(livenessProbe={"httpGet": {"host": "169.254.169.254", "port": 80, "path": "/"}})),
        [f"{C0}.livenessProbe.httpGet.host=169.254.169.254"],
    ),
    EscalationCase(
        "lifecycle-host",
        template(trainer(lifecycle={"preStop": {"httpGet": {"host": "10.0.0.1", "port": 80}}})),
        [f"{C0}.lifecycle.preStop.httpGet.host=10.0.0.1"],
    ),
    EscalationCase("rdma", job({"spec.networking.rdmaEnabled": True}), ["spec.networking.rdmaEnabled=true"]),
    EscalationCase(
        "another-serviceaccount",
        job({"spec.serviceAccountName": "admin-sa"}),
        ["spec.serviceAccountName=admin-sa"],
    ),
    EscalationCase(
        "several",
        template(
            {
                "hostNetwork": True,
                "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
                **trainer_context(privileged=True, capabilities={"add": ["SYS_ADMIN"]}),
            },
            spec__serviceAccountName="admin-sa",
        ),
        [
            f"{T}.hostNetwork=true",
            f"{T}.volumes[0].hostPath",
            f"{C0}.securityContext.privileged=true",
            f"{C0}.securityContext.capabilities.add=SYS_ADMIN",
            "spec.serviceAccountName=admin-sa",
        ],
    ),
    # ------------------------------------------------------------------------- what the baseline allows
    EscalationCase("default", job()),
    EscalationCase("the-trainers-account", job({"spec.serviceAccountName": contract.TRAINER_ACCOUNT})),
    EscalationCase(
        "baseline-capabilities",
        template(trainer_context(capabilities={"add": ["NET_BIND_SERVICE", "CHOWN"]})),
        restricted=[f"{C0}.securityContext.capabilities.add=CHOWN"],
    ),
    EscalationCase(
        "confined-profiles",
        template(
            {
                "securityContext": {
                    "seccompProfile": {"type": "Localhost", "localhostProfile": "train.json"},
                    "appArmorProfile": {"type": "RuntimeDefault"},
                    "seLinuxOptions": {"type": "container_t", "level": "s0:c1,c2"},
                    "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"}],
                }
            },
            annotations={"container.apparmor.security.beta.kubernetes.io/trainer": "localhost/train"},
        ),
    ),
    EscalationCase(
        "rdma-capabilities-replaced",
        template(
            trainer_context(capabilities={"add": ["NET_BIND_SERVICE"]}), spec__networking__rdmaEnabled=True
        ),
    ),
    # ------------------------------------------------- what only "restricted" refuses, as the pods are built
    EscalationCase(
        "unknown-image",
        job({"spec.image": "registry.example/trainer:1"}),
        restricted=[NON_ROOT.format("trainer")],
    ),
    EscalationCase(
        "nfs-checkpoints",
        job(
            {
                "spec.checkpoint.enabled": True,
                "spec.checkpoint.storage.type": "nfs",
                "spec.checkpoint.storage.nfs": {"server": "10.0.0.2", "path": "/exports"},
            }
        ),
        restricted=["spec.checkpoint.storage.type=nfs", NON_ROOT.format("trainer")],
    ),
    EscalationCase(
        "pvc-checkpoints", job({"spec.checkpoint.enabled": True}), restricted=[NON_ROOT.format("trainer")]
    ),
    EscalationCase(
        "nfs-volume-not-mounted",
        template({"volumes": [{"name": "data", "nfs": {"server": "10.0.0.2", "path": "/data"}}]}),
        restricted=[f"{T}.volumes[0].nfs"],
    ),
    EscalationCase(
        "writable-claim-mounted",
        template(
            {
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                **trainer(volumeMounts=[{"name": "data", "mountPath": "/data"}]),
            }
        ),
        restricted=[NON_ROOT.format("trainer")],
    ),
    EscalationCase(
        "read-only-claim-mounted",
        template(
            {
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                **trainer(volumeMounts=[{"name": "data", "mountPath": "/data", "readOnly": True}]),
            }
        ),
    ),
    EscalationCase(
        "root-user",
        template({"securityContext": {"runAsUser": 0}}),
        restricted=[f"{T}.securityContext.runAsUser=0", NON_ROOT.format("trainer")],
    ),
    EscalationCase(
        "run-as-root-allowed",
        template({"securityContext": {"runAsNonRoot": False}}),
        restricted=[f"{T}.securityContext.runAsNonRoot=false", NON_ROOT.format("trainer")],
    ),
    EscalationCase(
        "trainer-escalates",
        template(trainer_context(allowPrivilegeEscalation=True)),
        restricted=[f"{C0}.securityContext.allowPrivilegeEscalation must be false"],
    ),
    EscalationCase(
        "trainer-drops-less",
        template(trainer_context(capabilities={"drop": ["NET_RAW"]})),
        restricted=[f"{C0}.securityContext.capabilities.drop must include ALL"],
    ),
    EscalationCase(
        "bare-sidecar-and-init",
        template({"containers": [SIDECAR], "initContainers": [INIT]}),
        restricted=[
            f"{C0}.securityContext.allowPrivilegeEscalation must be false",
            f"{I0}.securityContext.allowPrivilegeEscalation must be false",
            f"{C0}.securityContext.capabilities.drop must include ALL",
            f"{I0}.securityContext.capabilities.drop must include ALL",
            NON_ROOT.format("side, setup"),
        ],
    ),
    EscalationCase(
        "windows-sidecar",
        template({"os": {"name": "windows"}, "containers": [SIDECAR]}),
        restricted=[NON_ROOT.format("side")],
    ),
    EscalationCase(
        "user-stated-non-root",
        template(
            {
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                "containers": [
                    {
                        **SIDECAR,
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
            },
            spec__image="registry.example/trainer:1",
        ),
    ),
]


# An MPI job runs as the operator's ordinary user whatever its image and command (builders/mpi.py).
MPI = {"spec.framework": "mpi", "spec.image": "registry.example/mpi:1", "spec.command": ["mpirun", "a.out"]}
CASES += [
    EscalationCase("mpi-job", job(MPI)),
    EscalationCase(
        "mpi-job-template-user",
        template(
            {"securityContext": {"runAsUser": 0}}, **{key.replace(".", "__"): v for key, v in MPI.items()}
        ),
        restricted=[f"{T}.securityContext.runAsUser=0", NON_ROOT.format("trainer")],
    ),
]


def by_id() -> dict[str, EscalationCase]:
    return {case.id: case for case in CASES}
