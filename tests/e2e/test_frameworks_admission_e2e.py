"""XGBoost's and PaddlePaddle's jobs on the real local API server, as kubectl shows them, and MXNet
refused: the examples applied as a user applies them, the pods and environment each role gets, the
status by role (kubectl get -o wide, kubectl trainingjob describe), and the master's success
completing an XGBoost job (docs/api.md's tables of the roles).

The nodes are kwok's; the test plays the kubelet with `end_pod`. The real frameworks train the same
examples on the real node in tests/e2e/test_xgboost_paddle_real_node.py; the refusals of every bad
field are tests/e2e/test_api.py's (tests/unit/crd_cases_frameworks.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from crd import contract
from testbed import Kubectl, end_pod, wait_for
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import condition, job_manifest, pods_of
from tests.e2e.lifecycle_support import wait_state, wait_status
from tests.e2e.operator import OperatorProcess
from tests.e2e.test_kubectl_plugin import kubectl_trainingjob

JsonDict = dict[str, Any]
pytestmark = pytest.mark.usefixtures("operator")


@pytest.fixture
def operator(start_operator: StartOperator) -> OperatorProcess:
    return start_operator()


def apply_example(kubectl: Kubectl, namespace: str, name: str) -> str:
    """Applies the whole example file as its comment says; the TrainingJob's name."""
    path = REPO / "examples" / name
    kubectl.run("apply", "-n", namespace, "-f", str(path))
    (job,) = [doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == contract.KIND]
    return str(job["metadata"]["name"])


def env(pod: JsonDict) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_the_xgboost_example_runs_a_master_and_workers_and_the_masters_success_completes_it(
    kubectl: Kubectl, namespace: str
) -> None:
    job = apply_example(kubectl, namespace, "trainingjob-xgboost.yaml")
    every_role = "master 1/1, worker 2/2"
    wait_status(kubectl, namespace, job, "every role running", lambda s: s.get("roleSummary") == every_role)
    pods = {str(pod["metadata"]["name"]): pod for pod in pods_of(kubectl, namespace, job)}
    master, workers = f"{job}-master-0", [f"{job}-worker-0", f"{job}-worker-1"]
    assert sorted(pods) == [master, *workers]
    assert pods[master]["metadata"]["labels"][contract.REPLICA_TYPE_LABEL] == "master"
    addresses = ",".join(f"{name}.{job}-headless" for name in workers)
    for rank, name in enumerate([master, *workers]):
        found = env(pods[name])
        assert (found["RANK"], found["WORLD_SIZE"], found["MASTER_ADDR"]) == (str(rank), "3", f"{job}-master")
        assert found["WORKER_ADDRS"] == addresses
        assert found["POD_IP"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
    service = kubectl.get_json("service", f"{job}-master", "-n", namespace)
    assert service["spec"]["selector"][contract.REPLICA_TYPE_LABEL] == "master"
    assert every_role in kubectl.run("get", "trainingjob", job, "-n", namespace, "-o", "wide")
    described = kubectl_trainingjob("describe", job, "-n", namespace)
    assert described.returncode == 0, described.stderr
    for name in (master, *workers):
        assert name in described.stdout, described.stdout

    # A worker's success decides nothing; the master's completes the job and stops the worker left.
    end_pod(kubectl, namespace, workers[0], exit_code=0)
    end_pod(kubectl, namespace, master, exit_code=0)
    done = wait_state(kubectl, namespace, job, "Completed")
    succeeded = condition(done["status"], "Succeeded")
    assert succeeded is not None
    assert (succeeded["reason"], succeeded["message"]) == ("MasterSucceeded", f"master {master} succeeded")
    wait_for(
        "the running worker stopped",
        lambda: workers[1] not in {p["metadata"]["name"] for p in pods_of(kubectl, namespace, job)},
    )


def test_the_paddle_example_gets_what_paddle_distributed_launch_reads(
    kubectl: Kubectl, namespace: str
) -> None:
    job = apply_example(kubectl, namespace, "trainingjob-paddle.yaml")
    wait_status(
        kubectl, namespace, job, "both workers running", lambda s: (s.get("workers") or {}).get("active") == 2
    )
    first, second = (env(pod) for pod in pods_of(kubectl, namespace, job))
    assert first["PADDLE_MASTER"] == "$(POD_IP):29500"
    assert second["PADDLE_MASTER"] == f"{job}-master:29500"
    assert [(e["PADDLE_RANK"], e["PADDLE_NNODES"], e["PADDLE_JOB_ID"]) for e in (first, second)] == [
        ("0", "2", job),
        ("1", "2", job),
    ]


def test_mxnet_is_refused_with_the_reason_and_what_to_use(kubectl: Kubectl, namespace: str) -> None:
    manifest = job_manifest("mx", framework="mxnet")
    result = kubectl.attempt(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(manifest)
    )
    assert result.returncode != 0
    assert "spec.framework" in result.stderr
    assert "Apache Attic" in result.stderr
    assert "pytorch" in result.stderr
