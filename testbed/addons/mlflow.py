"""MLflow's tracking server on the dev cluster's real node: `hack/dev-cluster.sh up --with mlflow`.

Why: spec.monitoring.mlflowTrackingUri is proven against MLflow's own server, not a stand-in. It runs
as a workload of the cluster, as a platform team runs it: a Deployment on the real node from the image
testbed/images/mlflow.py builds (MLflow pinned in hack/versions.env), a SQLite backend store and the
artifacts it serves itself (`--serve-artifacts`, so trainers upload through the server and need no
storage credentials), both on one claim of the local-path provisioner, and the Service
`mlflow.ml-infra` on port 5000 (TRACKING_URI, which docs/progress.md names). It listens inside its
pod's network namespace on the node; tests reach it from the machine through `kubectl port-forward`.

Its image is built on first use (cached by key) and imported into the node by `add`; the objects
are applied each time (unchanged ones stay), so a second `up` finds it running. `remove mlflow`
deletes its namespace; `down` takes it with the cluster.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from testbed import images
from testbed.cluster.processes import kubectl
from testbed.cluster.state import record_started, say, write_state
from testbed.common import ToolError
from testbed.images import mlflow as mlflow_image
from testbed.node import nodeconfig, realnode

NAME: Final = "mlflow"
NAMESPACE: Final = "ml-infra"
SERVICE: Final = "mlflow"
PORT: Final = 5000
FQDN: Final = f"{SERVICE}.{NAMESPACE}.svc.cluster.local"
TRACKING_URI: Final = f"http://{FQDN}:{PORT}"
CLAIM: Final = "mlflow-data"
DATA: Final = "/data"
LABELS: Final = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "trainingjob-dev"}
READY_TIMEOUT: Final = 180.0
# The Host headers the server accepts (its DNS-rebinding guard): the Service's names, with or
# without the port, and loopback (a port-forward). Pod addresses (10.*) are private: accepted by default,
# but naming the list replaces the default.
ALLOWED_HOSTS: Final = (
    *(
        f"{name}{port}"
        for name in (SERVICE, f"{SERVICE}.{NAMESPACE}", f"{SERVICE}.{NAMESPACE}.svc", FQDN)
        for port in ("", ":*")
    ),
    "localhost:*",
    "127.0.0.1:*",
    "10.*",
)


@dataclass(frozen=True)
class MlflowServer:
    """The dev cluster's MLflow server as tests see it (`testbed.MLFLOW`): the component's name for
    `up --with`, where it runs and the URI jobs log to."""

    name: str = NAME
    namespace: str = NAMESPACE
    service: str = SERVICE
    deployment: str = SERVICE
    port: int = PORT
    tracking_uri: str = TRACKING_URI
    selector: str = ",".join(f"{key}={value}" for key, value in LABELS.items())


MLFLOW: Final = MlflowServer()


def server_command() -> list[str]:
    return [
        "python3",
        "-m",
        "mlflow",
        "server",
        "--host=0.0.0.0",
        f"--port={PORT}",
        "--workers=1",
        f"--backend-store-uri=sqlite:///{DATA}/mlflow.db",
        "--serve-artifacts",
        f"--artifacts-destination={DATA}/artifacts",
        f"--allowed-hosts={','.join(ALLOWED_HOSTS)}",
    ]


def manifests(image: str) -> list[dict[str, Any]]:
    """The server's objects: its namespace, the claim of its database and artifacts, the Deployment
    on the real node (Recreate: the claim is ReadWriteOnce) and the Service."""
    metadata = {"namespace": NAMESPACE, "labels": LABELS}
    pod_spec = {
        "nodeSelector": {nodeconfig.REAL_NODE_LABEL: "true"},
        "tolerations": [{**nodeconfig.TAINT, "operator": "Equal"}],
        "containers": [
            {
                "name": "mlflow",
                "image": image,
                "imagePullPolicy": "Never",
                "command": server_command(),
                "env": [{"name": "HOME", "value": DATA}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
                "ports": [{"name": "http", "containerPort": PORT}],
                "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 2},
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                "volumeMounts": [{"name": "data", "mountPath": DATA}],
            }
        ],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}}],
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": LABELS}},
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM, **metadata},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": SERVICE, **metadata},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": LABELS},
                "template": {"metadata": {"labels": LABELS}, "spec": pod_spec},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, **metadata},
            "spec": {"selector": LABELS, "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]},
        },
    ]


def build() -> Path:
    """The server's image, built unless cached; its archive."""
    return images.ensure(mlflow_image.NAME).archive


def add(state: dict[str, Any]) -> None:
    """Imports the image into the real node, applies the objects and waits until the server answers
    its readiness probe. The real node must run."""
    if not state.get("real_node"):
        raise ToolError(f"{NAME} runs on the real node: `hack/dev-cluster.sh up --with real-node,{NAME}`")
    bin_dir = Path(state["bin_dir"])
    realnode.import_images(realnode.build_binaries(), (mlflow_image.NAME,))
    listing = {"apiVersion": "v1", "kind": "List", "items": manifests(mlflow_image.reference())}
    kubectl(bin_dir, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(listing))
    wait_ready(bin_dir)
    say(f"{NAME}: MLflow {mlflow_image.version()} serves at {TRACKING_URI} (namespace {NAMESPACE})")
    if NAME not in state.get("optional", []):
        record_started(state, NAME, {"MLFLOW_VERSION": mlflow_image.version()})


def ready(bin_dir: Path) -> bool:
    found = kubectl(bin_dir, "get", "deployment", SERVICE, "-n", NAMESPACE, "-o", "json", check=False)
    status = json.loads(found or "{}").get("status") or {}
    return int(status.get("readyReplicas") or 0) >= 1 and int(status.get("updatedReplicas") or 0) >= 1


def wait_ready(bin_dir: Path, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not ready(bin_dir):
        if time.monotonic() > deadline:
            pods = kubectl(bin_dir, "get", "pods", "-n", NAMESPACE, "-o", "wide", check=False)
            raise ToolError(f"{NAME} did not become ready within {timeout:.0f}s:\n{pods.strip()}")
        time.sleep(1)


def remove(state: dict[str, Any]) -> None:
    """Deletes its namespace (the claim and its files with it) and forgets it."""
    bin_dir = Path(state["bin_dir"])
    kubectl(bin_dir, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", check=False)
    added = [name for name in state.get("optional", []) if name != NAME]
    state["optional"] = added
    write_state("optional", added)
