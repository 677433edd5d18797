"""The minimum Kubernetes version README and deploy/README.md state, checked against what is shipped.

Why: the operator is tested on one Kubernetes release (the local cluster's), and what it ships uses
APIs, CEL features and CEL costs that older releases do not take. The stated minimum must be exactly
the newest of what the parts need, each computed here:

- the APIs: the first release whose API schemas (kubernetes-validate's, strict: no unknown field) take
  every object crd/, deploy/ and the examples ship; the pods the operator builds for the examples are
  valid objects of the minimum too;
- the CEL of the CRD's rules and of the admission policies: the release from which each library they
  use reaches new rules (CEL_FEATURES: one after the release that brings it, as k8s.io/apiserver's
  pkg/cel/environment/base.go orders them);
- the CRD's rule costs: a rule that parses every int-or-string quantity of a map (CRD_COSTS) is within
  the API server's budget only from 1.34, which bounds such a value's size by its maxLength (earlier
  releases take the largest request's size: kube-apiserver 1.30.14, 1.31.14, 1.32.13 and 1.33.13,
  built from Go modules on 2026-11-29, refused the CRD at four times the budget).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import kubernetes_validate
import pytest
import yaml

from builders.pods import build_pod
from controller import resources
from controller.runtime import resource
from controller.runtime.resource import Resource
from crd import contract
from crd.defaults import with_defaults
from crd.schema import custom_resource_definition
from crd.spec import parse
from tests.unit.manifests_support import TARGETS, rendered

REPO = Path(__file__).resolve().parents[2]
Manifest = dict[str, Any]

# A CEL feature (a pattern of the expressions that use it) and the first release whose API server takes
# it in a new rule.
CEL_FEATURES: Final = {
    "optional values": (r"\.\?|\[\?|\.orValue\(|\.hasValue\(|\boptional\.", (1, 29)),
    "the quantity library": (r"\b(quantity|isQuantity)\(", (1, 29)),
    "the authorizer": (r"\bauthorizer\b", (1, 28)),
    "the sets library": (r"\bsets\.", (1, 30)),
    "the IP and CIDR libraries": (r"\b(ip|cidr|isIP|isCIDR)\(", (1, 31)),
    "the format library": (r"\bformat\.\w+\(", (1, 32)),
    "field and label selectors on the authorizer": (r"\.(fieldSelector|labelSelector)\(", (1, 32)),
    "two-variable comprehensions": (
        r"\.(all|exists|existsOne|exists_one|transformList|transformMap|transformMapEntry)\(\s*\w+\s*,\s*\w+\s*,",
        (1, 33),
    ),
    "the semver library": (r"\b(semver|isSemver)\(", (1, 34)),
    "the lists library's newer functions": (
        r"\.(sortBy|sort|distinct|flatten|slice|first|last)\(|\blists\.",
        (1, 35),
    ),
}
# A property of a CRD rule that makes its estimated cost depend on the release, and the first release
# that takes it: the quantity library over each int-or-string value of a map or list.
CRD_COSTS: Final = {
    "a rule parsing every int-or-string quantity of a map or list": (1, 34),
}
# The releases kubernetes-validate has the API schemas of.
VALIDATED: Final = [(1, minor) for minor in range(25, 38)]
# Groups of objects that are not Kubernetes' own (the operator's CRD, the Prometheus operator's, the
# gang schedulers', Kueue's): their schemas are not the minimum's to check.
NOT_KUBERNETES: Final = (
    "ml.example.com",
    "monitoring.coreos.com",
    "scheduling.x-k8s.io",
    "scheduling.volcano.sh",
    "kueue.x-k8s.io",
)


def version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def stated_minimum() -> tuple[int, int]:
    """The minimum README and deploy/README.md state (they must agree)."""
    readme = " ".join((REPO / "README.md").read_text().split())
    deploy = (REPO / "deploy" / "README.md").read_text()
    [in_readme] = re.findall(r"Kubernetes (\d+\.\d+) or later", readme)
    [in_deploy] = re.findall(r"(?m)^## Kubernetes (\d+\.\d+) or later$", deploy)
    assert in_readme == in_deploy
    return version(in_readme)


def text_of(minimum: tuple[int, int]) -> str:
    return f"{minimum[0]}.{minimum[1]}"


def documents(path: Path) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]


def shipped() -> Iterator[tuple[str, Manifest]]:
    """Every object crd/ installs, deploy/ renders for each target, and the examples hold."""
    for path in sorted((REPO / "crd").glob("*.yaml")):
        if path.name != "kustomization.yaml":
            yield from ((f"crd/{path.name}", doc) for doc in documents(path))
    for target in TARGETS:
        yield from ((target, obj) for obj in rendered(target))
    for path in sorted((REPO / "examples").glob("*.yaml")):
        yield from ((f"examples/{path.name}", doc) for doc in documents(path))


def is_kubernetes(api_version: str) -> bool:
    group = api_version.rpartition("/")[0]
    return group not in NOT_KUBERNETES


def example_pods() -> Iterator[tuple[str, Manifest]]:
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for doc in documents(path):
            if doc.get("kind") == contract.KIND:
                stored = with_defaults(
                    {**doc, "metadata": {**doc["metadata"], "namespace": "ml", "uid": "u"}}
                )
                yield path.name, build_pod(parse(stored), 0, attempt=0, resume_from=None)


def problems_at(minimum: tuple[int, int], objects: Iterator[tuple[str, Manifest]]) -> dict[str, str]:
    found = {}
    for where, obj in objects:
        if not is_kubernetes(obj["apiVersion"]):
            continue
        name = f"{where}: {obj['apiVersion']} {obj['kind']} {obj['metadata'].get('name', '')}"
        try:
            kubernetes_validate.validate(obj, text_of(minimum), strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            found[name] = "no such API"
        except kubernetes_validate.ValidationError as error:
            found[name] = f"{'.'.join(str(part) for part in error.path)}: {error.message}"
    return found


def test_readme_and_deploy_readme_state_the_same_minimum() -> None:
    assert stated_minimum() >= (1, 25)  # kubernetes-validate's oldest schemas


def test_what_is_shipped_is_valid_in_the_minimum() -> None:
    minimum = stated_minimum()
    assert problems_at(minimum, shipped()) == {}
    assert problems_at(minimum, example_pods()) == {}


def test_the_operators_own_api_calls_exist_in_the_minimum() -> None:
    minimum = text_of(stated_minimum())
    calls = {
        value
        for module in (resource, resources)
        for value in vars(module).values()
        if isinstance(value, Resource) and is_kubernetes(value.api_version)
    }
    assert {resources.LEASES, resources.ADMISSION_POLICIES, resources.TOKENREVIEWS} <= calls
    for call in calls:
        obj = {"apiVersion": call.api_version, "kind": call.kind, "metadata": {"name": "x"}}
        try:
            kubernetes_validate.validate(obj, minimum, strict=False)
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{call.api_version} {call.kind} is not served by Kubernetes {minimum}")
        except kubernetes_validate.ValidationError:
            pass  # the API exists; this stand-in object is just not a whole one


def expressions(node: Any) -> Iterator[str]:
    """The CEL expressions under `node`: CRD rules and their message expressions, and a policy's
    validations, match conditions, variables and audit annotations."""
    if isinstance(node, dict):
        for key in ("rule", "expression", "messageExpression", "valueExpression"):
            if isinstance(node.get(key), str):
                yield node[key]
        for value in node.values():
            yield from expressions(value)
    elif isinstance(node, list):
        for value in node:
            yield from expressions(value)


def api_floor() -> tuple[int, int]:
    """The first release whose API schemas take every shipped object."""
    objects = list(shipped())
    return next(release for release in VALIDATED if not problems_at(release, iter(objects)))


def cel_used() -> dict[str, tuple[int, int]]:
    policies = [obj for _, obj in shipped() if obj["kind"].startswith("ValidatingAdmissionPolicy")]
    cel = [*expressions(custom_resource_definition()), *expressions(policies)]
    assert len(cel) > 100
    return {
        name: since
        for name, (pattern, since) in CEL_FEATURES.items()
        if any(re.search(pattern, e) for e in cel)
    }


def int_or_string_items(node: Any) -> bool:
    """Whether a schema node is a map or list of int-or-string values."""
    if not isinstance(node, dict):
        return False
    values = node.get("additionalProperties") or node.get("items")
    return isinstance(values, dict) and bool(values.get("x-kubernetes-int-or-string"))


def costly_rules(node: Any, path: str = "") -> Iterator[str]:
    """The CRD's rules that parse every int-or-string quantity of a map or list under their node."""
    if not isinstance(node, dict):
        return
    iterated = [name for name, child in (node.get("properties") or {}).items() if int_or_string_items(child)]
    for entry in node.get("x-kubernetes-validations") or ():
        rule = entry["rule"]
        if any(
            re.search(rf"self\.{name}\.(all|exists|exists_one|map|filter)\(", rule) for name in iterated
        ) and (re.search(r"\b(quantity|isQuantity)\(", rule)):
            yield path or "<root>"
    for name, child in (node.get("properties") or {}).items():
        yield from costly_rules(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        yield from costly_rules(node.get(key), f"{path}[]")


def test_the_cel_of_the_crd_and_the_policies_is_in_the_minimum() -> None:
    used = cel_used()
    assert {"optional values", "the quantity library", "the authorizer"} <= set(used)
    minimum = stated_minimum()
    newer = {name: text_of(since) for name, since in used.items() if since > minimum}
    assert not newer, f"CEL newer than Kubernetes {text_of(minimum)}: {newer}"


def test_the_stated_minimum_is_the_newest_release_a_part_needs() -> None:
    schema = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    costly = list(costly_rules(schema))
    assert costly == [".spec.resources"], costly  # requests within limits, for every resource
    needs = {
        "the APIs": api_floor(),
        **cel_used(),
        **{name: since for name, since in CRD_COSTS.items() if costly},
    }
    assert needs["the APIs"] == (1, 30)  # ValidatingAdmissionPolicy, admissionregistration.k8s.io/v1
    newest = max(needs.values())
    assert stated_minimum() == newest, {name: text_of(since) for name, since in needs.items()}
