"""The client's pure parts: typed views of a job, why it is not running, wait targets, the progress bar
and `kubectl trainingjob describe`'s text, all from JSON as the API server returns it."""

from __future__ import annotations

import io
from typing import Any

import pytest

from crd import contract
from tests.unit.clientfakes import condition, job, pod
from trainingjob_client import JobStatus, ProgressBar, TrainingJob, build_manifest, why_not_running
from trainingjob_client.describe import describe
from trainingjob_client.views import JobEvent, rank_statuses
from trainingjob_client.waiting import Target


def view(**status: object) -> TrainingJob:
    manifest = job()
    manifest["status"] = status
    return TrainingJob.from_dict(manifest)


def test_a_job_without_status_reads_as_empty() -> None:
    empty = TrainingJob.from_dict({"metadata": {"name": "a", "namespace": "ns"}, "spec": {}})
    assert empty.status == JobStatus()
    assert empty.summary() == "(no status yet)"
    assert why_not_running(empty.status) == "the operator has not reported on this job yet"


def test_the_summary_is_the_demos_line() -> None:
    running = view(
        state="Running",
        currentEpoch=3,
        totalEpochs=10,
        progress="30%",
        metrics={"loss": 0.41234, "accuracy": 0.9},
        workers={"active": 2, "pending": 1},
        restartCount=1,
    )
    assert running.summary() == (
        "Running       epoch 3/10  progress  30%  accuracy 0.900  loss 0.412  workers: 1 pending, 2 active  "
        "restarts 1"
    )
    assert view(state="Completed", currentEpoch=10, totalEpochs=10, progress="100%").summary() == (
        "Completed     epoch 10/10  progress 100%"
    )


@pytest.mark.parametrize(
    ("status", "percent"),
    [
        ({"progress": "45%"}, 45.0),
        ({"progress": "12.5%"}, 12.5),
        ({"progress": "oops", "currentEpoch": 1, "totalEpochs": 4}, 25.0),
        ({"currentEpoch": 3, "totalEpochs": 4}, 75.0),
        ({"currentEpoch": 3}, None),
        ({"state": "Completed"}, 100.0),
        ({"progress": "250%"}, 100.0),
    ],
)
def test_percent_done(status: dict[str, object], percent: float | None) -> None:
    assert view(**status).status.percent() == percent


@pytest.mark.parametrize(
    ("status", "why"),
    [
        ({"state": "Running", "conditions": [condition("Running", "True", "AllWorkersRunning")]}, None),
        (
            {
                "state": "Pending",
                "conditions": [
                    condition(
                        "Running",
                        "False",
                        "PodsUnschedulable",
                        "2/2 pods unschedulable: 0/4 nodes are available",
                    )
                ],
            },
            "not running: PodsUnschedulable: 2/2 pods unschedulable: 0/4 nodes are available",
        ),
        (
            {
                "state": "Failed",
                "conditions": [
                    condition("Running", "False", "BackoffLimitExceeded", "x"),
                    condition("Failed", "True", "BackoffLimitExceeded", "rank 1 exited 1"),
                ],
            },
            "Failed: BackoffLimitExceeded: rank 1 exited 1",
        ),
        (
            {
                "state": "Suspended",
                "conditions": [condition("Suspended", "True", "Suspended", "spec.suspend is true")],
            },
            "Suspended: Suspended: spec.suspend is true",
        ),
        (
            {
                "state": "Running",
                "conditions": [
                    condition("Running", "True", "AllWorkersRunning"),
                    condition("Stalled", "True", "ProgressDeadlineExceeded", "no progress for 10m"),
                ],
            },
            "Stalled: ProgressDeadlineExceeded: no progress for 10m",
        ),
        (
            {"state": "Pending", "message": "creating the job's resources"},
            "Pending: creating the job's resources",
        ),
        (
            {
                "state": "Queued",
                "conditions": [
                    condition(
                        "Admitted", "False", "Preempted", "waiting in LocalQueue team-a: evicted by Kueue"
                    ),
                    condition("Running", "False", "Preempted", "evicted by Kueue"),
                ],
            },
            "not admitted: Preempted: waiting in LocalQueue team-a: evicted by Kueue",
        ),
    ],
)
def test_why_a_job_is_not_running(status: dict[str, object], why: str | None) -> None:
    assert why_not_running(view(**status).status) == why


@pytest.mark.parametrize(
    ("for_state", "condition_", "status", "reached", "ended"),
    [
        ("Completed", None, {"state": "Completed"}, True, None),
        ("Completed", None, {"state": "Running"}, False, None),
        (
            "Completed",
            None,
            {"state": "Failed", "failureReason": "DeadlineExceeded"},
            False,
            "ended Failed (DeadlineExceeded) while waiting for state Completed",
        ),
        ("Failed", None, {"state": "Completed"}, False, "ended Completed while waiting for state Failed"),
        ("Running", None, {"state": "Completed"}, False, "ended Completed while waiting for state Running"),
        (None, "Succeeded", {"state": "Completed", "conditions": [condition("Succeeded")]}, True, None),
        (None, "Succeeded", {"state": "Running"}, False, None),
        (
            None,
            "Stalled=False",
            {"state": "Running", "conditions": [condition("Stalled", "False")]},
            True,
            None,
        ),
        (None, "Stalled=false", {"state": "Completed"}, True, None),
        (
            None,
            "Succeeded",
            {"state": "Failed", "message": "rank 0 exited 2"},
            False,
            "ended Failed (rank 0 exited 2) while waiting for condition Succeeded=True",
        ),
    ],
)
def test_wait_targets(
    for_state: str | None, condition_: str | None, status: dict[str, object], reached: bool, ended: str | None
) -> None:
    target = Target.of(for_state, condition_)
    current = view(**status)
    assert target.reached(current) is reached
    why = target.unreachable(current)
    assert (why is None) == (ended is None)
    if ended is not None:
        assert why == f"TrainingJob ns/mnist {ended}"


def test_a_pod_that_cannot_be_scheduled_says_why_in_its_rank() -> None:
    pending = pod("mnist-worker-0", 0, node=None, phase="Pending")
    pending["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/4 nodes are available:\n 4 Insufficient nvidia.com/gpu.",
        }
    ]
    (rank, _) = rank_statuses(view(), [pending])
    assert rank.state_text() == "waiting: Unschedulable"
    assert rank.message == "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def test_the_progress_bar_shows_state_percent_epoch_metrics_and_restarts() -> None:
    out = io.StringIO()
    with ProgressBar("ns/mnist", file=out) as bar:
        bar.update(
            view(state="Running", progress="45%", currentEpoch=3, totalEpochs=10, metrics={"loss": 0.41})
        )
        bar.update(view(state="Restarting", progress="45%", currentEpoch=3, totalEpochs=10, restartCount=1))
        bar.write("restart 1: OOMKilled")
    drawn = out.getvalue()
    assert "ns/mnist Running  45%|" in drawn
    assert "| epoch 3/10  loss 0.41" in drawn
    assert ", epoch" not in drawn
    assert "ns/mnist Restarting  45%|" in drawn
    assert "epoch 3/10  restarts 1" in drawn
    assert "restart 1: OOMKilled\n" in drawn


def test_describe_shows_a_row_per_rank_and_why_the_job_is_not_running() -> None:
    current = view(
        state="Restarting",
        message="gang restart after rank 1 failed",
        restartCount=1,
        lastRestartReason="OOMKilled",
        currentEpoch=2,
        totalEpochs=4,
        conditions=[condition("Restarting", "True", "OOMKilled", "rank 1 exited 137")],
    )
    pods = [
        pod(
            "mnist-worker-0", 0, trainer={"terminated": {"exitCode": 143, "reason": "Error"}}, phase="Failed"
        ),
        pod(
            "mnist-worker-1",
            1,
            node="gpu-node-1",
            phase="Failed",
            trainer={"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
        ),
    ]
    events = [
        JobEvent(
            "Warning", "OOMKilled", "Restarting: rank 1 exited 137", 1, None, None, "trainingjob-operator"
        )
    ]
    text = describe(current, rank_statuses(current, pods), events)
    assert text.splitlines()[:8] == [
        "Name:        mnist",
        "Namespace:   ns",
        "State:       Restarting",
        "Message:     gang restart after rank 1 failed",
        "Not running: Restarting: OOMKilled: rank 1 exited 137",
        "Progress:    50%  epoch 2/4  restarts 1",
        "Restarts:    1 (last: OOMKilled)",
        "Ranks:",
    ]
    assert "  RANK   POD              NODE         PHASE    EXIT CODE / WAITING" in text
    assert "  0      mnist-worker-0   gpu-node-0   Failed   exit 143 (Error)" in text
    assert "  1      mnist-worker-1   gpu-node-1   Failed   exit 137 (OOMKilled)" in text
    assert "  Restarting   True     OOMKilled   rank 1 exited 137" in text
    assert "  Warning   OOMKilled   1       Restarting: rank 1 exited 137" in text


@pytest.mark.parametrize(
    ("kind", "shown"),
    [
        ("InPlace", "Restarts:    2 (last: PodFailed, in place)"),
        ("Recreate", "Restarts:    2 (last: PodFailed, pods recreated)"),
        (None, "Restarts:    2 (last: PodFailed)"),
    ],
)
def test_describe_says_how_an_in_place_jobs_last_restart_restarted(kind: str | None, shown: str) -> None:
    fields: dict[str, Any] = {"state": "Running", "restartCount": 2, "lastRestartReason": "PodFailed"}
    if kind is not None:
        fields["lastRestartKind"] = kind
    current = view(**fields)
    assert shown in describe(current, rank_statuses(current, []), []).splitlines()


def test_describe_shows_an_mpi_launcher_without_a_rank() -> None:
    """mpirun gives the ranks to the workers' slots: the launcher's row says launcher, not the slot it
    has after the workers."""
    manifest = job(num_workers=2, state="Running")
    manifest["spec"]["framework"] = "mpi"
    mpi_job = TrainingJob.from_dict(manifest)
    pods = [pod("mnist-worker-0", 0), pod("mnist-worker-1", 1), pod("mnist-launcher-0", 0)]
    pods[2]["metadata"]["labels"][contract.REPLICA_TYPE_LABEL] = "launcher"
    ranks = rank_statuses(mpi_job, pods)
    assert [(rank.rank, rank.pod) for rank in ranks] == [
        (0, "mnist-worker-0"),
        (1, "mnist-worker-1"),
        (2, "mnist-launcher-0"),
    ]
    text = describe(mpi_job, ranks, [])
    assert "  RANK       POD                NODE         PHASE     EXIT CODE / WAITING" in text
    assert "  0          mnist-worker-0     gpu-node-0   Running   running" in text
    assert "  1          mnist-worker-1     gpu-node-0   Running   running" in text
    assert "  launcher   mnist-launcher-0   gpu-node-0   Running   running" in text
    assert "  2 " not in text
    # Without its pod yet, the launcher's row still has no rank.
    assert "  launcher   (no pod)" in describe(mpi_job, rank_statuses(mpi_job, pods[:2]), [])


def test_build_manifest_leaves_out_what_was_not_given() -> None:
    assert build_manifest("a", model="m", dataset="d", num_workers=1) == {
        "apiVersion": "ml.example.com/v1",
        "kind": "TrainingJob",
        "metadata": {"name": "a"},
        "spec": {"model": "m", "dataset": "d", "numWorkers": 1},
    }
    manifest = build_manifest(
        "a", namespace="ns", model="m", dataset="d", num_workers=1, command=("python", "x.py"), suspend=False
    )
    assert manifest["metadata"]["namespace"] == "ns"
    assert manifest["spec"]["command"] == ["python", "x.py"]
    assert manifest["spec"]["suspend"] is False


def test_ranks_of_a_job_with_tensorflow_roles_are_its_slots() -> None:
    """The chief is rank 0, then the workers, the parameter server, the evaluator: no two pods of
    different roles with the same replica index share a row."""
    manifest = job(num_workers=2)
    manifest["spec"].update(framework="tensorflow", tensorflow={"chief": 1, "ps": 1, "evaluator": 1})
    tf_job = TrainingJob.from_dict(manifest)
    pods = []
    for role, index in (("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("evaluator", 0)):
        found = pod(f"mnist-{role}-{index}", index)
        found["metadata"]["labels"][contract.REPLICA_TYPE_LABEL] = role
        pods.append(found)
    ranks = rank_statuses(tf_job, pods)
    assert [(rank.rank, rank.pod) for rank in ranks] == [
        (0, "mnist-chief-0"),
        (1, "mnist-worker-0"),
        (2, "mnist-worker-1"),
        (3, "mnist-ps-0"),
        (4, "mnist-evaluator-0"),
    ]
    assert [tf_job.pod_name(rank) for rank in range(5)] == [rank.pod for rank in ranks]
    # A job of workers only: a rank is the worker's index, also past numWorkers.
    plain = TrainingJob.from_dict(job(num_workers=2))
    assert [(rank.rank, rank.pod) for rank in rank_statuses(plain, [pod("mnist-worker-3", 3)])] == [
        (0, None),
        (1, None),
        (3, "mnist-worker-3"),
    ]
