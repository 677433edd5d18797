"""A mutating admission webhook that sends one TrainingJob's pods to the real node.

Why: a test that runs a document's examples as written (docs/client.md) cannot add the real node's
toleration and node selector to the jobs those examples create, yet their trainers must run in
containers for the examples' logs and progress to be real. A platform team solves the same problem
with admission (a team's namespace sent to its node pool); here a webhook served by the test on
127.0.0.1, registered for the pods of one job in the test's namespace only, adds the placement
`tests/e2e/realnode.py` gives every job on the node. Nothing else on the shared cluster goes through
it, and its configuration is deleted when the test ends.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from crd import contract
from testbed import Kubectl, pod_on_node, serving_certificate
from tests.e2e.jobs import wait
from tests.e2e.realnode import SELECTOR, TOLERATION

JsonDict = dict[str, Any]


def placement_patch(pod: JsonDict) -> list[JsonDict]:
    """JSON Patch operations that add the real node's selector and toleration to a pod's spec, next to
    what it has."""
    spec = pod.get("spec") or {}
    selector = {**(spec.get("nodeSelector") or {}), **SELECTOR}
    tolerations = [*(spec.get("tolerations") or []), TOLERATION]
    return [
        {"op": "add", "path": "/spec/nodeSelector", "value": selector},
        {"op": "add", "path": "/spec/tolerations", "value": tolerations},
    ]


def review_answer(review: JsonDict) -> JsonDict:
    """The AdmissionReview answer to a pod's creation: allowed, with the placement patch."""
    request = review["request"]
    patch = base64.b64encode(json.dumps(placement_patch(request["object"])).encode()).decode()
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": request["uid"], "allowed": True, "patchType": "JSONPatch", "patch": patch},
    }


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        body = json.dumps(review_answer(review)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _placed(kubectl: Kubectl, namespace: str, job: str) -> bool:
    """Whether the API server calls the webhook yet: a pod of the job created as a server-side dry run
    comes back placed on the node (an API server picks a new configuration up within a moment)."""
    probe = pod_on_node("webhook-probe", ["true"], tolerations=[], nodeSelector={})
    probe["metadata"]["labels"] = {contract.JOB_NAME_LABEL: job}
    created = kubectl.run(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", "-o", "json", stdin=json.dumps(probe)
    )
    placed: JsonDict = json.loads(created)["spec"]
    return placed.get("nodeSelector") == SELECTOR


@contextlib.contextmanager
def job_pods_on_node(kubectl: Kubectl, namespace: str, job: str, workdir: Path) -> Iterator[None]:
    """While open, every pod of TrainingJob `job` created in `namespace` is placed on the real node."""
    pki = serving_certificate(workdir, "webhook")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki / "webhook.crt"), str(pki / "webhook.key"))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="node-webhook", daemon=True)
    thread.start()
    name = f"tj-test-real-node-{namespace}"[:253]
    configuration = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "real-node.tests.ml.example.com",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{server.server_address[1]}/place",
                    "caBundle": base64.b64encode((pki / "ca.crt").read_bytes()).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "objectSelector": {"matchLabels": {contract.JOB_NAME_LABEL: job}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
            }
        ],
    }
    kubectl.apply(configuration)
    try:
        wait("the webhook placing the job's pods", lambda: _placed(kubectl, namespace, job), timeout=60)
        yield
    finally:
        kubectl.run("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found", check=False)
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
