"""controller.planner.plan through the lives of MPI jobs (framework mpi) in a fake cluster
(tests.unit.lifecycle_world): the hostfile and the SSH key's Secret, the launcher created only once
every worker is Ready, the launcher's success completing the job and stopping the workers, and a
failure or a disruption of either role restarting the gang (docs/api.md's table of the roles;
controller/planner/roles.py).

Slots (crd/replicas.py) of the job: 0 and 1 the workers, 2 the launcher.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from builders.mpi import SshKey
from controller.planner import roles
from controller.planner.facts import Facts
from controller.planner.model import Observed, Settings
from crd.spec import parse
from tests.unit.lifecycle_steps import assert_steady, created_pod_names
from tests.unit.lifecycle_world import World, make_job, names

MPI = {
    "spec.framework": "mpi",
    "spec.gpusPerWorker": 0,
    "spec.command": ["mpirun", "python3", "/etc/program/train.py"],
    "spec.mpi": {"slotsPerWorker": 2},
}
WORKER0, WORKER1, LAUNCHER = range(3)
WORKERS = ["mnist-worker-0", "mnist-worker-1"]
PODS = ["mnist-launcher-0", *WORKERS]
KEY = SshKey(private="-----BEGIN OPENSSH PRIVATE KEY-----\nx\n", public="ssh-ed25519 AAAA test\n")


class MpiWorld(World):
    """The fake cluster with the reconciler's part of an MPI job: a key pair in every observation."""

    def observed(self) -> Observed:
        return dataclasses.replace(super().observed(), ssh_key=KEY)

    def create(self, obj: dict[str, Any]) -> None:
        """Secrets are created only, never watched (the executor takes AlreadyExists as done)."""
        if obj["kind"] != "Secret":
            super().create(obj)


def mpi_world(changes: dict[str, Any] | None = None) -> MpiWorld:
    return MpiWorld(make_job({**MPI, **(changes or {})}))


def created(result: Any, kind: str) -> list[dict[str, Any]]:
    return [obj for obj in result.creates if obj["kind"] == kind]


def readiness(w: World, slot: int, ready: bool) -> None:
    """The worker's readiness probe (sshd's port) passes, or has not yet, while its container runs."""
    pod = w.pod(slot)
    pod["status"]["conditions"] = [
        {**entry, "status": str(ready)} if entry["type"] == "Ready" else entry
        for entry in pod["status"]["conditions"]
    ]


def run_to_running(w: MpiWorld) -> None:
    w.settle()
    w.start()
    w.settle()
    w.start(LAUNCHER)
    w.settle()
    assert w.state == "Running", w.status


def test_the_workers_come_first_with_the_hostfile_and_the_key() -> None:
    w = mpi_world()
    first = w.step()
    assert created_pod_names(first) == WORKERS
    (config,) = [obj for obj in created(first, "ConfigMap") if obj["metadata"]["name"] == "mnist-mpi"]
    assert config["data"]["hostfile"] == (
        "mnist-worker-0.mnist-headless slots=2\nmnist-worker-1.mnist-headless slots=2\n"
    )
    (secret,) = created(first, "Secret")
    assert secret["metadata"]["name"] == "mnist-mpi-ssh"
    assert secret["stringData"]["key"] == KEY.private
    assert secret["stringData"]["authorized_keys"] == KEY.public
    assert secret["metadata"]["ownerReferences"][0]["kind"] == "TrainingJob"
    # The Secret is created before the pods that mount it.
    kinds = [obj["kind"] for obj in first.creates]
    assert kinds.index("Secret") < kinds.index("Pod")


def test_the_launcher_is_created_once_every_worker_is_ready() -> None:
    w = mpi_world()
    w.settle()
    w.start(WORKER0, WORKER1)
    readiness(w, WORKER1, False)
    result = w.settle()
    assert created_pod_names(result) == []
    assert sorted(w.pods) == WORKERS
    assert w.state == "Initializing"
    assert "the launcher is created once every worker is Ready" in w.status["message"]
    created_condition = w.condition("Created")
    assert created_condition is not None
    assert created_condition["status"] == "False"
    readiness(w, WORKER1, True)
    result = w.step()
    assert created_pod_names(result) == ["mnist-launcher-0"]
    # Asked for again with the pods (AlreadyExists is fine: the operator never reads Secrets).
    assert [obj["metadata"]["name"] for obj in created(result, "Secret")] == ["mnist-mpi-ssh"]
    w.settle()
    w.start(LAUNCHER)
    w.settle()
    assert w.state == "Running"
    assert w.status["message"] == "3/3 pods running"
    assert w.status["roleSummary"] == "worker 2/2, launcher 1/1"
    assert w.status["replicas"] == 2
    assert_steady(w)


def test_the_launchers_success_completes_the_job_and_stops_the_workers() -> None:
    w = mpi_world()
    run_to_running(w)
    w.succeed(LAUNCHER)
    result = w.step()
    assert w.state == "Completed"
    succeeded = w.condition("Succeeded")
    assert succeeded is not None
    assert (succeeded["reason"], succeeded["message"]) == (
        "LauncherSucceeded",
        "launcher mnist-launcher-0 succeeded",
    )
    assert names(result.deletes) == WORKERS


def test_the_workers_success_alone_completes_nothing() -> None:
    w = mpi_world()
    run_to_running(w)
    w.succeed(WORKER0, WORKER1)
    w.step()
    assert w.state == "Running"


@pytest.mark.parametrize(
    ("slot", "pod", "message"),
    [
        (WORKER1, "mnist-worker-1", "MPI: no sshd in the image"),
        (LAUNCHER, "mnist-launcher-0", "ssh: connect to host mnist-worker-1.mnist-headless port 2222"),
    ],
)
def test_a_failure_of_either_role_restarts_the_gang_as_a_failure(slot: int, pod: str, message: str) -> None:
    w = mpi_world()
    run_to_running(w)
    w.exit(slot, 1, message=message)
    result = w.step()
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"failure": 1}
    assert f"pod {pod}, container trainer, exit code 1" in w.status["message"]
    assert message in w.status["message"]
    assert names(result.deletes) == PODS


def test_a_worker_failing_before_the_launcher_exists_restarts_the_workers() -> None:
    w = mpi_world({"spec.failurePolicy.backoffLimit": 0})
    w.settle()
    w.exit(WORKER0, 127, message="MPI: no sshd in the image")
    w.step()
    assert (w.state, w.status["failureReason"]) == ("Failed", "BackoffLimitExceeded")
    assert "mnist-worker-0" in w.status["message"]
    assert "no sshd in the image" in w.status["message"]


def test_an_evicted_launcher_is_a_disruption() -> None:
    w = mpi_world()
    run_to_running(w)
    w.disrupt(LAUNCHER, "EvictionByEvictionAPI")
    w.step()
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"disruption": 1}


def test_a_deleted_launcher_restarts_the_gang() -> None:
    w = mpi_world()
    run_to_running(w)
    del w.pods["mnist-launcher-0"]
    w.step()
    assert w.state == "Restarting"
    assert "mnist-launcher-0" in w.status["message"]


def test_suspend_stops_the_launcher_and_the_workers() -> None:
    w = mpi_world()
    run_to_running(w)
    w.update_spec(suspend=True)
    result = w.step()
    assert w.state == "Suspended"
    assert names(result.deletes) == PODS


def test_completion_is_the_launchers_alone() -> None:
    w = mpi_world()
    run_to_running(w)
    facts = Facts(parse(w.job), w.observed(), Settings(), ())
    assert roles.completion(facts.spec, facts.gang(w.status)) is None
    w.succeed(WORKER0, WORKER1)
    facts = Facts(parse(w.job), w.observed(), Settings(), ())
    assert roles.completion(facts.spec, facts.gang(w.status)) is None
    w.succeed(LAUNCHER)
    facts = Facts(parse(w.job), w.observed(), Settings(), ())
    done = roles.completion(facts.spec, facts.gang(w.status))
    assert done is not None
    assert done.reason == "LauncherSucceeded"
