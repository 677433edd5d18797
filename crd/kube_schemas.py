"""The generated core/v1 schemas (crd/kube_schemas.json): reading them, and fetching their source.

crd/kube_openapi.py turns the API server's /openapi/v3/api/v1 document into structural schemas; the
result is committed so that building the CRD never needs a cluster. This module is the one place that
reads the committed file and the one place that asks a cluster for the document (through kubectl, as a
user would), so `python -m crd kube-schemas` and the cluster test that guards against drift share it.
"""

from __future__ import annotations

import copy
import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from crd.kube_openapi import generate
from crd.openapi import Schema

SCHEMAS_FILE = Path(__file__).resolve().with_name("kube_schemas.json")
OPENAPI_PATH = "/openapi/v3/api/v1"
FETCH_TIMEOUT_SECONDS = 60


class FetchError(RuntimeError):
    """The cluster's OpenAPI document could not be read."""


@cache
def _committed() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMAS_FILE.read_text(encoding="utf-8"))
    return loaded


def schema(name: str) -> Schema:
    """A fresh copy of one generated schema (PodTemplateSpec, Affinity, EnvVarSource)."""
    found: Schema = copy.deepcopy(_committed()["schemas"][name])
    return found


def generated_from() -> dict[str, str]:
    source: dict[str, str] = dict(_committed()["generatedFrom"])
    return source


def render(generated: dict[str, Any]) -> str:
    """The file's text: stable key order (as generated), one space indentation, a final newline."""
    return json.dumps(generated, indent=1, ensure_ascii=False) + "\n"


def _kubectl(kubectl: str, kubeconfig: str | None, *args: str) -> str:
    command = [kubectl, *([f"--kubeconfig={kubeconfig}"] if kubeconfig else []), *args]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=FETCH_TIMEOUT_SECONDS
        )
    except FileNotFoundError:
        raise FetchError(f"{kubectl} not found: start the local cluster (make dev-cluster)") from None
    except subprocess.TimeoutExpired:
        raise FetchError(f"`kubectl {' '.join(args)}` did not answer in {FETCH_TIMEOUT_SECONDS} s") from None
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(f"`kubectl {' '.join(args)}` failed: {detail}")
    return result.stdout


def fetch(kubectl: str, kubeconfig: str | None = None) -> tuple[dict[str, Any], str]:
    """The cluster's /openapi/v3/api/v1 document and its API server's gitVersion."""
    document = json.loads(_kubectl(kubectl, kubeconfig, "get", "--raw", OPENAPI_PATH))
    version = json.loads(_kubectl(kubectl, kubeconfig, "version", "-o", "json"))
    server = version.get("serverVersion", {}).get("gitVersion")
    if not server:
        raise FetchError("`kubectl version` named no server version")
    return document, str(server)


def regenerated(kubectl: str, kubeconfig: str | None = None) -> str:
    """What crd/kube_schemas.json should hold, generated from the cluster's served document."""
    document, version = fetch(kubectl, kubeconfig)
    return render(generate(document, version))
