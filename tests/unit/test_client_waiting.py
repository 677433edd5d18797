"""The client's waiting (for a state or a condition, a failure ending it, a timeout, a progress bar,
targets that can never come), its logs of a rank's trainer and its events and ranks, against a fake
API server.

Split out of tests/unit/test_client.py (creating, reading, errors, watching).
"""

from __future__ import annotations

import pytest

from tests.unit import client_support
from tests.unit.client_support import MNIST, client_for, watches
from tests.unit.clientfakes import (
    EVENTS,
    JOBS,
    PODS,
    UID,
    SteppingClock,
    changed,
    condition,
    job,
    not_found,
    pod,
)
from tests.unit.fakeapi import FakeApi, Reply, Stream, event, items_list, status
from trainingjob_client import (
    JobEnded,
    LogsUnavailable,
    TrainingJobClient,
    WaitTimeout,
)

# The shared fixtures, bound here so that pytest finds them for this module's tests.
api = client_support.api
client = client_support.client


# -------------------------------------------------------------------------------------------- waiting


def completing(api: FakeApi, final: dict[str, object]) -> None:
    current = job(state="Running", currentEpoch=1, totalEpochs=4, progress="25%")
    api.script("GET", MNIST, Reply(200, current))
    api.script(
        "GET",
        JOBS,
        Stream(
            (
                event(
                    "MODIFIED", changed(current, "11", currentEpoch=2, progress="50%", metrics={"loss": 0.5})
                ),
                event("MODIFIED", changed(current, "12", **final)),
            )
        ),
    )


def test_wait_returns_the_job_in_the_awaited_state(api: FakeApi, client: TrainingJobClient) -> None:
    completing(
        api, {"state": "Completed", "conditions": [condition("Succeeded", reason="AllWorkersSucceeded")]}
    )
    done = client.wait("mnist", for_state="Completed")
    assert done.state == "Completed"
    assert done.resource_version == "12"


def test_wait_for_a_condition(api: FakeApi, client: TrainingJobClient) -> None:
    completing(
        api, {"state": "Completed", "conditions": [condition("Succeeded", reason="AllWorkersSucceeded")]}
    )
    assert client.wait("mnist", condition="Succeeded").status.condition("Succeeded") is not None


def test_a_job_that_fails_ends_the_wait_at_once(api: FakeApi, client: TrainingJobClient) -> None:
    completing(
        api, {"state": "Failed", "failureReason": "BackoffLimitExceeded", "message": "rank 1 exited 1"}
    )
    with pytest.raises(JobEnded) as raised:
        client.wait("mnist", for_state="Completed")
    assert str(raised.value) == (
        "TrainingJob ns/mnist ended Failed (BackoffLimitExceeded) while waiting for state Completed"
    )
    assert raised.value.job.state == "Failed"


def test_wait_times_out_with_the_last_state_seen(api: FakeApi) -> None:
    client = client_for(api, SteppingClock(4))
    api.script("GET", MNIST, Reply(200, job(state="Running", currentEpoch=1, totalEpochs=4)))
    api.script("GET", JOBS, Stream(), Stream())
    with pytest.raises(WaitTimeout) as raised:
        client.wait("mnist", timeout=10)
    assert str(raised.value).startswith(
        "TrainingJob ns/mnist did not reach state Completed within 10s; it is Running"
    )
    # Each watch asks the server to end it when the caller's time is up: no timer of the client's own.
    assert [w["timeoutSeconds"] for w in watches(api)] == ["6", "2"]


def test_wait_with_progress_draws_a_bar_from_the_status(
    api: FakeApi, client: TrainingJobClient, capsys: pytest.CaptureFixture[str]
) -> None:
    completing(api, {"state": "Completed", "currentEpoch": 4, "progress": "100%"})
    client.wait("mnist", progress=True)
    drawn = capsys.readouterr().err
    assert "mnist Running  25%" in drawn
    assert "epoch 2/4  loss 0.5" in drawn
    assert "mnist Completed 100%" in drawn


@pytest.mark.parametrize(
    ("state", "condition_", "message"),
    [
        ("Done", None, "unknown state 'Done'"),
        (None, "Finished", "unknown condition 'Finished'"),
        (None, "Stalled=maybe", "condition status 'maybe'"),
        ("Completed", "Succeeded", "not both"),
    ],
)
def test_wait_refuses_what_can_never_come(
    api: FakeApi, client: TrainingJobClient, state: str | None, condition_: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        client.wait("mnist", for_state=state, condition=condition_)
    assert api.requests() == []


# ----------------------------------------------------------------------------------- logs and events


def test_logs_reads_the_ranks_trainer_log_through_pods_log(api: FakeApi, client: TrainingJobClient) -> None:
    api.script("GET", MNIST, Reply(200, job(state="Running")))
    api.script("GET", f"{PODS}/mnist-worker-1", Reply(200, pod("mnist-worker-1", 1)))
    api.script("GET", f"{PODS}/mnist-worker-1/log", Reply(200, b"epoch 1/4: loss 0.9\nepoch 2/4: loss 0.5\n"))
    assert client.logs("mnist", rank=1, tail_lines=5) == "epoch 1/4: loss 0.9\nepoch 2/4: loss 0.5\n"
    (request,) = api.requests("GET", f"{PODS}/mnist-worker-1/log")
    assert request.query == {"container": "trainer", "tailLines": "5"}


def test_logs_follow_streams_lines_until_the_container_ends(api: FakeApi, client: TrainingJobClient) -> None:
    api.script("GET", MNIST, Reply(200, job(state="Running")))
    api.script("GET", f"{PODS}/mnist-worker-0", Reply(200, pod("mnist-worker-0", 0)))
    api.script("GET", f"{PODS}/mnist-worker-0/log", Stream((b"epoch 1/4\nepoch", b" 2/4\n", b"done")))
    assert list(client.logs("mnist", follow=True)) == ["epoch 1/4", "epoch 2/4", "done"]
    assert api.requests("GET", f"{PODS}/mnist-worker-0/log")[0].query["follow"] == "true"


def test_the_logs_of_a_finished_job_whose_pods_are_gone(api: FakeApi, client: TrainingJobClient) -> None:
    finished = job(state="Completed")
    finished["spec"]["cleanPodPolicy"] = "All"
    api.script("GET", MNIST, Reply(200, finished))
    api.script("GET", f"{PODS}/mnist-worker-0", Reply(404, not_found("pods", "mnist-worker-0")))
    with pytest.raises(LogsUnavailable) as raised:
        client.logs("mnist")
    assert str(raised.value) == (
        "pod ns/mnist-worker-0 (rank 0 of TrainingJob mnist) no longer exists: the job is Completed and its "
        "pods were cleaned up (cleanPodPolicy All)"
    )
    assert api.requests("GET", f"{PODS}/mnist-worker-0/log") == []


def test_a_node_that_serves_no_log_and_a_pod_not_on_a_node(api: FakeApi, client: TrainingJobClient) -> None:
    api.script("GET", MNIST, Reply(200, job(state="Running")), Reply(200, job(state="Pending")))
    api.script(
        "GET",
        f"{PODS}/mnist-worker-0",
        Reply(200, pod("mnist-worker-0", 0)),
        Reply(200, pod("mnist-worker-0", 0, node=None, phase="Pending")),
    )
    api.script(
        "GET",
        f"{PODS}/mnist-worker-0/log",
        Reply(
            404,
            status(
                404, "NotFound", "the server could not find the requested resource ( pods/log mnist-worker-0)"
            ),
        ),
    )
    with pytest.raises(
        LogsUnavailable, match=r"cannot be read from node gpu-node-0: the server could not find"
    ):
        client.logs("mnist")
    with pytest.raises(LogsUnavailable, match="is not on a node yet"):
        client.logs("mnist")


def test_a_rank_out_of_range_is_refused(api: FakeApi, client: TrainingJobClient) -> None:
    api.script("GET", MNIST, Reply(200, job()))
    with pytest.raises(
        ValueError, match=r"rank 2 is out of range: TrainingJob ns/mnist has 2 workers \(ranks 0-1\)"
    ):
        client.logs("mnist", rank=2)


def test_events_are_the_jobs_own_oldest_first(api: FakeApi, client: TrainingJobClient) -> None:
    api.script("GET", MNIST, Reply(200, job()))

    def recorded(reason: str, when: str, uid: str = UID) -> dict[str, object]:
        return {
            "type": "Normal",
            "reason": reason,
            "message": reason.lower(),
            "count": 1,
            "lastTimestamp": when,
            "involvedObject": {"kind": "TrainingJob", "name": "mnist", "uid": uid},
            "source": {"component": "trainingjob-operator"},
        }

    items = [
        recorded("Running", "2026-01-01T00:00:05Z"),
        recorded("Created", "2026-01-01T00:00:01Z"),
        recorded("Stale", "2026-01-01T00:00:00Z", uid="an-earlier-job"),
    ]
    api.script("GET", EVENTS, Reply(200, items_list(items, "9")))
    assert [e.reason for e in client.events("mnist")] == ["Created", "Running"]
    (request,) = api.requests("GET", EVENTS)
    assert request.query["fieldSelector"] == "involvedObject.kind=TrainingJob,involvedObject.name=mnist"


def test_ranks_show_each_ranks_newest_pod(api: FakeApi, client: TrainingJobClient) -> None:
    api.script("GET", MNIST, Reply(200, job(num_workers=3)))
    terminated = {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}
    waiting = {"waiting": {"reason": "ContainerCreating"}}
    stranger = pod("mnist-worker-2", 2)
    stranger["metadata"]["ownerReferences"][0]["uid"] = "another-job"
    pods = [
        pod("mnist-worker-0", 0, attempt=0, phase="Failed", trainer=terminated),
        pod("mnist-worker-0", 0, attempt=1, phase="Pending", trainer=waiting),
        pod("mnist-worker-1", 1, phase="Failed", trainer=terminated),
        stranger,
    ]
    api.script("GET", PODS, Reply(200, items_list(pods, "9")))
    ranks = client.ranks("mnist")
    assert [(r.rank, r.pod, r.attempt, r.state_text()) for r in ranks] == [
        (0, "mnist-worker-0", 1, "waiting: ContainerCreating"),
        (1, "mnist-worker-1", 0, "exit 137 (OOMKilled)"),
        (2, None, None, ""),
    ]
    assert api.requests("GET", PODS)[0].query["labelSelector"] == "training-job=mnist"
