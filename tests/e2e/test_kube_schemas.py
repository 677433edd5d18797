"""crd/kube_schemas.json is what the generator makes of the local API server's own OpenAPI.

The core/v1 schemas inside the CRD (spec.podTemplate, spec.scheduling.affinity, spec.env[].valueFrom)
are generated, never edited: this test regenerates them from the document the dev cluster's
kube-apiserver serves at /openapi/v3/api/v1, fetched with the built kubectl, and fails when the
committed file differs, so neither the file nor the generator can drift from the Pod API. It also
holds docs/schema.md's size of the CRD as stored, which only a cluster can measure.
"""

from __future__ import annotations

import subprocess
import sys

from crd import contract, kube_openapi, kube_schemas
from testbed import Kubectl
from tests.cluster import REPO
from tests.unit.test_docs_figures import KIB, SCHEMA_DOC, about, size_row, stated

CRD_NAME = f"{contract.PLURAL}.{contract.GROUP}"


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


def test_schema_doc_states_the_stored_crds_size(cluster: Kubectl) -> None:
    """docs/schema.md's size of the CRD as the API server stores it (the object with its managed fields
    and status), within the tolerance of tests/unit/test_docs_figures.py."""
    stored = cluster.run(
        "get", "--raw", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}"
    )
    kib = len(stored.encode()) / KIB
    text = SCHEMA_DOC.read_text()
    assert about(size_row(text, "the stored object"), kib), f"stored: {kib:.1f} KiB"


def test_schema_doc_counts_the_deprecated_volume_types_left_out(cluster: Kubectl) -> None:
    """The in-tree volume types the served Pod API marks deprecated: none is in the generated schema, and
    docs/schema.md counts them."""
    document, _ = kube_schemas.fetch(str(cluster.binary), str(cluster.kubeconfig))
    served = document["components"]["schemas"][kube_openapi.CORE + "Volume"]["properties"]
    deprecated = {
        name for name, field in served.items() if kube_openapi.DEPRECATED.search(field.get("description", ""))
    }
    pod_spec = kube_schemas.schema("PodTemplateSpec")["properties"]["spec"]
    assert not deprecated & set(pod_spec["properties"]["volumes"]["items"]["properties"])
    assert int(stated(SCHEMA_DOC.read_text(), r"\(the (\d+) in-tree volume types")) == len(deprecated)
