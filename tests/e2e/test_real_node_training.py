"""Training in containers on the real node: the examples with real torch over the pod network.

Why: everything below the API server used to be simulated. Here the reference trainer runs in the
trainer image (testbed/images: Debian's Python with the test environment's torch) on the local cluster's
real node (testbed/node/realnode.py): rank 0 is found through CoreDNS and the job's Services, the
ranks' gradients cross the pod network with Gloo, progress reaches the job's status from inside the
containers with the pod's own token, and `kubectl exec` and `kubectl logs -f` reach the ranks
through the kubelet. The examples are applied as they are, placed on the node and made to fit a
2-core machine (tests/e2e/realnode.py: `job_on_node`).
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest
import yaml

from crd import contract
from testbed import Kubectl
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import pods_of, status_of, wait, wait_for_state
from tests.e2e.realnode import job_on_node

JsonDict = dict[str, Any]

pytestmark = pytest.mark.slow

# Short epochs: 5 steps of a small model on synthetic data, progress reported at once.
PACE = {"TRAIN_STEPS_PER_EPOCH": "5", "TRAIN_PROGRESS_INTERVAL": "0", "TRAIN_DIST_TIMEOUT": "300"}
JOINED = re.compile(r"joining the rendezvous at (\S+) as rank (\d+) of (\d+)")

# Every name of TF_CONFIG, looked up until it resolves as TensorFlow's gRPC channels retry: a peer's
# name is published once its pod has an address, and the job's Services follow its pods.
RESOLVE_PEERS = """
import json, os, socket, time
config = json.loads(os.environ["TF_CONFIG"])
hosts = [address.rsplit(":", 1)[0] for addresses in config["cluster"].values() for address in addresses]
found, deadline = {}, time.monotonic() + 120
while len(found) < len(hosts) and time.monotonic() < deadline:
    for host in hosts:
        try:
            found[host] = socket.gethostbyname(host)
        except OSError:
            time.sleep(0.5)
print(json.dumps({"task": config["task"], "resolved": found}))
"""


def example(name: str) -> JsonDict:
    loaded = yaml.safe_load((REPO / "examples" / name).read_text())
    assert isinstance(loaded, dict)
    return loaded


def paced(job: JsonDict, epochs: int) -> JsonDict:
    spec = job["spec"]
    spec.setdefault("hyperparameters", {})["epochs"] = epochs
    spec["env"] = [*spec.get("env", []), *({"name": k, "value": v} for k, v in PACE.items())]
    return job


def pod_ips(kubectl: Kubectl, namespace: str, job: str) -> dict[str, str]:
    pods = pods_of(kubectl, namespace, job)
    return {pod["metadata"]["name"]: pod["status"].get("podIP", "") for pod in pods}


def test_the_distributed_example_trains_with_ddp_across_pods(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    job = paced(job_on_node(example("trainingjob-distributed.yaml")), epochs=3)
    name = job["metadata"]["name"]
    real_node.apply(job, "-n", namespace)

    def training() -> JsonDict | None:
        status = status_of(real_node, namespace, name)
        return status if status.get("state") == "Running" and status.get("currentEpoch", 0) >= 1 else None

    during = wait("progress reported from inside the containers", training, timeout=300)
    assert during["totalEpochs"] == 3
    ips = pod_ips(real_node, namespace, name)
    rank1 = f"{name}-worker-1"
    # From inside a rank: the master's name resolves through CoreDNS to worker 0's pod address.
    found = real_node.run(
        "exec",
        rank1,
        "-n",
        namespace,
        "-c",
        contract.CONTAINER_NAME,
        "--",
        "python",
        "-c",
        "import os, socket; name = os.environ['MASTER_ADDR']; print(name, socket.gethostbyname(name))",
    ).split()
    assert found == [f"{name}-master", ips[f"{name}-worker-0"]]

    follow = subprocess.run(
        [*real_node.command(), "logs", "-f", f"{name}-worker-0", f"--namespace={namespace}", "-c=trainer"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    finished = wait_for_state(real_node, namespace, name, "Completed", timeout=120)
    status = finished["status"]
    assert (status["currentEpoch"], status["progress"]) == (3, "100%")
    # Two pods of two processes: one world of 4 over the pod network, Gloo (NCCL falls back on a CPU).
    worlds = {(int(rank), int(size)) for _, rank, size in JOINED.findall(follow.stdout)}
    assert worlds == {(0, 4), (1, 4)}, follow.stdout[-3000:]
    assert "gloo" in follow.stdout
    assert follow.returncode == 0
    for pod in pods_of(real_node, namespace, name):
        assert pod["spec"]["nodeName"] == "real-node"
        ended = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert ended["exitCode"] == 0


def test_tf_config_names_resolve_to_the_workers(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    job = job_on_node(
        {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND,
            "metadata": {"name": "tf-names"},
            "spec": {
                "model": "resnet",
                "dataset": "imagenet",
                "numWorkers": 3,
                "gpusPerWorker": 0,
                "framework": "tensorflow",
                "image": "python:3.11-slim",
                "command": ["python3", "-c", RESOLVE_PEERS],
            },
        },
        memory="64Mi",
    )
    real_node.apply(job, "-n", namespace)
    wait_for_state(real_node, namespace, "tf-names", "Completed", timeout=180)
    ips = pod_ips(real_node, namespace, "tf-names")
    names = {f"tf-names-worker-{index}": index for index in range(3)}
    for pod, index in names.items():
        found = json.loads(real_node.run("logs", pod, "-n", namespace).strip().splitlines()[-1])
        assert found["task"] == {"type": "worker", "index": index}
        # Each worker found every worker's name (worker-i.<job>-headless...) at that worker's address.
        by_pod = {host.split(".")[0]: address for host, address in found["resolved"].items()}
        assert by_pod == ips, found
