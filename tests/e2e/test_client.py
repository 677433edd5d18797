"""The Python client against the local cluster and the real operator: waits that end the right way,
and one typed exception with one clear sentence for each kind of bad input.

The happy path, a notebook's session from submit to Completed, is tests/e2e/test_client_docs.py
(docs/client.md run as written). No test here reads a running pod's log: the fake nodes serve none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import DEV, Kubectl, end_pod
from tests.e2e.jobs import job_manifest, kubeconfig_to_nowhere, pods_of, wait, wait_for_state
from tests.e2e.operator import OperatorProcess
from trainingjob_client import (
    ClusterUnreachable,
    JobEnded,
    JobNotFound,
    JobRejected,
    LogsUnavailable,
    TrainingJobClient,
    WaitTimeout,
)


@pytest.fixture
def client(namespace: str) -> TrainingJobClient:
    return TrainingJobClient(namespace, kubeconfig=DEV / "kubeconfig")


def test_waits_end_at_the_awaited_state_at_a_failure_or_at_the_timeout(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, client: TrainingJobClient
) -> None:
    client.submit(
        "w",
        model="cnn",
        dataset="mnist",
        num_workers=2,
        gpus_per_worker=0,
        spec={"failurePolicy": {"restartPolicy": "Never"}},
    )
    running = client.wait("w", for_state="Running", timeout=60)
    assert running.status.workers.active == 2
    with pytest.raises(WaitTimeout) as timed_out:
        client.wait("w", timeout=2)
    assert str(timed_out.value).startswith(
        f"TrainingJob {namespace}/w did not reach state Completed within 2s"
    )
    end_pod(kubectl, namespace, "w-worker-1", exit_code=3, reason="Error")
    with pytest.raises(JobEnded) as ended:
        client.wait("w", for_state="Completed", timeout=60)
    assert str(ended.value).startswith(f"TrainingJob {namespace}/w ended Failed (")
    assert ended.value.job.state == "Failed"
    client.delete("w", wait=True, timeout=60)
    assert kubectl.get_or_none("trainingjob", "w", "-n", namespace) is None


def test_bad_input_raises_one_typed_exception_with_one_sentence(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, client: TrainingJobClient, tmp_path: Path
) -> None:
    with pytest.raises(JobNotFound) as missing:
        client.get("nope")
    assert str(missing.value) == f'TrainingJob "nope" not found in namespace "{namespace}"'

    with pytest.raises(JobRejected) as refused:
        client.submit("bad", model="cnn", dataset="mnist", num_workers=0)
    assert "spec.numWorkers" in str(refused.value)

    kubectl.apply(job_manifest("done", cleanPodPolicy="All"), "-n", namespace)
    wait_for_state(kubectl, namespace, "done", "Running")
    for worker in pods_of(kubectl, namespace, "done"):
        end_pod(kubectl, namespace, worker["metadata"]["name"])
    client.wait("done", timeout=60)
    wait("the finished job's pods to be deleted", lambda: pods_of(kubectl, namespace, "done") == [])
    with pytest.raises(LogsUnavailable) as gone:
        client.logs("done", rank=1)
    assert str(gone.value) == (
        f"pod {namespace}/done-worker-1 (rank 1 of TrainingJob done) no longer exists: the job is Completed "
        "and its pods were cleaned up (cleanPodPolicy All)"
    )

    with pytest.raises(JobNotFound) as elsewhere:
        TrainingJobClient("default", kubeconfig=DEV / "kubeconfig").wait("done")
    assert str(elsewhere.value) == (
        f'TrainingJob "done" not found in namespace "default" (there is one in namespace "{namespace}")'
    )

    down = tmp_path / "kubeconfig"
    port = kubeconfig_to_nowhere(down)
    with pytest.raises(ClusterUnreachable) as unreachable:
        TrainingJobClient(namespace, kubeconfig=down).list()
    assert (
        str(unreachable.value)
        == f"cannot reach the Kubernetes API server at 127.0.0.1:{port}: connection refused"
    )
