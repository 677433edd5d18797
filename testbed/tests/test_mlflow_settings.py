"""MLflow's tracking server on the dev cluster (`up --with mlflow`, testbed/addons/mlflow.py), without a
cluster: what `--with` brings along, the objects it applies, its image's pin and name, and that an
import of the node's other images keeps its image. Running it: tests/e2e/test_mlflow_real_node.py."""

from __future__ import annotations

import re

from testbed.addons import mlflow
from testbed.addons.optional import parse_with
from testbed.common import REPO
from testbed.images import mlflow as mlflow_image
from testbed.node import nodeconfig, nodeimages


def test_with_mlflow_brings_the_real_node_first() -> None:
    assert parse_with("mlflow") == ["real-node", "mlflow"]
    assert parse_with("real-node,mlflow,mlflow") == ["real-node", "mlflow"]


def test_its_version_is_pinned_in_versions_env_and_names_its_image() -> None:
    pinned = re.search(
        r"^MLFLOW_VERSION=\$\{MLFLOW_VERSION:-(.+)\}$", (REPO / "hack/versions.env").read_text(), re.M
    )
    assert pinned is not None
    assert mlflow_image.version() == pinned.group(1)
    assert mlflow_image.reference() == f"trainingjob-dev/mlflow:{pinned.group(1)}"
    extra = (REPO / "setup.cfg").read_text().split("tracking =", 1)[1].split("\n[", 1)[0]
    assert f"mlflow-skinny=={pinned.group(1)}" in extra  # the trainers' client at the server's version


def test_the_objects_run_the_server_on_the_node_with_its_store_on_a_claim() -> None:
    objects = {item["kind"]: item for item in mlflow.manifests("trainingjob-dev/mlflow:1")}
    assert set(objects) == {"Namespace", "PersistentVolumeClaim", "Deployment", "Service"}
    assert {item["metadata"].get("namespace", item["metadata"]["name"]) for item in objects.values()} == {
        "ml-infra"
    }
    service = objects["Service"]
    assert (service["metadata"]["name"], service["spec"]["ports"][0]["port"]) == ("mlflow", 5000)
    assert mlflow.TRACKING_URI == "http://mlflow.ml-infra.svc.cluster.local:5000"
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {nodeconfig.REAL_NODE_LABEL: "true"}
    assert pod["tolerations"][0]["key"] == nodeconfig.TAINT["key"]
    assert objects["Deployment"]["spec"]["strategy"] == {"type": "Recreate"}
    (container,) = pod["containers"]
    assert container["imagePullPolicy"] == "Never"
    command = container["command"]
    assert "--serve-artifacts" in command
    assert f"--backend-store-uri=sqlite:///{mlflow.DATA}/mlflow.db" in command
    assert f"--artifacts-destination={mlflow.DATA}/artifacts" in command
    hosts = next(arg for arg in command if arg.startswith("--allowed-hosts=")).split("=", 1)[1].split(",")
    assert {"mlflow.ml-infra.svc.cluster.local:*", "127.0.0.1:*"} <= set(hosts)
    assert (
        pod["volumes"][0]["persistentVolumeClaim"]["claimName"]
        == objects["PersistentVolumeClaim"]["metadata"]["name"]
    )


def test_an_import_of_the_other_images_keeps_the_servers() -> None:
    assert nodeimages.on_request_references(nodeimages.IMAGES) == [mlflow_image.reference()]
    assert nodeimages.on_request_references(("mlflow",)) == []
    assert "mlflow" not in nodeimages.IMAGES
