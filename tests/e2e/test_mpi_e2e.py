"""MPI jobs (framework mpi) on the real local API server, as kubectl shows them: the example applied as a
user applies it, the workers first and the launcher only once they are Ready, the hostfile and the SSH
key's Secret (owned by the job, deleted with it), the launcher's success completing the job and
stopping the workers, a launcher that cannot reach a worker failing the job with ssh's words, and bad
input refused naming the field (docs/api.md's table of the MPI roles, docs/env.md's MPI section).

The nodes are kwok's (they mark a running pod Ready at once; the readiness that the planner waits for
is tested in tests/unit/test_lifecycle_mpi.py); the test plays the kubelet with `end_pod`. The real
OpenMPI runs the same example on the real node in tests/e2e/test_mpi_real_node.py; every admission
case is tests/e2e/test_api.py's (tests/unit/crd_cases_mpi.py). The operator runs with the rights
deploy/ grants it, which let it create Secrets and never read them.
"""

from __future__ import annotations

import base64
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
EXAMPLE = REPO / "examples" / "trainingjob-mpi.yaml"


@pytest.fixture
def operator(start_operator: StartOperator) -> OperatorProcess:
    return start_operator()


def apply_example(kubectl: Kubectl, namespace: str) -> str:
    kubectl.run("apply", "-n", namespace, "-f", str(EXAMPLE))
    (job,) = [doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc and doc["kind"] == contract.KIND]
    return str(job["metadata"]["name"])


def ready_since(pod: JsonDict) -> str:
    (ready,) = [c for c in pod["status"]["conditions"] if c["type"] == "Ready" and c["status"] == "True"]
    return str(ready["lastTransitionTime"])


def test_the_example_runs_the_launcher_after_the_workers_with_the_hostfile_and_a_key_of_its_own(
    kubectl: Kubectl, namespace: str
) -> None:
    job = apply_example(kubectl, namespace)
    every_role = "worker 2/2, launcher 1/1"
    wait_status(kubectl, namespace, job, "every role running", lambda s: s.get("roleSummary") == every_role)
    pods = {str(pod["metadata"]["name"]): pod for pod in pods_of(kubectl, namespace, job)}
    launcher, workers = f"{job}-launcher-0", [f"{job}-worker-0", f"{job}-worker-1"]
    assert sorted(pods) == [launcher, *workers]
    # Created once both workers were Ready (RFC 3339 times in UTC compare as strings).
    created = pods[launcher]["metadata"]["creationTimestamp"]
    assert all(created >= ready_since(pods[worker]) for worker in workers)
    command = pods[launcher]["spec"]["containers"][0]["command"]
    assert command[:2] == ["sh", "/etc/trainingjob-mpi/launcher.sh"]
    assert command[2:4] == ["sh", "-c"]
    assert pods[workers[0]]["spec"]["containers"][0]["command"] == ["sh", "/etc/trainingjob-mpi/worker.sh"]

    hostfile = kubectl.get_json("configmap", f"{job}-mpi", "-n", namespace)["data"]["hostfile"]
    assert hostfile == f"{job}-worker-0.{job}-headless slots=2\n{job}-worker-1.{job}-headless slots=2\n"
    secret = kubectl.get_json("secret", f"{job}-mpi-ssh", "-n", namespace)
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == (contract.KIND, job)
    private = base64.b64decode(secret["data"]["key"]).decode()
    public = base64.b64decode(secret["data"]["authorized_keys"]).decode()
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert public.startswith("ssh-ed25519 ")

    assert every_role in kubectl.run("get", "trainingjob", job, "-n", namespace, "-o", "wide")
    described = kubectl_trainingjob("describe", job, "-n", namespace)
    assert described.returncode == 0, described.stderr
    for name in (launcher, *workers):
        assert name in described.stdout, described.stdout

    # The launcher's success completes the job and stops the workers' SSH servers.
    end_pod(kubectl, namespace, launcher, exit_code=0)
    done = wait_state(kubectl, namespace, job, "Completed")
    succeeded = condition(done["status"], "Succeeded")
    assert succeeded is not None
    assert (succeeded["reason"], succeeded["message"]) == (
        "LauncherSucceeded",
        f"launcher {launcher} succeeded",
    )
    wait_for(
        "the workers stopped",
        lambda: not {p["metadata"]["name"] for p in pods_of(kubectl, namespace, job)} & set(workers),
    )

    # Deleted with the job, by the garbage collector: the key and the hostfile.
    kubectl.run("delete", "trainingjob", job, "-n", namespace)
    wait_for(
        "the job's Secret and ConfigMap collected",
        lambda: (
            kubectl.get_or_none("secret", f"{job}-mpi-ssh", "-n", namespace) is None
            and kubectl.get_or_none("configmap", f"{job}-mpi", "-n", namespace) is None
        ),
        timeout=120,
    )


def test_a_launcher_that_cannot_reach_a_worker_fails_the_job_with_its_reason(
    kubectl: Kubectl, namespace: str
) -> None:
    manifest = job_manifest(
        "unreachable",
        framework="mpi",
        command=["mpirun", "hostname"],
        failurePolicy={"restartPolicy": "Never"},
    )
    kubectl.run("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(manifest))
    wait_status(
        kubectl,
        namespace,
        "unreachable",
        "the launcher running",
        lambda s: s.get("roleSummary") == "worker 2/2, launcher 1/1",
    )
    said = "ssh: connect to host unreachable-worker-1.unreachable-headless port 2222: Connection refused"
    end_pod(kubectl, namespace, "unreachable-launcher-0", exit_code=1, message=said)
    failed = wait_state(kubectl, namespace, "unreachable", "Failed")
    assert "unreachable-launcher-0" in failed["status"]["message"]
    assert said in failed["status"]["message"]


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"mpi": {"slotsPerWorker": 2}}, "spec.mpi", "mpi needs framework mpi"),
        ({"framework": "mpi"}, "spec.command", "the launcher runs it"),
        (
            {"framework": "mpi", "command": ["mpirun"], "gpusPerWorker": 2, "mpi": {"slotsPerWorker": 4}},
            "spec.mpi.slotsPerWorker",
            "must equal gpusPerWorker",
        ),
        ({"framework": "mpi", "command": ["mpirun"], "numWorkers": 101}, "spec.numWorkers", "101"),
        (
            {"framework": "mpi", "command": ["mpiexec"], "mpi": {"implementation": "Intel"}},
            "spec.mpi.implementation",
            "Hydra",
        ),
    ],
)
def test_bad_mpi_input_is_refused_naming_the_field(
    kubectl: Kubectl, namespace: str, spec: JsonDict, field: str, words: str
) -> None:
    manifest = job_manifest("bad-mpi", **spec)
    result = kubectl.attempt(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(manifest)
    )
    assert result.returncode != 0
    assert field in result.stderr, result.stderr
    assert words in result.stderr, result.stderr
