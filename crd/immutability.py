"""The spec fields a TrainingJob cannot change once it exists, checked by a ValidatingAdmissionPolicy.

Why a policy and not transition rules (`self == oldSelf`) in the schema beside the other rules: the API
server evaluates every CEL rule of a CRD's schema on every write of the object, writes of the status
subresource included, where spec cannot change. The operator writes status at each state change and
progress report; the 15 transition rules were about half of the CEL work of each such write and a
fifth of its whole cost for a job with a pod template (docs/bench.md, "What a status write costs"). The
policy matches updates of `trainingjobs` and not of `trainingjobs/status`, so it runs where spec can
change, and only there. The rules that also hold on create stay in the schema, where the API server's
answer names the field of each violation; this policy's answer names every field that changed.

What counts as a change is what the transition rules said: an optional field without a default
(`presence`) may not be added or removed either; a field that is always there after defaulting, or
one under an optional parent (`checkpoint.storage`), is compared when both versions have it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from crd import contract
from crd.policy_files import LABELS, deny_binding, policy_file

JsonDict = dict[str, Any]

POLICY_FILE_NAME: Final = "immutable-spec-policy.yaml"
HEADER: Final = "# Generated from crd/immutability.py by `python -m crd write`; do not edit by hand.\n"


@dataclass(frozen=True)
class Immutable:
    """A field under spec, dotted (`checkpoint.storage`), that may not change after create."""

    path: str
    presence: bool = False  # adding or removing it is a change too

    @property
    def name(self) -> str:
        return f"spec.{self.path}"

    def _present(self, spec: str) -> str:
        parts = self.path.split(".")
        checks = [f"has({spec}.{'.'.join(parts[: depth + 1])})" for depth in range(len(parts))]
        return checks[0] if len(checks) == 1 else "(" + " && ".join(checks) + ")"

    def unchanged(self, new_spec: str = "object.spec", old_spec: str = "oldObject.spec") -> str:
        """A CEL expression, true when an update leaves the field as it was: over the policy's `object`
        and `oldObject` by default; ("self", "oldSelf") gives the transition rule on spec it replaced."""
        new, old = f"{new_spec}.{self.path}", f"{old_spec}.{self.path}"
        has_new, has_old = self._present(new_spec), self._present(old_spec)
        if self.presence:
            return f"{has_new} == {has_old} && (!{has_new} || {new} == {old})"
        return f"!({has_new} && {has_old}) || {new} == {old}"


IMMUTABLE_FIELDS: Final = (
    Immutable("model"),
    Immutable("dataset"),
    Immutable("framework"),
    Immutable("gpusPerWorker"),
    Immutable("image", presence=True),
    Immutable("command", presence=True),
    Immutable("args", presence=True),
    Immutable("env", presence=True),
    Immutable("resources", presence=True),
    Immutable("hyperparameters", presence=True),
    Immutable("checkpoint.storage"),
    Immutable("networking"),
    Immutable("podTemplate", presence=True),
    Immutable("elastic", presence=True),
    Immutable("tensorflow", presence=True),
    Immutable("mpi", presence=True),
    Immutable("managedBy", presence=True),
)


def changed_fields_expression(fields: tuple[Immutable, ...] = IMMUTABLE_FIELDS) -> str:
    """The list of the names of `fields` an update changes."""
    return " +\n".join(f'(({field.unchanged()}) ? [] : ["{field.name}"])' for field in fields)


def policy(fields: tuple[Immutable, ...] = IMMUTABLE_FIELDS) -> JsonDict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": contract.IMMUTABLE_SPEC_POLICY, "labels": dict(LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [contract.GROUP],
                        "apiVersions": ["*"],
                        "operations": ["UPDATE"],
                        # The resource alone: not trainingjobs/status, whose writes cannot change spec.
                        "resources": [contract.PLURAL],
                    }
                ]
            },
            "variables": [{"name": "changed", "expression": changed_fields_expression(fields)}],
            "validations": [
                {
                    "expression": "variables.changed.size() == 0",
                    "messageExpression": (
                        'variables.changed.join(", ") + '
                        '(variables.changed.size() == 1 ? " is immutable" : " are immutable")'
                    ),
                    "message": "a field of spec that cannot change after create was changed",
                    "reason": "Invalid",
                }
            ],
        },
    }


def binding() -> JsonDict:
    return deny_binding(contract.IMMUTABLE_SPEC_POLICY)


def policy_yaml() -> str:
    """crd/immutable-spec-policy.yaml: the policy and its binding."""
    return policy_file(HEADER, policy(), binding())
