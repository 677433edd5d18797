"""The minimum Kubernetes version README and deploy/README.md state, checked against what is shipped.

Why: the operator is tested on one Kubernetes release (the local cluster's), and what it ships uses
APIs and CEL features that older releases do not have. The stated minimum is held three ways: every
object crd/, deploy/ and the examples ship, and the pods the operator builds for the examples, are
valid objects of the minimum's API schemas (kubernetes-validate's, strict: no unknown field); the
release before it lacks an API they use (so the minimum is not lower than stated); and the CEL of the
CRD's rules and of the admission policies uses no feature the minimum's API server refuses in new
rules (CEL_FEATURES: the release from which each library reaches new rules, one after the release
that brings it, as k8s.io/apiserver's pkg/cel/environment/base.go orders them).
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


def test_the_release_before_the_minimum_lacks_an_api_that_is_shipped() -> None:
    major, minor = stated_minimum()
    missing = problems_at((major, minor - 1), shipped())
    assert missing, "every shipped object is valid in the release before the stated minimum: lower it"
    assert "no such API" in missing.values(), missing


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


def test_the_cel_of_the_crd_and_the_policies_is_in_the_minimum() -> None:
    minimum = stated_minimum()
    policies = [obj for _, obj in shipped() if obj["kind"].startswith("ValidatingAdmissionPolicy")]
    cel = [*expressions(custom_resource_definition()), *expressions(policies)]
    assert len(cel) > 100
    used = {
        name: since
        for name, (pattern, since) in CEL_FEATURES.items()
        if any(re.search(pattern, e) for e in cel)
    }
    assert {"optional values", "the quantity library", "the authorizer"} <= set(used)
    newer = {name: text_of(since) for name, since in used.items() if since > minimum}
    assert not newer, f"CEL newer than Kubernetes {text_of(minimum)}: {newer}"
