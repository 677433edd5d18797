"""The Python client against the local cluster and the real operator: waits that end the right way,
and one typed exception with one clear sentence for each kind of bad input.

The happy path, a notebook's session from submit to Completed, is here as one script (submit, wait
with progress, follow rank 0's log while it trains, see it Completed) and in
tests/e2e/test_client_docs.py (docs/client.md run as written). That job runs on the local cluster's
real node (testbed/node/realnode.py): the reference trainer with real torch in a container, its
output read through the API server from the node's kubelet.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from testbed import Kubectl, end_pod, wait_for
from tests.cluster import DEV
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import job_manifest, kubeconfig_to_nowhere, pods_of, wait, wait_for_state
from tests.e2e.operator import OperatorProcess
from tests.e2e.realnode import PACE, on_node
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


def test_a_notebook_submits_waits_with_progress_and_follows_rank_0s_log_to_completed(
    real_node: Kubectl,
    start_operator: StartOperator,
    client: TrainingJobClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    start_operator("--progress-interval=0")
    client.submit(
        "nb",
        model="cnn",
        dataset="mnist",
        num_workers=2,
        gpus_per_worker=0,
        epochs=4,
        env=PACE,
        spec=on_node(),  # on the real node: its scheduling and resources
    )
    running = client.wait("nb", for_state="Running", timeout=180)
    assert running.status.workers.active == 2
    # Follow rank 0 while it trains: lines arrive as the trainer writes them, and the iteration ends
    # when its container does.
    lines: list[str] = []
    failures: list[BaseException] = []

    def follow() -> None:
        try:
            lines.extend(client.logs("nb", rank=0, follow=True))
        except BaseException as error:  # handed to the test's thread
            failures.append(error)

    follower = threading.Thread(target=follow)
    follower.start()
    wait_for(
        "rank 0's first epoch in the followed log",
        lambda: failures or any("epoch 1/4:" in x for x in lines),
        180,
    )
    assert not failures
    assert not any("training finished" in line for line in lines)  # still training: it was followed
    done = client.wait("nb", for_state="Completed", timeout=240, progress=True)
    follower.join(60)
    assert not follower.is_alive()
    assert not failures
    assert (done.state, done.status.current_epoch) == ("Completed", 4)
    assert "nb Completed 100%" in capsys.readouterr().err  # the progress bar
    assert [line for line in lines if "epoch " in line and "/4:" in line][-1].count("epoch 4/4:") == 1
    assert "rank=0 INFO train: training finished: 4 epochs" in lines[-1]
    tail = client.logs("nb", rank=1, tail_lines=1)
    assert tail.count("\n") == 1
    assert "rank=1 INFO train: training finished: 4 epochs" in tail


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
