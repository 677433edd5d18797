"""MPI jobs in containers on the real node: real OpenMPI, over real SSH, between pods.

Why: docs/env.md's MPI section claims that what the operator gives an MPI job (the key, the hostfile,
the workers' SSH servers run as an ordinary user, the launcher created once they are Ready, OpenMPI's
variables) is all `mpirun` needs. Here examples/trainingjob-mpi.yaml runs as a user applies it, in the
trainer-mpi image (testbed/images/trainer_mpi.py: Debian's OpenMPI, OpenSSH and mpi4py beside torch)
under framework mpi's default image name, on the local cluster's real node:

- one job proves the whole path: mpirun across 2 workers x 2 slots runs an mpi4py allreduce with the
  right sum, then a torch program that takes its rank and world size from OpenMPI's variables trains to
  Completed with progress in status (rank 0, on worker 0, reports), the launcher's success completing
  the job and the job's end stopping the workers;
- an image without sshd (the base image): the workers exit with the reason, which the job's failure
  names, under failurePolicy, instead of a launcher waiting for ever.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from crd import contract
from testbed import Kubectl
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import condition, job_manifest, pods_of, wait, wait_for_state
from tests.e2e.realnode import job_on_node

JsonDict = dict[str, Any]

pytestmark = [pytest.mark.slow, pytest.mark.images("trainer-mpi")]

EXAMPLE = REPO / "examples" / "trainingjob-mpi.yaml"
DEADLINE = 420.0
EPOCHS = 2
# A Debian Python without OpenSSH: the node's base image.
WITHOUT_SSHD = "python:3.11-slim"


def logs(kubectl: Kubectl, namespace: str, pod: str) -> str:
    return kubectl.run("logs", pod, "-n", namespace, "-c", contract.CONTAINER_NAME)


def test_mpirun_runs_an_allreduce_and_trains_torch_across_two_workers_to_completed(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator("--progress-interval=0")
    docs = [doc for doc in yaml.safe_load_all(EXAMPLE.read_text()) if doc]
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            real_node.apply(doc, "-n", namespace)
    (job,) = (copy.deepcopy(doc) for doc in docs if doc["kind"] == contract.KIND)
    assert "image" not in job["spec"]  # framework mpi's default image, which the node has as trainer-mpi
    job["spec"]["hyperparameters"]["epochs"] = EPOCHS
    real_node.apply(job_on_node(job, memory="1Gi", cpu="100m"), "-n", namespace)
    name = str(job["metadata"]["name"])

    done = wait_for_state(real_node, namespace, name, "Completed", timeout=DEADLINE)["status"]
    succeeded = condition(done, "Succeeded")
    assert succeeded is not None
    assert succeeded["reason"] == "LauncherSucceeded"
    assert (done["currentEpoch"], done["restartCount"]) == (EPOCHS, 0)
    assert done["metrics"]["loss"] >= 0

    said = logs(real_node, namespace, f"{name}-launcher-0")
    # mpirun forwards the ranks' output as it comes: two ranks' lines may share one line of the log.
    ranks = dict(re.findall(r"rank (\d) of 4 on (\S+): allreduce sum 10 \(expected 10\)", said))
    assert sorted(ranks) == ["0", "1", "2", "3"], said
    # Two ranks on each worker: the hostfile's slots=2.
    assert sorted(ranks.values()) == [f"{name}-worker-{index}" for index in (0, 0, 1, 1)], said
    assert f"rank 0 of 4: epoch {EPOCHS}/{EPOCHS}" in said, said
    wait(
        "the workers stopped",
        lambda: (
            [p["metadata"]["name"] for p in pods_of(real_node, namespace, name)] == [f"{name}-launcher-0"]
        ),
        timeout=120,
    )


def test_an_image_without_sshd_fails_the_job_naming_the_worker_and_the_reason(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    manifest = job_manifest(
        "no-sshd",
        framework="mpi",
        image=WITHOUT_SSHD,
        command=["mpirun", "hostname"],
        failurePolicy={"restartPolicy": "Never"},
    )
    real_node.apply(job_on_node(manifest), "-n", namespace)
    failed = wait_for_state(real_node, namespace, "no-sshd", "Failed", timeout=180)["status"]
    message = failed["message"]
    assert "no-sshd-worker-" in message, message
    assert "exit code 127" in message, message
    assert "MPI: no sshd in the image" in message, message
    # The launcher was never created: its workers never served SSH.
    assert not [p for p in pods_of(real_node, namespace, "no-sshd") if "launcher" in p["metadata"]["name"]]
