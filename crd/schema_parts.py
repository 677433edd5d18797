"""Building blocks of the TrainingJob schema: bounds, reusable sub-schemas and CEL rule helpers.

Several parts of the spec share shapes (environment variables, tolerations, quantities) and rule
patterns (immutability, GPU counts). Each is written once here so every use gets the same bounds,
descriptions and cost-safe CEL.
"""

from __future__ import annotations

from crd import contract
from crd.kube_schemas import schema
from crd.openapi import Rule, Schema, array, integer, obj, rule, string

NAME_LENGTH = 253
PATH_LENGTH = 1024
URL_LENGTH = 2048
LABEL_VALUE_LENGTH = 63
ENV_NAME_LENGTH = 256
# hyperparameters.additionalParams keys: with 64 values of 1 KiB, their HP_<KEY> variables stay a small
# part of a pod (builders/env.py).
PARAM_KEY_LENGTH = 128
ENV_VALUE_LENGTH = 32768
ARG_LENGTH = 4096
MAX_ENV = 200
MAX_ARGS = 256
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
IDENTIFIER_PATTERN = "^[A-Za-z_][A-Za-z0-9_]*$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def value_from() -> Schema:
    """env[].valueFrom: the generated core/v1 EnvVarSource, with exactly one source."""
    source = schema("EnvVarSource")
    source["description"] = (
        "Source for the variable's value, as in a Pod's env[].valueFrom (core/v1 EnvVarSource). Exactly "
        "one source."
    )
    present = ", ".join(f"has(self.{name})" for name in source["properties"])
    source["x-kubernetes-validations"] = [
        rule(
            f"[{present}].filter(x, x).size() == 1",
            message="env[].valueFrom must name exactly one source: " + ", ".join(source["properties"]),
        )
    ]
    return source


def env_var() -> Schema:
    """A container environment variable, as in a Pod."""
    reserved = cel_list(contract.RESERVED_ENV_NAMES)
    prefixes = " && ".join(f"!self.name.startsWith('{p}')" for p in contract.RESERVED_ENV_PREFIXES)
    prefix_text = " or ".join(f"{p}*" for p in contract.RESERVED_ENV_PREFIXES)
    return obj(
        "An environment variable for the trainer container. Entries are added after the operator's own "
        "variables and may override the NCCL_*/GLOO_* tuning knobs and third-party settings "
        "(PYTHONUNBUFFERED, TORCH_DISABLE_SHARE_RDZV_TCP_STORE, MLFLOW_*, WANDB_*, AWS_*, "
        "GOOGLE_APPLICATION_CREDENTIALS), but not the names "
        f"the operator owns: {', '.join(contract.RESERVED_ENV_NAMES)} and {prefix_text}.",
        {
            "name": string(
                "Name of the variable.", min_length=1, max_length=ENV_NAME_LENGTH, pattern=ENV_NAME_PATTERN
            ),
            "value": string(
                "Value of the variable; $(VAR) references are expanded by the kubelet.",
                max_length=ENV_VALUE_LENGTH,
            ),
            "valueFrom": value_from(),
        },
        required=["name"],
        rules=[
            rule(
                f"!(self.name in {reserved}) && {prefixes}",
                message_expression=(
                    "'env ' + self.name + ' is set by the operator and cannot be set in spec.env "
                    "(see kubectl explain trainingjob.spec.env)'"
                ),
            ),
            rule(
                "!(has(self.value) && has(self.valueFrom))",
                message="env[]: value and valueFrom are exclusive",
            ),
        ],
    )


def toleration() -> Schema:
    """A Pod toleration."""
    return obj(
        "Tolerates a node taint, as in a Pod's tolerations.",
        {
            "key": string(
                "Taint key to match; empty with operator Exists matches every taint.", max_length=316
            ),
            "operator": string(
                "How key and value are compared; Kubernetes treats an unset operator as Equal.",
                max_length=8,
                enum=["Exists", "Equal"],
            ),
            "value": string("Taint value to match (operator Equal).", max_length=LABEL_VALUE_LENGTH),
            "effect": string(
                "Taint effect to match; all effects when unset.",
                max_length=16,
                enum=["NoSchedule", "PreferNoSchedule", "NoExecute"],
            ),
            "tolerationSeconds": integer(
                "With effect NoExecute: how long the pod stays bound after the taint appears.", fmt="int64"
            ),
        },
        rules=[
            rule(
                "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                message="tolerations[]: value must be empty when operator is Exists",
            ),
            rule(
                "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
                message="tolerations[]: operator must be Exists when key is empty",
            ),
            rule(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                message="tolerations[]: tolerationSeconds requires effect NoExecute",
            ),
        ],
    )


def string_list(description: str) -> Schema:
    return array(description, {"type": "string", "maxLength": ARG_LENGTH}, max_items=MAX_ARGS)


# CEL helpers for int-or-string quantities. They never call string() on a quantity: the API server cannot
# bound the size of a converted value, and would reject the rule as too expensive.
def parses(value: str) -> str:
    return f"(type({value}) == int || isQuantity({value}))"


def _approximate(value: str) -> str:
    return f"(type({value}) == int ? double({value}) : quantity({value}).asApproximateFloat())"


def not_above(low: str, high: str) -> str:
    both_strings = f"type({low}) == string && type({high}) == string"
    exact = f"quantity({low}).compareTo(quantity({high})) <= 0"
    return f"(({both_strings}) ? {exact} : {_approximate(low)} <= {_approximate(high)})"


def _equals_count(value: str, count: str) -> str:
    as_quantity = f"quantity({value}).isInteger() && quantity({value}).asInteger() == {count}"
    return f"(type({value}) == int ? {value} == {count} : (!isQuantity({value}) || ({as_quantity})))"


def gpu_rule(kind: str) -> Rule:
    """resources.<kind>[nvidia.com/gpu], when given, must equal gpusPerWorker."""
    value = f"self.resources.{kind}['{contract.GPU_RESOURCE}']"
    resources = f"self.resources.{kind}"
    present = f"has(self.resources) && has({resources}) && '{contract.GPU_RESOURCE}' in {resources}"
    return rule(
        f"!({present}) || {_equals_count(value, 'self.gpusPerWorker')}",
        message=f"resources.{kind}[{contract.GPU_RESOURCE}] must equal gpusPerWorker",
        field_path=f".resources.{kind}",
    )


def managed_by() -> Schema:
    """spec.managedBy: this operator (unset, or its name) or Kueue's MultiKueue; nothing else."""
    return string(
        f"The controller that runs the job. Unset or {contract.CONTROLLER_NAME}: this operator. "
        f"{contract.MULTIKUEUE_CONTROLLER}: Kueue's MultiKueue dispatches the job to a worker cluster, "
        "where the operator runs its copy, and mirrors the copy's status here; the operator on this "
        "cluster then only keeps the job's Workload (docs/shared-clusters.md). Immutable.",
        max_length=63,
        enum=list(contract.MANAGED_BY_VALUES),
    )
