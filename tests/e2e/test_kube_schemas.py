"""crd/kube_schemas.json is what the generator makes of the local API server's own OpenAPI.

The core/v1 schemas inside the CRD (spec.podTemplate, spec.scheduling.affinity, spec.env[].valueFrom)
are generated, never edited: this test regenerates them from the document the dev cluster's
kube-apiserver serves at /openapi/v3/api/v1, fetched with the built kubectl, and fails when the
committed file differs, so neither the file nor the generator can drift from the Pod API.
"""

from __future__ import annotations

import subprocess
import sys

from crd import kube_schemas
from tests.cluster import REPO, Kubectl


def test_committed_schemas_are_generated_from_the_served_openapi(cluster: Kubectl) -> None:
    regenerated = kube_schemas.regenerated(str(cluster.binary), str(cluster.kubeconfig))
    committed = kube_schemas.SCHEMAS_FILE.read_text(encoding="utf-8")
    assert regenerated == committed, "crd/kube_schemas.json is stale: run `make generate`"


def test_check_command_agrees(cluster: Kubectl) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "crd",
            "kube-schemas",
            "--check",
            f"--kubectl={cluster.binary}",
            f"--kubeconfig={cluster.kubeconfig}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
