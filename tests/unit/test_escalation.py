"""crd/escalation.py's findings for each case of tests/unit/escalation_cases.py, their agreement with the
pods the builders make, and the shape of the rendered policy `trainingjob-escalation`.

The policy's CEL is checked against the same cases on the real API server
(tests/e2e/test_tenant_escalation.py): here only what can be known without one.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from builders.pods import build_pod
from crd import contract, escalation, escalation_policy
from crd.spec import parse
from tests.cluster import REPO
from tests.unit.builders_support import materialize
from tests.unit.escalation_cases import CASES, EscalationCase


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_findings_of_each_case(case: EscalationCase) -> None:
    spec = case.manifest["spec"]
    assert escalation.escalations(spec) == case.escalations
    assert escalation.pod_escalations(spec) == case.pod_escalations
    assert escalation.pod_security_violations(spec, "privileged") == []
    assert escalation.pod_security_violations(spec, "baseline") == case.pod_escalations
    assert escalation.pod_security_violations(spec, "restricted") == case.pod_escalations + case.restricted


def test_the_cases_cover_every_control_and_the_issues_list() -> None:
    ids = {case.id for case in CASES}
    issue = {
        "privileged",
        "hostPath",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "SYS_ADMIN",
        "another-serviceaccount",
    }
    assert issue <= ids
    found = " ".join(finding for case in CASES for finding in case.escalations + case.restricted)
    for fragment in (
        "hostProcess",
        "seccompProfile",
        "appArmorProfile",
        "apparmor.security",
        "seLinuxOptions.type",
        "seLinuxOptions.user",
        "seLinuxOptions.role",
        "procMount",
        "sysctls",
        "hostPort",
        "livenessProbe.httpGet.host",
        "lifecycle.preStop",
        "rdmaEnabled",
        "initContainers",
        "runAsUser=0",
        "runAsNonRoot=false",
        "runAsNonRoot must be true",
        "allowPrivilegeEscalation",
        "drop must include ALL",
        "volumes[0].nfs",
        "storage.type=nfs",
    ):
        assert fragment in found, fragment


def _built_pod_as_spec(case: EscalationCase) -> dict[str, Any]:
    """The pod the builders make for the case, as a spec whose template is that whole pod (and whose
    image the operator does not know, so that it adds nothing of its own)."""
    pod = build_pod(parse(materialize(case.manifest)), 0, attempt=0, resume_from=None)
    return {
        "image": "registry.example/unknown:1",
        "command": ["unknown"],
        "podTemplate": {"metadata": pod["metadata"], "spec": pod["spec"]},
    }


@pytest.mark.parametrize("case", [c for c in CASES if not c.pod_escalations], ids=lambda case: case.id)
def test_restricted_judges_the_pods_as_the_operator_builds_them(case: EscalationCase) -> None:
    """The policy judges a spec with the operator's defaults (crd/contract.py) where the template says
    nothing; the pods the builders make from it pass or fail "restricted" alike."""
    built = escalation.pod_security_violations(_built_pod_as_spec(case), "restricted")
    assert bool(built) == bool(case.restricted), built


def test_the_operators_seccomp_default_passes_restricted() -> None:
    """Why the policy has no check of a pod without a seccomp profile: the operator always sets one
    unless the template does, and a template's wrong one is the baseline's finding."""
    assert contract.SECCOMP_PROFILE_TYPE in escalation.CONFINED_PROFILE_TYPES


def test_restricted_volume_types_are_those_the_template_accepts_beyond_restricteds_list() -> None:
    assert escalation.UNRESTRICTED_VOLUME_TYPES == ("fc", "iscsi", "nfs")


def test_messages_are_one_line_naming_the_fields() -> None:
    message = escalation.escalation_message(["a=1", "b"], "team-a")
    assert message.startswith("a=1; b: ")
    assert "create pods in namespace team-a" in message
    assert "the verb use on trainingjobs/privileged in ml.example.com" in message
    account = escalation.service_account_message("x", "team-a")
    assert account.startswith("spec.serviceAccountName=x: ")
    assert "serviceaccounts/x" in account
    assert escalation.pod_security_message(["a", "b"], "t", "restricted") == (
        'namespace t enforces Pod Security "restricted", which the pods would fail: a; b'
    )
    assert "\n" not in message + account


# ------------------------------------------------------------------------------------- the policy


def test_the_committed_policy_is_generated() -> None:
    committed = (REPO / "crd" / escalation_policy.POLICY_FILE_NAME).read_text(encoding="utf-8")
    assert committed == escalation_policy.policy_yaml()
    policy, binding = yaml.safe_load_all(committed)
    assert policy == escalation_policy.policy()
    assert binding == escalation_policy.binding()


def test_policy_matches_creates_and_updates_of_the_resource_only() -> None:
    policy = escalation_policy.policy()
    assert policy["metadata"]["name"] == contract.ESCALATION_POLICY
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE", "UPDATE"]
    assert rule["resources"] == [contract.PLURAL], "not trainingjobs/status or /scale"
    assert rule["apiGroups"] == [contract.GROUP]
    binding = escalation_policy.binding()
    assert binding["spec"] == {"policyName": contract.ESCALATION_POLICY, "validationActions": ["Deny"]}


def test_policy_validations_ask_the_authorizer_and_the_namespace() -> None:
    spec = escalation_policy.policy()["spec"]
    names = [variable["name"] for variable in spec["variables"]]
    assert len(names) == len(set(names))
    expressions = {variable["name"]: variable["expression"] for variable in spec["variables"]}
    assert "resource('pods')" in expressions["mayCreatePods"]
    assert "check('create')" in expressions["mayCreatePods"]
    assert escalation.ENFORCE_LABEL in expressions["level"]
    assert "namespaceObject" in expressions["level"]
    pod_security, settings, account = spec["validations"]
    assert "variables.podSecurity" in pod_security["expression"]
    assert "resource('trainingjobs').subresource('privileged')" in settings["expression"]
    assert f"check('{escalation.USE_VERB}')" in settings["expression"]
    assert f"check('{escalation.USE_VERB}')" in account["expression"]
    assert ".name(variables.serviceAccount)" in account["expression"]
    for validation in spec["validations"]:
        assert validation["reason"] == "Forbidden"
        assert validation["messageExpression"]
        assert validation["message"]


def test_policy_updates_judge_only_what_they_add() -> None:
    expressions = {v["name"]: v["expression"] for v in escalation_policy.policy()["spec"]["variables"]}
    assert "!(f in variables.oldEscalations)" in expressions["escalations"]
    assert "!(f in variables.oldPodSecurity)" in expressions["podSecurity"]
    assert "oldObject.spec.?serviceAccountName" in expressions["serviceAccountChanged"]


def test_policy_carries_every_allowed_value() -> None:
    text = escalation_policy.policy_yaml()
    for value in (
        *escalation.BASELINE_CAPABILITIES,
        *escalation.SAFE_SYSCTLS,
        *escalation.SELINUX_TYPES[1:],
        *contract.NON_ROOT_IMAGES,
        *contract.NON_ROOT_VOLUME_TYPES,
        contract.TRAINER_ACCOUNT,
    ):
        assert f"'{value}'" in text, value


def test_a_long_list_of_findings_is_cut() -> None:
    findings = [
        f"spec.podTemplate.spec.containers[{index}].securityContext.privileged=true" for index in range(80)
    ]
    message = escalation.escalation_message(findings, "team-a")
    clipped = "; ".join(findings)[: escalation.MESSAGE_FINDINGS_LIMIT] + " ..."
    assert message.startswith(clipped + ": more than the baseline")
    assert len(message.encode()) < 5 * 1024
    assert escalation.clip(findings[:2]) == "; ".join(findings[:2])
