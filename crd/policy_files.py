"""What every admission policy crd/ generates shares: its labels, its Deny binding and its YAML file.

Why: the policies rendered from Python (crd/immutability.py, crd/escalation_policy.py) are installed and
removed with the CRD by their label (`make undeploy` keeps crd/'s objects by it), are bound the same way
(Deny, cluster-wide) and are written as one file of two documents whose CEL stays readable. One place
for it, so a third policy is rendered the same way and a change reaches all of them.
"""

from __future__ import annotations

from typing import Any, Final

import yaml

JsonDict = dict[str, Any]

LABELS: Final = {"app.kubernetes.io/name": "trainingjob"}


def deny_binding(policy_name: str) -> JsonDict:
    """The ValidatingAdmissionPolicyBinding that enforces `policy_name` everywhere (Deny)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name, "labels": dict(LABELS)},
        "spec": {"policyName": policy_name, "validationActions": ["Deny"]},
    }


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the CEL expressions) as literal blocks, as one would write them by hand."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_BlockDumper.add_representer(str, _string)


def policy_file(header: str, *documents: JsonDict) -> str:
    """A generated policy file: its header comment, then the documents as YAML."""
    dumped = (yaml.dump(d, Dumper=_BlockDumper, sort_keys=False, width=110) for d in documents)
    return header + "---\n".join(dumped)
