"""No escalation through a TrainingJob, on the real API server with real users (issue 34).

The admission policy `trainingjob-escalation` (crd/escalation_policy.py, installed with the CRD) decides
alone, so no operator runs here. Users with client certificates of the cluster's CA (tests/e2e/tenants.py)
are bound to Roles in one namespace:
- alice may do anything with TrainingJobs (and scale them), nothing else: each escalation of
  tests/unit/escalation_cases.py is refused to her through `kubectl apply`, the Python client and a
  `kubectl patch` of a stored job, in one line naming the fields; every example of examples/ and every
  case without an escalation is admitted;
- bob may also create pods: he could make such pods himself, so the same jobs are admitted;
- carol holds what a platform team grants instead (the verb `use` on trainingjobs/privileged, and on
  one ServiceAccount): admitted, and refused another account.
Namespaces that enforce the "baseline" and "restricted" Pod Security levels refuse, at admission and to
the cluster admin too, the jobs whose pods they would refuse.

Every refusal is compared with the message crd/escalation.py makes for the same job: the policy's CEL
and the Python function the operator uses agree on every case and example (same cases through both).
The YAML of docs/security.md's section on it is applied as it is, and does what the section says.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from crd import contract, escalation
from testbed import Kubectl
from tests.cluster import REPO
from tests.e2e.jobs import PatientKubectl
from tests.e2e.tenants import TenantUser, grant, rule, tenant_user
from tests.e2e.test_docs_yaml import yaml_blocks
from tests.unit.crd_cases import example_manifests
from tests.unit.escalation_cases import CASES, EscalationCase
from trainingjob_client import TrainingJobClient
from trainingjob_client.errors import PermissionDenied

ESCALATING = [case for case in CASES if case.escalations]
ORDINARY = [case for case in CASES if not case.escalations]
GRANTED_ACCOUNT = "admin-sa"
SECURITY = REPO / "docs" / "security.md"
DOCS_SECTION = "## What a tenant can do through a TrainingJob"
DOCS_GROUP = "ml-team-a"
DOCS_ACCOUNT = "data-reader"
JOB_RULES = [rule(contract.GROUP, [contract.PLURAL, f"{contract.PLURAL}/scale"], ["*"])]


@dataclass(frozen=True)
class World:
    namespace: str
    baseline: str
    restricted: str
    relaxed: str
    alice: TenantUser
    bob: TenantUser
    carol: TenantUser
    dave: TenantUser  # in the group the docs' grant names, with TrainingJobs only


@pytest.fixture(scope="module")
def world(cluster: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    admin = PatientKubectl.of(cluster)
    suffix = uuid.uuid4().hex[:6]
    namespaces = [f"t-tenant-{kind}-{suffix}" for kind in ("open", "baseline", "restricted", "relaxed")]
    namespace, baseline, restricted, relaxed = namespaces
    for name in namespaces:
        admin.run("create", "namespace", name)
    admin.run("label", "namespace", baseline, f"{escalation.ENFORCE_LABEL}=baseline")
    admin.run("label", "namespace", restricted, f"{escalation.ENFORCE_LABEL}=restricted")
    directory = tmp_path_factory.mktemp("tenants")
    users = {name: tenant_user(cluster, directory, f"{name}-{suffix}") for name in ("alice", "bob", "carol")}
    users["dave"] = tenant_user(cluster, directory, f"dave-{suffix}", groups=(DOCS_GROUP,))
    # Every verb on trainingjobs and their scale: not trainingjobs/privileged, which a rule must name.
    for where, who in ((namespace, "alice"), (relaxed, "alice"), (namespace, "dave")):
        grant(admin, where, users[who].name, JOB_RULES)
    grant(admin, namespace, users["bob"].name, [*JOB_RULES, rule("", ["pods"], ["create"])])
    grant(
        admin,
        namespace,
        users["carol"].name,
        [
            rule(contract.GROUP, [contract.PLURAL], ["create", "get", "patch"]),
            rule(contract.GROUP, [escalation.PRIVILEGED_RESOURCE], [escalation.USE_VERB]),
            rule("", ["serviceaccounts"], [escalation.USE_VERB], [GRANTED_ACCOUNT]),
        ],
    )
    try:
        yield World(
            namespace, baseline, restricted, relaxed, *(users[n] for n in ("alice", "bob", "carol", "dave"))
        )
    finally:
        for name in namespaces:
            admin.run("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def named(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    renamed: dict[str, Any] = json.loads(json.dumps(manifest))
    renamed["metadata"]["name"] = name
    return renamed


def job_name(case: EscalationCase) -> str:
    return re.sub("[^a-z0-9]+", "-", f"case-{case.id.lower()}")[:50].rstrip("-")


def refusal(case_or_spec: EscalationCase | dict[str, Any], namespace: str) -> str:
    """What the policy answers a requester without the rights, as crd/escalation.py says it."""
    spec = case_or_spec.manifest["spec"] if isinstance(case_or_spec, EscalationCase) else case_or_spec
    settings = escalation.pod_escalations(spec)
    if settings:
        return escalation.escalation_message(settings, namespace)
    account = escalation.service_account_escalation(spec)
    assert account is not None
    return escalation.service_account_message(account.split("=", 1)[1], namespace)


def apply(kubectl: Kubectl, namespace: str, manifest: dict[str, Any], *extra: str) -> Any:
    return kubectl.attempt("apply", "-n", namespace, *extra, "-f", "-", stdin=json.dumps(manifest))


def assert_refused(stderr: str, expected: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].endswith(f"denied request: {expected}"), f"{lines[0]}\n!= {expected}"


# --------------------------------------------------------------------- a tenant with TrainingJobs only


@pytest.mark.parametrize("case", ESCALATING, ids=lambda case: case.id)
def test_kubectl_apply_of_each_escalation_is_refused_naming_the_field(
    world: World, case: EscalationCase
) -> None:
    result = apply(world.alice.kubectl, world.namespace, named(case.manifest, job_name(case)))
    assert result.returncode != 0
    assert "(Forbidden)" in result.stderr
    assert_refused(result.stderr, refusal(case, world.namespace))


def test_the_python_client_is_refused_each_escalation_in_one_line(world: World) -> None:
    client = TrainingJobClient(world.namespace, kubeconfig=world.alice.kubeconfig)
    for case in ESCALATING:
        with pytest.raises(PermissionDenied) as raised:
            client.create(named(case.manifest, job_name(case)))
        message = str(raised.value)
        assert "\n" not in message
        assert message.endswith(f"denied request: {refusal(case, world.namespace)}"), (case.id, message)


def test_every_example_and_ordinary_job_is_admitted(world: World) -> None:
    for file, manifest in example_manifests().items():
        result = apply(world.alice.kubectl, world.namespace, manifest)
        assert result.returncode == 0, (file, result.stderr)
    for case in ORDINARY:
        result = apply(
            world.alice.kubectl, world.namespace, named(case.manifest, job_name(case)), "--dry-run=server"
        )
        assert result.returncode == 0, (case.id, result.stderr)


def test_a_patch_of_a_stored_job_is_refused_what_it_adds(world: World, cluster: Kubectl) -> None:
    """The tenant's own job: a patch that adds another account or host settings is refused; scaling is not."""
    admin, alice = PatientKubectl.of(cluster), world.alice.kubectl
    apply(admin, world.namespace, named(by_id("default").manifest, "patched-by-alice"))
    target = ("-n", world.namespace, "trainingjob/patched-by-alice")

    account = alice.attempt(
        "patch", *target, "--type=merge", "-p", '{"spec":{"serviceAccountName":"admin-sa"}}'
    )
    assert_refused(account.stderr, escalation.service_account_message("admin-sa", world.namespace))
    for patch in (
        {"spec": {"podTemplate": {"spec": {"hostNetwork": True}}}},
        {"spec": {"podTemplate": {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}}},
        {
            "spec": {
                "podTemplate": {
                    "spec": {"containers": [{"name": "trainer", "securityContext": {"privileged": True}}]}
                }
            }
        },
    ):
        result = alice.attempt("patch", *target, "--type=merge", "-p", json.dumps(patch))
        # The template is immutable too: whichever policy answers first, one line names the field.
        assert result.returncode != 0
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "denied request: spec.podTemplate" in result.stderr, result.stderr
    stored = admin.get_json("trainingjob", "patched-by-alice", "-n", world.namespace)
    assert "podTemplate" not in stored["spec"]
    assert "serviceAccountName" not in stored["spec"]
    result = alice.attempt("patch", *target, "--type=merge", "-p", '{"spec":{"numWorkers":3}}')
    assert result.returncode == 0, result.stderr
    result = alice.attempt(
        "patch",
        *target,
        "--type=merge",
        "-p",
        f'{{"spec":{{"serviceAccountName":"{contract.TRAINER_ACCOUNT}"}}}}',
    )
    assert result.returncode == 0, result.stderr


def test_a_job_an_admin_made_with_host_settings_can_still_be_scaled_and_labelled_by_a_tenant(
    world: World, cluster: Kubectl
) -> None:
    """An update is judged on what it adds: the garbage collector, the operator and a tenant changing
    an admin's job are not refused for what the admin was allowed."""
    admin, alice = PatientKubectl.of(cluster), world.alice.kubectl
    apply(admin, world.namespace, named(by_id("several").manifest, "made-by-admin"))
    target = ("-n", world.namespace, "trainingjob/made-by-admin")
    for command in (
        ("patch", *target, "--type=merge", "-p", '{"spec":{"numWorkers":3}}'),
        ("scale", *target, "--replicas=4"),
        ("label", *target, "team=a"),
    ):
        result = alice.attempt(*command)
        assert result.returncode == 0, (command, result.stderr)
    account = alice.attempt(
        "patch", *target, "--type=merge", "-p", '{"spec":{"serviceAccountName":"other-sa"}}'
    )
    assert_refused(account.stderr, escalation.service_account_message("other-sa", world.namespace))


# ------------------------------------------------------------------------------------ who may escalate


@pytest.mark.parametrize("who", ["bob", "carol"])
def test_a_tenant_with_the_right_is_admitted_the_same_jobs(world: World, who: str) -> None:
    """bob may create pods (he could make such pods himself); carol holds the verbs instead."""
    user: TenantUser = getattr(world, who)
    for case in ESCALATING:
        result = apply(
            user.kubectl, world.namespace, named(case.manifest, job_name(case)), "--dry-run=server"
        )
        assert result.returncode == 0, (case.id, result.stderr)


def test_the_use_verb_names_its_accounts(world: World) -> None:
    manifest = named(by_id("default").manifest, "another-account")
    manifest["spec"]["serviceAccountName"] = "other-sa"
    result = apply(world.carol.kubectl, world.namespace, manifest, "--dry-run=server")
    assert_refused(result.stderr, escalation.service_account_message("other-sa", world.namespace))
    result = apply(world.bob.kubectl, world.namespace, manifest, "--dry-run=server")
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------- the namespace's Pod Security


@pytest.mark.parametrize("level", [escalation.BASELINE, escalation.RESTRICTED])
def test_the_namespaces_pod_security_level_refuses_at_admission_naming_the_field(
    world: World, cluster: Kubectl, level: str
) -> None:
    """For everyone, the cluster admin too: the pods would be refused anyway. Every case and example,
    compared with what crd/escalation.py says of it."""
    admin = PatientKubectl.of(cluster)
    namespace = world.baseline if level == escalation.BASELINE else world.restricted
    manifests = {case.id: named(case.manifest, job_name(case)) for case in CASES}
    manifests.update(example_manifests())
    refused = set()
    for key, manifest in manifests.items():
        violations = escalation.pod_security_violations(manifest["spec"], level)
        result = apply(admin, namespace, manifest, "--dry-run=server")
        if violations:
            assert_refused(result.stderr, escalation.pod_security_message(violations, namespace, level))
            refused.add(key)
        else:
            assert result.returncode == 0, (key, result.stderr)
    assert {"hostNetwork", "privileged", "hostPath"} <= refused
    if level == escalation.RESTRICTED:
        assert {"unknown-image", "trainingjob-advanced.yaml", "nfs-checkpoints"} <= refused
        assert not {"default", "trainingjob-restricted.yaml", "trainingjob-simple.yaml"} & refused
    else:
        assert not {"unknown-image", "trainingjob-advanced.yaml", "default"} & refused


def by_id(case_id: str) -> EscalationCase:
    return next(case for case in CASES if case.id == case_id)


# ------------------------------------------------------------------------------------ docs/security.md


def docs_blocks() -> list[str]:
    """The YAML blocks of docs/security.md's section on what a tenant can do through a TrainingJob."""
    text = SECURITY.read_text(encoding="utf-8")
    start = text.index(DOCS_SECTION)
    return yaml_blocks(text[start : text.index("\n## ", start + 1)])


def test_the_docs_grant_and_relax_as_they_say(world: World, cluster: Kubectl) -> None:
    """The section's grant, applied as it is, lets its group's members' jobs carry host settings and run
    as its account, and nobody else's; its relaxation lets everyone's in its namespace, not another
    account."""
    admin = PatientKubectl.of(cluster)
    grant_text, relax_text = docs_blocks()
    host = named(by_id("several").manifest, "docs-host")
    host["spec"]["serviceAccountName"] = DOCS_ACCOUNT
    settings = named(by_id("several").manifest, "docs-settings")
    del settings["spec"]["serviceAccountName"]
    try:
        admin.run("apply", "-n", world.namespace, "-f", "-", stdin=grant_text)
        admin.run("apply", "-n", world.relaxed, "-f", "-", stdin=relax_text)
        result = apply(world.dave.kubectl, world.namespace, host, "--dry-run=server")
        assert result.returncode == 0, result.stderr
        other = named(host, "docs-other")
        other["spec"]["serviceAccountName"] = GRANTED_ACCOUNT
        result = apply(world.dave.kubectl, world.namespace, other, "--dry-run=server")
        assert_refused(result.stderr, escalation.service_account_message(GRANTED_ACCOUNT, world.namespace))
        result = apply(world.alice.kubectl, world.namespace, settings, "--dry-run=server")
        assert_refused(result.stderr, refusal(settings["spec"], world.namespace))

        result = apply(world.alice.kubectl, world.relaxed, settings, "--dry-run=server")
        assert result.returncode == 0, result.stderr
        result = apply(world.alice.kubectl, world.relaxed, host, "--dry-run=server")
        assert_refused(result.stderr, escalation.service_account_message(DOCS_ACCOUNT, world.relaxed))
    finally:
        for namespace, text in ((world.namespace, grant_text), (world.relaxed, relax_text)):
            admin.run("delete", "-n", namespace, "-f", "-", "--ignore-not-found", stdin=text, check=False)


def test_a_long_list_of_findings_is_cut_not_replaced(world: World) -> None:
    """The API server replaces a message over 5 KiB with the policy's static one, which names no field:
    the policy cuts the findings at crd/escalation.py's limit instead, as the Python message does."""
    sidecars = [
        {
            "name": f"sidecar-{index}",
            "image": "busybox:1.36",
            "ports": [{"containerPort": 7000 + port, "hostPort": 7000 + port} for port in range(4)],
            "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN", "NET_ADMIN"]}},
        }
        for index in range(16)
    ]
    manifest = named(by_id("default").manifest, "long-findings")
    manifest["spec"]["podTemplate"] = {"spec": {"containers": sidecars}}
    findings = escalation.pod_escalations(manifest["spec"])
    assert len("; ".join(findings)) > escalation.MESSAGE_FINDINGS_LIMIT
    result = apply(world.alice.kubectl, world.namespace, manifest)
    assert_refused(result.stderr, escalation.escalation_message(findings, world.namespace))
    assert " ...: more than the baseline" in result.stderr


def every_list_at_its_bound() -> dict[str, Any]:
    """A job whose template has every list the findings iterate at the schema's bound, each item
    escalating: 16 containers and 16 init containers with 32 hostPorts, 64 capabilities and every
    confinement turned off, 64 hostPath and NFS volumes, 64 unsafe sysctls."""
    containers = [
        {
            "name": f"c{index}",
            "image": "busybox:1.36",
            "ports": [{"containerPort": 1000 + port, "hostPort": 1000 + port} for port in range(32)],
            "securityContext": {
                "privileged": True,
                "capabilities": {"add": [f"CAP_{cap}" for cap in range(64)], "drop": ["NET_RAW"]},
                "seLinuxOptions": {"type": "spc_t", "user": "u", "role": "r"},
                "procMount": "Unmasked",
                "seccompProfile": {"type": "Unconfined"},
                "appArmorProfile": {"type": "Unconfined"},
                "windowsOptions": {"hostProcess": True},
                "runAsUser": 0,
            },
            "livenessProbe": {"httpGet": {"host": "10.0.0.1", "port": 1}},
            "readinessProbe": {"tcpSocket": {"host": "10.0.0.1", "port": 1}},
            "volumeMounts": [{"name": f"v{volume}", "mountPath": f"/m{volume}"} for volume in range(64)],
        }
        for index in range(16)
    ]
    volumes = [{"name": f"v{index}", "hostPath": {"path": "/"}} for index in range(32)]
    volumes += [{"name": f"v{index}", "nfs": {"server": "10.0.0.2", "path": "/"}} for index in range(32, 64)]
    manifest = named(by_id("default").manifest, "every-list-at-its-bound")
    manifest["spec"]["podTemplate"] = {
        "spec": {
            "hostNetwork": True,
            "securityContext": {
                "sysctls": [{"name": f"kernel.x{index}", "value": "1"} for index in range(64)]
            },
            "volumes": volumes,
            "containers": containers,
            "initContainers": [{**c, "name": f"i{n}", "ports": []} for n, c in enumerate(containers)],
        }
    }
    return manifest


def test_a_template_with_every_list_at_its_bound_is_judged_within_cels_cost_limit(
    world: World, cluster: Kubectl
) -> None:
    manifest = every_list_at_its_bound()
    spec = manifest["spec"]
    result = apply(world.alice.kubectl, world.namespace, manifest, "--dry-run=server")
    assert_refused(
        result.stderr, escalation.escalation_message(escalation.pod_escalations(spec), world.namespace)
    )
    violations = escalation.pod_security_violations(spec, escalation.RESTRICTED)
    result = apply(PatientKubectl.of(cluster), world.restricted, manifest, "--dry-run=server")
    assert_refused(
        result.stderr, escalation.pod_security_message(violations, world.restricted, escalation.RESTRICTED)
    )


def test_the_python_clients_submit_suspend_and_resume(world: World, cluster: Kubectl) -> None:
    """`submit` with a spec of host settings is refused like `create`; suspending and resuming a job an
    admin made with host settings is not (the update adds none)."""
    client = TrainingJobClient(world.namespace, kubeconfig=world.alice.kubeconfig)
    with pytest.raises(PermissionDenied) as raised:
        client.submit(
            "submitted",
            model="cnn",
            dataset="mnist",
            num_workers=1,
            spec={"podTemplate": {"spec": {"hostPID": True}}},
        )
    expected = escalation.escalation_message(["spec.podTemplate.spec.hostPID=true"], world.namespace)
    assert str(raised.value).endswith(f"denied request: {expected}")
    apply(
        PatientKubectl.of(cluster), world.namespace, named(by_id("hostNetwork").manifest, "admins-host-job")
    )
    assert client.suspend("admins-host-job").name == "admins-host-job"
    assert client.resume("admins-host-job").name == "admins-host-job"
