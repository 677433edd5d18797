"""The TrainingJob CustomResourceDefinition, built as a dict: the source of truth for the API.

crd/trainingjobs.ml.example.com.yaml and docs/api.md are generated from `custom_resource_definition()`
(`python -m crd write`), crd/defaults.py reads the defaults from it, and a unit test fails when the
committed files differ from what this module builds.
"""

from __future__ import annotations

from typing import Any

from crd import contract
from crd.openapi import Schema, obj, rule, string
from crd.schema_parts import NAME_LENGTH
from crd.schema_spec import spec
from crd.schema_status import status

DNS_1035_LABEL_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
CATEGORIES = ("ml",)


def _name_rules() -> list[dict[str, str]]:
    longest_pod = f"<name>{contract.WORKER_INFIX}{contract.MAX_WORKERS - 1}"
    return [
        rule(
            f"self.size() <= {contract.MAX_JOB_NAME}",
            message=(
                f"metadata.name must be at most {contract.MAX_JOB_NAME} characters: the pod and Service "
                f"names generated from it, e.g. {longest_pod}, would exceed {contract.DNS_LABEL_MAX} "
                "characters"
            ),
        ),
        rule(
            f"self.matches('{DNS_1035_LABEL_PATTERN}')",
            message=(
                "metadata.name must be a DNS-1035 label (lower-case letters, digits and '-', starting with a "
                "letter and ending with a letter or digit): it names the job's Services"
            ),
        ),
    ]


def open_api_schema() -> Schema:
    return obj(
        "TrainingJob runs a distributed machine-learning training job: one pod per worker, a headless "
        "Service for their stable names and a master Service for rank 0; each pod gets the training "
        "configuration in its environment.",
        {
            "apiVersion": string("Versioned schema of this object.", max_length=NAME_LENGTH),
            "kind": string("REST resource this object represents.", max_length=NAME_LENGTH),
            # Only metadata.name may carry rules (the API server validates the rest of ObjectMeta
            # itself); rules here report the field as metadata.name.
            "metadata": {
                "type": "object",
                "properties": {
                    "name": string(
                        f"Name of the job: a DNS-1035 label of at most {contract.MAX_JOB_NAME} characters.",
                        max_length=NAME_LENGTH,
                        rules=_name_rules(),
                    )
                },
            },
            "spec": spec(),
            "status": status(),
        },
        required=["spec"],
    )


def printer_columns() -> list[dict[str, Any]]:
    def column(name: str, kind: str, path: str, description: str, *, wide: bool = False) -> dict[str, Any]:
        shown = {"priority": 1} if wide else {}
        return {"name": name, "type": kind, "jsonPath": path, "description": description, **shown}

    return [
        column("State", "string", ".status.state", "Lifecycle state"),
        column("Progress", "string", ".status.progress", "Training progress"),
        column("Epoch", "integer", ".status.currentEpoch", "Current epoch"),
        column("Workers", "integer", ".status.workers.active", "Running worker pods"),
        column("Restarts", "integer", ".status.restartCount", "Gang restarts"),
        column("Age", "date", ".metadata.creationTimestamp", "Time since creation"),
        column("Queue", "string", ".status.queue.name", "Kueue LocalQueue the job waits in", wide=True),
        column("Roles", "string", ".status.roleSummary", "Running pods per TensorFlow role", wide=True),
        column("Message", "string", ".status.message", "Why the job is in its state", wide=True),
    ]


def scale_subresource() -> dict[str, str]:
    """`kubectl scale tj/NAME --replicas=N` (and a HorizontalPodAutoscaler) sets spec.numWorkers; the
    rules on the spec apply to it as to any update, so an elastic job's stays within its bounds."""
    return {
        "specReplicasPath": ".spec.numWorkers",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }


def custom_resource_definition() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": contract.CRD_NAME,
            "labels": {contract.APP_NAME_LABEL: contract.APP_NAME_VALUE},
        },
        "spec": {
            "group": contract.GROUP,
            "names": {
                "kind": contract.KIND,
                "listKind": f"{contract.KIND}List",
                "plural": contract.PLURAL,
                "singular": contract.SINGULAR,
                "shortNames": list(contract.SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": contract.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": scale_subresource()},
                    "additionalPrinterColumns": printer_columns(),
                    "schema": {"openAPIV3Schema": open_api_schema()},
                }
            ],
        },
    }


def open_api_schema_of(crd: dict[str, Any]) -> Schema:
    """The openAPIV3Schema of the (single) served version of a CRD dict."""
    schema: Schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema
