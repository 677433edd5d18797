"""What the deploy tests end to end share (tests/e2e/test_deploy.py, tests/e2e/test_deploy_identity_e2e.py):
listing manifests for kubectl, and the module-scoped fixtures of the install's identity objects
applied for real and of a kubectl authenticated as the operator's ServiceAccount, which each test
module binds to its own names.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed import Kubectl
from tests.e2e.operator_identity import (
    apply_identity,
    operator_kubeconfig,
)

Manifest = dict[str, Any]


def as_list(objects: list[Manifest]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


@pytest.fixture(scope="module")
def identity(cluster: Kubectl) -> list[Manifest]:
    """The default install's namespace, ServiceAccount and RBAC, applied for real (shared, idempotent)."""
    return apply_identity(cluster)


@pytest.fixture(scope="module")
def operator(cluster: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    """kubectl authenticated with a token of the operator's ServiceAccount."""
    return Kubectl(cluster.binary, operator_kubeconfig(cluster, tmp_path_factory.mktemp("operator")))
