"""Render the CRD dict as the committed YAML manifest and as the markdown API reference.

Both artifacts are checked into the repository (kubectl and kustomize read the YAML; people read
docs/api.md), and both must match crd/schema.py byte for byte, so rendering is deterministic: key
order as built, no timestamps, fixed line width.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from crd import contract
from crd.escalation import PRIVILEGED_RESOURCE, USE_VERB
from crd.escalation_policy import POLICY_FILE_NAME as ESCALATION_POLICY_FILE
from crd.evolution import SECTION as EVOLUTION_SECTION
from crd.immutability import IMMUTABLE_FIELDS, POLICY_FILE_NAME
from crd.openapi import Schema
from crd.schema import custom_resource_definition, open_api_schema_of, printer_columns
from crd.schema_frameworks import PADDLE_ROLE_RULES, XGBOOST_ROLE_RULES
from crd.schema_mpi import ROLE_RULES as MPI_ROLE_RULES
from crd.schema_tensorflow import ROLE_RULES

CRD_FILE_NAME = f"{contract.CRD_NAME}.yaml"
YAML_HEADER = "# Generated from crd/schema.py by `python -m crd write`; do not edit by hand.\n"
DOCS_HEADER = "<!-- Generated from crd/schema.py by `python -m crd write`; do not edit by hand. -->\n"


def crd_yaml() -> str:
    body = yaml.safe_dump(custom_resource_definition(), sort_keys=False, width=110, allow_unicode=True)
    return YAML_HEADER + body


def _object_type_name(node: Schema) -> str:
    if isinstance(node.get("additionalProperties"), dict):
        return "map[string]" + type_name(node["additionalProperties"])
    if node.get("x-kubernetes-preserve-unknown-fields") and not node.get("properties"):
        return "object (free-form)"
    return "object"


def type_name(node: Schema) -> str:
    kind = str(node.get("type", ""))
    if node.get("x-kubernetes-int-or-string"):
        name = "quantity (integer or string)"
    elif kind == "array":
        name = "[]" + type_name(node["items"])
    elif kind == "object":
        name = _object_type_name(node)
    elif "format" in node:
        name = f"{kind} ({node['format']})"
    else:
        name = kind
    return name


def _children(node: Schema) -> Iterator[tuple[str, Schema, bool]]:
    required = set(node.get("required", ()))
    for name, child in node.get("properties", {}).items():
        yield name, child, name in required


def walk(node: Schema, prefix: str) -> Iterator[tuple[str, Schema, bool]]:
    """Every field under `node` as (dotted path, schema, required), depth first in declaration order."""
    for name, child, required in _children(node):
        path = f"{prefix}.{name}" if prefix else name
        yield path, child, required
        inner = child["items"] if child.get("type") == "array" else child
        inner_path = f"{path}[]" if child.get("type") == "array" else path
        yield from walk(inner, inner_path)


def rules(node: Schema, prefix: str) -> Iterator[tuple[str, dict[str, str]]]:
    """Every CEL rule under `node` (including its own) with the path of the node carrying it."""
    for entry in node.get("x-kubernetes-validations", ()):
        yield prefix, entry
    for name, child, _ in _children(node):
        path = f"{prefix}.{name}" if prefix else name
        if child.get("type") == "array":
            yield from rules(child, path)
            yield from rules(child["items"], f"{path}[]")
        else:
            yield from rules(child, path)


# Kubernetes' own types embedded in the spec (crd/kube_schemas.json) and how many levels of each the
# reference lists; `kubectl explain` shows every level.
EMBEDDED_TYPES = {
    "spec.podTemplate": ("PodTemplateSpec", 2),
    "spec.scheduling.affinity": ("Affinity", 1),
    "spec.env[].valueFrom": ("EnvVarSource", 1),
}


def documented(path: str) -> bool:
    """Whether docs/api.md lists a field: all of them, except the deep levels of embedded core/v1 types."""
    for root, (_, levels) in EMBEDDED_TYPES.items():
        if path.startswith(root + ".") and path[len(root) + 1 :].count(".") >= levels:
            return False
    return True


def _embedded_note() -> str:
    types = "; ".join(f"`{root}` (core/v1 {name})" for root, (name, _) in EMBEDDED_TYPES.items())
    return (
        f"The deeper fields of {types} are Kubernetes' own, generated from the API server's OpenAPI "
        "(docs/schema.md): `kubectl explain trainingjob.spec.podTemplate.spec.containers.securityContext` "
        "shows them with their descriptions."
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _field_table(node: Schema, prefix: str) -> list[str]:
    lines = ["| Field | Type | Required | Description |", "|---|---|---|---|"]
    for path, child, required in walk(node, prefix):
        if not documented(path):
            continue
        lines.append(
            f"| `{path}` | {_cell(type_name(child))} | {'yes' if required else ''} | "
            f"{_cell(child.get('description', ''))} |"
        )
    return lines


def _rule_message(entry: dict[str, str]) -> str:
    if "message" in entry:
        return entry["message"]
    return f"computed: `{entry['messageExpression']}`"


def api_docs() -> str:
    crd = custom_resource_definition()
    root = open_api_schema_of(crd)
    names = crd["spec"]["names"]
    lines = [
        DOCS_HEADER,
        f"# {contract.KIND} API reference ({contract.API_VERSION})",
        "",
        root["description"],
        "",
        f"Kind `{names['kind']}`, plural `{names['plural']}`, short name "
        f"{', '.join(f'`{n}`' for n in names['shortNames'])}, categories "
        f"{', '.join(f'`{c}`' for c in names['categories'])}; namespaced; status subresource.",
        "",
        "Defaults are applied by the API server and show up in `kubectl get -o yaml`. Fields whose default "
        "depends on other fields (image, command, networking.backend, the checkpoint claim, "
        "monitoring.mlflowExperiment, monitoring.tensorboardLogDir) are filled in by the operator when it "
        "builds the pods and are not written back.",
        "",
        "## Printer columns",
        "",
        "| Column | Type | JSONPath | Description |",
        "|---|---|---|---|",
        *(
            f"| {c['name']} | {c['type']} | `{c['jsonPath']}` | {c['description']} |"
            for c in printer_columns()
        ),
        "",
        "## spec",
        "",
        *_field_table(root["properties"]["spec"], "spec"),
        "",
        _embedded_note(),
        "",
        "## Replica roles (spec.tensorflow)",
        "",
        "A TensorFlow job's pods play roles, as in Kubeflow's TFJob. Their order (the chief, the workers, "
        "the parameter servers, the evaluator) makes the first one, the chief or else worker 0, the job's "
        "rank 0. What each role's end does to the job:",
        "",
        "| Role | Pods | In TF_CONFIG's cluster | Its success | Its failure |",
        "|---|---|---|---|---|",
        *(f"| {' | '.join(_cell(text) for text in row)} |" for row in ROLE_RULES),
        "",
        *_framework_roles(),
        "## status",
        "",
        *_field_table(root["properties"]["status"], "status"),
        "",
        "## Validation rules (CEL)",
        "",
        "Checked by the API server on create and update; the answer names the field of each violation.",
        "",
        "| Where | Rule | Message |",
        "|---|---|---|",
        *(
            f"| `{path or '(root)'}`{_field_path_note(entry)} | `{_cell(entry['rule'])}` | "
            f"{_cell(_rule_message(entry))} |"
            for path, entry in rules(root, "")
        ),
        "",
        "## Fields that cannot change",
        "",
        f"A change of these is refused by the ValidatingAdmissionPolicy `{contract.IMMUTABLE_SPEC_POLICY}` "
        f"(crd/{POLICY_FILE_NAME}, installed with the CRD), whose answer names every field that changed "
        "(`spec.model is immutable`). A policy and not transition rules in the schema: the API server "
        "evaluates the schema's rules on status writes too, and those cannot change spec. "
        '"Added or removed": a field without a default may not be added or removed after create either.',
        "",
        "| Field | Added or removed too |",
        "|---|---|",
        *_immutable_rows(),
        "",
        "## Settings that need a right",
        "",
        f"The ValidatingAdmissionPolicy `{contract.ESCALATION_POLICY}` (crd/{ESCALATION_POLICY_FILE}, "
        "installed with the CRD) refuses, on create and on an update that adds them, the settings that give "
        'a job\'s pods more than the "baseline" Pod Security Standard allows (privileged containers, host '
        "namespaces, hostPath volumes, hostPorts, added capabilities, `networking.rdmaEnabled`, ...) and a "
        "`serviceAccountName` other than the trainers' account, unless the requester may create pods in the "
        f"namespace (or holds the verb `{USE_VERB}` on `{PRIVILEGED_RESOURCE}`, or `{USE_VERB}` on that "
        "ServiceAccount); and it refuses pods the namespace's Pod Security level "
        "(`pod-security.kubernetes.io/enforce`) would refuse. Its answer names each field "
        "(`spec.podTemplate.spec.hostNetwork=true: more than the baseline Pod Security Standard allows, "
        "...`). [security.md](security.md) says what each setting gives, how to grant the verbs and how to "
        "relax it.",
        "",
        *EVOLUTION_SECTION,
    ]
    return "\n".join(lines)


def _framework_roles() -> Iterator[str]:
    """The roles of XGBoost's and PaddlePaddle's jobs, and the frameworks refused as retired."""
    for title, intro, rows in (
        (
            "mpi",
            "An MPI job is Kubeflow's MPIJob (v2beta1): numWorkers workers that serve SSH, and a launcher "
            "that runs spec.command (`mpirun ...`) against the hostfile (docs/env.md, MPI). The Rank column "
            "says where mpirun puts the ranks. What each role's end does to the job:",
            MPI_ROLE_RULES,
        ),
        (
            "xgboost",
            "An XGBoost job is Kubeflow's XGBoostJob: a master, rank 0, that runs the tracker, and the "
            "numWorkers workers that join it (docs/env.md, XGBoost). What each role's end does to the job:",
            XGBOOST_ROLE_RULES,
        ),
        (
            "paddlepaddle",
            "A PaddlePaddle job is Kubeflow's PaddleJob in collective mode: workers only, each started by "
            "`python -m paddle.distributed.launch` (docs/env.md, PaddlePaddle):",
            PADDLE_ROLE_RULES,
        ),
    ):
        yield from (
            f"## Replica roles (framework {title})",
            "",
            intro,
            "",
            "| Role | Pods | Rank | Its success | Its failure |",
            "|---|---|---|---|---|",
            *(f"| {' | '.join(_cell(text) for text in row)} |" for row in rows),
            "",
        )
    yield from ("## Retired frameworks", "", "Refused at admission, with why and what to use instead:", "")
    yield from (f"- `{name}`: {reason}." for name, reason in contract.RETIRED_FRAMEWORKS.items())
    yield ""


def _immutable_rows() -> Iterator[str]:
    for field in IMMUTABLE_FIELDS:
        yield f"| `{field.name}` | {'yes' if field.presence else 'no (always present)'} |"


def _field_path_note(entry: dict[str, Any]) -> str:
    return f" (reported at `{entry['fieldPath']}`)" if "fieldPath" in entry else ""
