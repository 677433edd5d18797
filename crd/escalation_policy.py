"""The ValidatingAdmissionPolicy `trainingjob-escalation`: a job's pods get no more than its creator could.

Why admission, and this shape: the operator creates pods with its own identity, so the check must see
the requester, which only admission does (CEL's `authorizer` asks the API server's authorizers about
the requesting user). Three validations, each answered in one line that names the fields:

1. The namespace's Pod Security `enforce` level (its label, `namespaceObject`) against the pods as the
   operator will build them, for every requester: a job whose pods the namespace would refuse is refused
   at once, naming the field, rather than left Pending with FailedCreate. PodSecurity's exemptions
   (users, runtime classes, namespaces of its admission configuration) and a pinned `enforce-version`
   are not visible here: this judges by the latest version of the standards.
2. Settings above the "baseline" standard (crd/escalation.py lists them, and says why each) need a
   requester who may create pods in the namespace (who could make such a pod directly, under the
   namespace's Pod Security), or who holds the verb `use` on trainingjobs/privileged there (a
   subresource that nothing serves, so that no rule on trainingjobs grants it by a wildcard verb).
3. spec.serviceAccountName other than the trainers' account needs a requester who may create pods in
   the namespace (any pod may name any account of its namespace), or who holds the verb `use` on
   serviceaccounts with the account's name as resourceName.

It matches CREATE and UPDATE of trainingjobs, not of their status or scale subresources, which cannot
change spec. On UPDATE it judges only what the update adds: the findings of the old object are taken
off the new one's, so the garbage collector, the operator or a tenant scaling a job an admin made with
host settings is not refused; the service account is judged when it changes.
"""

from __future__ import annotations

from typing import Any, Final

from crd import contract
from crd import escalation as e
from crd.escalation_cel import Scope, literal, pod_escalations, restricted_violations
from crd.policy_files import LABELS, deny_binding, policy_file

JsonDict = dict[str, Any]

POLICY_FILE_NAME: Final = "escalation-policy.yaml"
HEADER: Final = "# Generated from crd/escalation_policy.py by `python -m crd write`; do not edit by hand.\n"
NEW, OLD = Scope("new"), Scope("old")


def _authorized(group: str, resource: str, verb: str, name: str | None = None) -> str:
    resource, _, subresource = resource.partition("/")
    named = f".name({name})" if name else ""
    sub = f".subresource({literal(subresource)})" if subresource else ""
    return (
        f"authorizer.group({literal(group)}).resource({literal(resource)}){sub}"
        f".namespace(request.namespace){named}.check({literal(verb)}).allowed()"
    )


def _added(name: str) -> str:
    """The findings of `name` on the new object that the old one did not have (all of them on CREATE)."""
    return (
        f"oldObject == null ? variables.new{name} : "
        f"variables.new{name}.filter(f, !(f in variables.old{name}))"
    )


def _parts(scope: Scope, name: str, lists: list[str]) -> list[tuple[str, str]]:
    """`name` over `scope` as the concatenation of a variable per list."""
    parts = [(f"{scope.prefix}{name}{index}", expression) for index, expression in enumerate(lists)]
    return [*parts, (f"{scope.prefix}{name}", " + ".join(f"variables.{part}" for part, _ in parts))]


def _clipped(text: str) -> str:
    """The CEL string `text`, cut as crd/escalation.clip cuts it (the API server drops a message over
    5 KiB for the static one, which names no field)."""
    limit = e.MESSAGE_FINDINGS_LIMIT
    return f"[{text}].map(s, s.size() > {limit} ? s.substring(0, {limit}) + ' ...' : s)[0]"


def _pod_security(scope: Scope) -> str:
    return (
        f"variables.level == {literal(e.BASELINE)} ? variables.{scope.prefix}Escalations : "
        f"variables.level == {literal(e.RESTRICTED)} ? variables.{scope.prefix}Escalations + "
        f"variables.{scope.prefix}Restricted : []"
    )


def variables() -> list[JsonDict]:
    old = [
        (name, f"oldObject == null ? {{}} : {value}" if name == "oldSpec" else value)
        for name, value in OLD.definitions("oldObject")
    ]
    defined = [
        *NEW.definitions("object"),
        *old,
        *_parts(NEW, "Escalations", pod_escalations(NEW)),
        *_parts(OLD, "Escalations", pod_escalations(OLD)),
        *_parts(NEW, "Restricted", restricted_violations(NEW)),
        *_parts(OLD, "Restricted", restricted_violations(OLD)),
        ("escalations", _added("Escalations")),
        (
            "level",
            f"namespaceObject.metadata.?labels.orValue({{}})[?{literal(e.ENFORCE_LABEL)}].orValue('privileged')",
        ),
        ("newPodSecurity", _pod_security(NEW)),
        ("oldPodSecurity", _pod_security(OLD)),
        ("podSecurity", _added("PodSecurity")),
        ("podSecurityText", _clipped("variables.podSecurity.join('; ')")),
        ("escalationsText", _clipped("variables.escalations.join('; ')")),
        ("serviceAccount", "object.spec.?serviceAccountName.orValue('')"),
        (
            "serviceAccountChanged",
            f"!(variables.serviceAccount in ['', {literal(contract.TRAINER_ACCOUNT)}]) && "
            "(oldObject == null || "
            "oldObject.spec.?serviceAccountName.orValue('') != variables.serviceAccount)",
        ),
        ("mayCreatePods", _authorized("", "pods", "create")),
    ]
    return [{"name": name, "expression": expression} for name, expression in defined]


def validations() -> list[JsonDict]:
    return [
        {
            "expression": "variables.podSecurity.size() == 0",
            "messageExpression": (
                "'namespace ' + request.namespace + ' enforces Pod Security \"' + variables.level + "
                "'\", which the pods would fail: ' + variables.podSecurityText"
            ),
            "message": "the namespace's Pod Security level refuses the pods this job asks for",
            "reason": "Forbidden",
        },
        {
            "expression": (
                "variables.escalations.size() == 0 || variables.mayCreatePods || "
                + _authorized(contract.GROUP, e.PRIVILEGED_RESOURCE, e.USE_VERB)
            ),
            "messageExpression": (
                "variables.escalationsText + ': more than the baseline Pod Security Standard allows, "
                "which needs the right to create pods in namespace ' + request.namespace + "
                f"' (or the verb {e.USE_VERB} on {e.PRIVILEGED_RESOURCE} in {contract.GROUP} there)'"
            ),
            "message": "the pods would get more than the baseline Pod Security Standard allows",
            "reason": "Forbidden",
        },
        {
            "expression": (
                "!variables.serviceAccountChanged || variables.mayCreatePods || "
                + _authorized("", "serviceaccounts", e.USE_VERB, "variables.serviceAccount")
            ),
            "messageExpression": (
                "'spec.serviceAccountName=' + variables.serviceAccount + ': running a job\\'s pods as "
                "ServiceAccount ' + variables.serviceAccount + "
                "' needs the right to create pods in namespace ' + request.namespace + "
                f"' (or the verb {e.USE_VERB} on serviceaccounts/' + variables.serviceAccount + ' there)'"
            ),
            "message": "the pods would run as another ServiceAccount",
            "reason": "Forbidden",
        },
    ]


def policy() -> JsonDict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": e.POLICY_NAME, "labels": dict(LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [contract.GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        # The resource alone: not trainingjobs/status or /scale, which cannot change spec.
                        "resources": [contract.PLURAL],
                    }
                ]
            },
            "variables": variables(),
            "validations": validations(),
        },
    }


def binding() -> JsonDict:
    return deny_binding(e.POLICY_NAME)


def policy_yaml() -> str:
    """crd/escalation-policy.yaml: the policy and its binding."""
    return policy_file(HEADER, policy(), binding())
