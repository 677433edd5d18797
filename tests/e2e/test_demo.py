"""The whole loop with real training: operator -> pods -> local kubelet -> trainer -> progress -> status.

Why: every other end-to-end test ends pods by hand (kwok runs nothing), so none of them shows that a
TrainingJob actually trains to Completed, that the trainer's reports reach the status through the
API server with the per-job ServiceAccount's own token, or that a gang restart resumes from the
checkpoint the trainer reported. Here the local kubelet (hack/local_kubelet) runs each pod's
reference trainer as a local process against the session's cluster, in the test's namespace, with
the real operator; and `make demo` itself runs end to end on a throwaway cluster.

Trainers run the reference trainer's simulation with TRAIN_STEPS_PER_EPOCH=5 and TRAIN_STEP_SECONDS
so an epoch takes about a second: long enough to look at the running processes, short enough for a
test. The operator runs with --progress-interval=0 so each report the trainer sends shows in status.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from crd import contract
from tests.cluster import DEV, Kubectl, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import job_manifest, pods_of, status_of, wait, wait_for_state
from tests.e2e.localkubelet import (
    LocalKubelet,
    alive,
    kubelet_port,
    local_kubelet,
    trainers,
    training_job,
    wait_for_trainers,
)
from tests.e2e.operator import OperatorProcess
from tests.hack.clusters import listening_addresses

JsonDict = dict[str, Any]
__all__ = ["local_kubelet"]  # the fixture, for the tests here and those importing it from here


def resume_from(pod: JsonDict) -> str | None:
    for entry in pod["spec"]["containers"][0].get("env", []):
        if entry["name"] == "RESUME_FROM":
            return str(entry["value"])
    return None


def jwt_claims(token: str) -> JsonDict:
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert isinstance(claims, dict)
    return claims


# ---------------------------------------------------------------------------------------------------
# Training to Completed, reporting with the job's own token


def test_a_job_trains_to_completed_reporting_with_its_own_service_account(
    cluster: Kubectl, namespace: str, start_operator: StartOperator, local_kubelet: Callable[[], LocalKubelet]
) -> None:
    operator = start_operator("--progress-interval=0")
    kubelet = local_kubelet()
    name = "trained"
    cluster.apply(training_job(name, epochs=4), "-n", namespace)

    running = wait_for_trainers(namespace, 2)
    rank0 = running[f"{name}-worker-0"]
    checkpoints = kubelet.nfs_dir("nfs.invalid", f"/exports/{name}")
    pods_by_name = {p["metadata"]["name"]: p for p in pods_of(cluster, namespace, name)}
    for pod_name, trainer in running.items():
        env = trainer.env
        # Nothing of the kubelet's admin identity reaches the trainer.
        assert "KUBECONFIG" not in env
        assert not any(str(DEV) in value for value in env.values()), env  # no kubeconfig, no PKI
        # Mount paths made local, one rendezvous address for the attempt, the simulation.
        assert env["CHECKPOINT_DIR"] == str(checkpoints)
        config = kubelet.pod_dir(pods_by_name[pod_name]) / "volumes" / "config" / contract.CONFIG_FILE
        assert env["TRAININGJOB_CONFIG"] == str(config)
        assert (env["MASTER_ADDR"], env["TRAIN_SIMULATE"]) == ("127.0.0.1", "1")
        assert env["MASTER_PORT"] == rank0.env["MASTER_PORT"]
        assert listening_addresses(trainer.pid) == set()  # the simulation's ranks exchange nothing
    assert kubelet.process is not None
    # It serves the kubelet API (container logs) on the nodes' kubelet port, and listens nowhere else.
    assert listening_addresses(kubelet.process.pid) == {("127.0.0.1", kubelet_port())}
    # Rank 0 reports to the real API server with a token of the job's ServiceAccount bound to its pod,
    # verified with the cluster's CA.
    state = json.loads((DEV / "run" / "state.json").read_text())
    assert rank0.env["TRAININGJOB_PROGRESS_API_URL"] == state["server"]
    assert (
        Path(rank0.env["TRAININGJOB_PROGRESS_CA_FILE"]).read_bytes()
        == (DEV / "run" / "pki" / "ca.crt").read_bytes()
    )
    token = Path(rank0.env["TRAININGJOB_PROGRESS_TOKEN_FILE"]).read_text().strip()
    claims = jwt_claims(token)
    assert claims["sub"] == f"system:serviceaccount:{namespace}:{contract.TRAINER_ACCOUNT}"
    assert claims["kubernetes.io"]["pod"]["name"] == f"{name}-worker-0"
    # That identity may patch pods (the admission policy narrows it to its own pod's progress) and
    # nothing else.
    credentials = (
        f"--server={state['server']}",
        f"--token={token}",
        f"--certificate-authority={rank0.env['TRAININGJOB_PROGRESS_CA_FILE']}",
    )
    as_trainer = Kubectl(cluster.binary, Path(os.devnull), credentials)
    assert as_trainer.run("auth", "can-i", "patch", f"pods/{name}-worker-0", "-n", namespace).strip() == "yes"
    assert as_trainer.attempt("auth", "can-i", "list", "pods", "-n", namespace).stdout.strip() == "no"
    assert as_trainer.attempt("auth", "can-i", "get", "secrets", "-n", namespace).stdout.strip() == "no"

    def reporting() -> JsonDict | None:
        status = status_of(cluster, namespace, name)
        seen = status.get("state") == "Running" and status.get("currentEpoch", 0) >= 1
        return status if seen and status.get("metrics") and status.get("checkpoint") else None

    during = wait("progress in status while Running", reporting, 90)
    assert during["totalEpochs"] == 4
    assert during["progress"].endswith("%")
    assert set(during["metrics"]) == {"accuracy", "loss"}

    job = wait_for_state(cluster, namespace, name, "Completed", timeout=120)
    status = job["status"]
    assert (status["currentEpoch"], status["totalEpochs"], status["progress"]) == (4, 4, "100%")
    assert 0.5 < status["metrics"]["accuracy"] <= 1.0
    assert status["checkpoint"]["latest"] == str(checkpoints / "epoch-4")
    assert status["checkpoint"]["count"] >= 2
    assert sorted(p.name for p in checkpoints.iterdir()) == ["epoch-3", "epoch-4"]  # retention 2
    assert status.get("restartCount", 0) == 0

    pods = pods_of(cluster, namespace, name)
    assert [p["status"]["phase"] for p in pods] == ["Succeeded", "Succeeded"]
    for pod in pods:
        [container] = pod["status"]["containerStatuses"]
        assert container["state"]["terminated"]["exitCode"] == 0
        assert container["state"]["terminated"]["reason"] == "Completed"
    # Only rank 0 reported, on its own pod.
    annotations = [p["metadata"].get("annotations", {}) for p in pods]
    report = json.loads(annotations[0][contract.PROGRESS_ANNOTATION])
    assert (report["epoch"], report["checkpoint"]) == (4, str(checkpoints / "epoch-4"))
    assert contract.PROGRESS_ANNOTATION not in annotations[1]
    assert "training finished: 4 epochs" in kubelet.pod_log(f"{name}-worker-0")
    assert "progress reporting is off: rank 1" in kubelet.pod_log(f"{name}-worker-1")
    assert not any(alive(t.pid) for t in running.values())
    assert operator.alive()


# ---------------------------------------------------------------------------------------------------
# A gang restart resumes from the reported checkpoint


def test_a_failed_worker_restarts_the_gang_from_the_reported_checkpoint(
    cluster: Kubectl, namespace: str, start_operator: StartOperator, local_kubelet: Callable[[], LocalKubelet]
) -> None:
    start_operator("--progress-interval=0")
    kubelet = local_kubelet()
    name = "resumed"
    # TRAIN_FAIL_AT_EPOCH is the reference trainer's own knob, not a reserved name: every rank exits 1
    # after epoch 2 unless its run resumed past it. Which rank's exit the operator sees first decides
    # whether epoch-2's report made it into status; either way the restart must resume from what status
    # says, and a run resumed from epoch-1 fails again, so the backoff limit leaves room for that.
    job = training_job(
        name,
        epochs=4,
        env={"TRAIN_FAIL_AT_EPOCH": "2"},
        failurePolicy={"backoffLimit": 8, "restartBackoff": {"initialDelaySeconds": 0}},
    )
    cluster.apply(job, "-n", namespace)

    def restarted() -> tuple[JsonDict, list[JsonDict]] | None:
        status = status_of(cluster, namespace, name)
        if status.get("attempt", 0) < 1:
            return None
        pods = [
            p
            for p in pods_of(cluster, namespace, name)
            if p["metadata"]["labels"][contract.ATTEMPT_LABEL] == "1"
        ]
        return (status, pods) if len(pods) == 2 else None

    status, pods = wait("the gang restarted", restarted, 90)
    checkpoints = kubelet.nfs_dir("nfs.invalid", f"/exports/{name}")
    latest = status["checkpoint"]["latest"]
    assert re.fullmatch(re.escape(str(checkpoints)) + r"/epoch-[12]", latest), latest
    assert [resume_from(p) for p in pods] == [latest, latest]
    assert status["lastRestartReason"] == "PodFailed"
    # An ended attempt's output stays readable: `kubectl logs --previous` of the newer pod of that name.
    # Rank 0 ended by failing itself, or by the SIGTERM of the gang restart when rank 1 failed first.
    previous = wait(
        "the earlier attempt's log",
        lambda: cluster.attempt("logs", f"{name}-worker-0", "-n", namespace, "--previous").stdout,
        90,
    )
    assert re.search(r"rank=0 INFO train: epoch \d/4:", previous), previous
    assert "failing on purpose" in previous or "terminated by SIGTERM" in previous, previous

    final = wait_for_state(cluster, namespace, name, "Completed", timeout=180)["status"]
    assert (final["currentEpoch"], final["checkpoint"]["latest"]) == (4, str(checkpoints / "epoch-4"))
    assert final["restarts"]["failure"] == final["restartCount"] >= 1
    # Every run after a restart resumed from the RESUME_FROM it was given; the one that finished had
    # resumed past the failing epoch and trained only the epochs left.
    log = kubelet.pod_log(f"{name}-worker-0")
    resumed = re.findall(r"resuming from epoch (\d) \(checkpoint (\S+)\)", log)
    assert len(resumed) == final["restartCount"], log
    assert resumed[0] == (latest[-1], latest)
    last_run = log.rsplit("local kubelet: pod", 1)[1]
    assert f"resuming from epoch 2 (checkpoint {checkpoints / 'epoch-2'})" in last_run
    assert re.findall(r"epoch (\d)/4:", last_run) == ["3", "4"]
    assert "failing on purpose" not in last_run


# ---------------------------------------------------------------------------------------------------
# Ends: deletion, commands it cannot run, its own stop and restart


def test_deleting_a_job_terminates_its_trainers(
    cluster: Kubectl, namespace: str, operator: OperatorProcess, local_kubelet: Callable[[], LocalKubelet]
) -> None:
    kubelet = local_kubelet()
    cluster.apply(training_job("deleted", epochs=100), "-n", namespace)
    running = wait_for_trainers(namespace, 2)
    wait_for(
        "both trainers training",
        lambda: all("epoch 1/100:" in kubelet.pod_log(pod) for pod in running),
        60,
    )
    cluster.run("delete", "trainingjob", "deleted", "-n", namespace, "--wait=false")
    wait_for("the trainers to exit", lambda: not any(alive(t.pid) for t in running.values()), 60)
    for pod in running:
        log = kubelet.pod_log(pod)
        assert "terminated by SIGTERM: stopping" in log
        assert "exited with code 143" in log
    assert "pod deleted; SIGTERM" in kubelet.log()


def test_a_trainer_that_cannot_run_here_leaves_its_pod_running_without_a_log(
    cluster: Kubectl, namespace: str, operator: OperatorProcess, local_kubelet: Callable[[], LocalKubelet]
) -> None:
    kubelet = local_kubelet()
    cluster.apply(job_manifest("custom", numWorkers=1, command=["sleep", "3600"]), "-n", namespace)
    wait_for(
        "the kubelet to decline the pod",
        lambda: (
            "custom-worker-0: not started: command 'sleep 3600': only `python SCRIPT` and torchrun with the "
            "script in one of the pod's volumes can run locally" in kubelet.log()
        ),
        90,
    )
    [pod] = pods_of(cluster, namespace, "custom")
    assert pod["status"]["phase"] == "Running"
    assert trainers(namespace) == {}
    logs = cluster.attempt("logs", "custom-worker-0", "-n", namespace)
    assert logs.returncode != 0
    assert 'container "trainer" in pod "custom-worker-0" is waiting to start: the local kubelet has not' in (
        logs.stderr
    )


def test_stopping_the_kubelet_ends_its_pods_like_a_node_shutdown(
    cluster: Kubectl, namespace: str, start_operator: StartOperator, local_kubelet: Callable[[], LocalKubelet]
) -> None:
    start_operator("--progress-interval=0")
    kubelet = local_kubelet()
    name = "shutdown"
    cluster.apply(training_job(name, epochs=100), "-n", namespace)
    running = wait_for_trainers(namespace, 2)
    wait_for("training", lambda: "epoch 1/100:" in kubelet.pod_log(f"{name}-worker-0"), 60)
    assert kubelet.stop() == 0
    assert not any(alive(t.pid) for t in running.values())
    assert "terminated by SIGTERM" in kubelet.pod_log(f"{name}-worker-0")

    # The pods were ended with DisruptionTarget TerminationByKubelet: a disruption, not a failure.
    def disrupted() -> JsonDict | None:
        status = status_of(cluster, namespace, name)
        return status if (status.get("restarts") or {}).get("disruption") else None

    status = wait("a disruption restart", disrupted, 60)
    assert not (status.get("restarts") or {}).get("failure")
    assert status["lastRestartReason"] == "TerminationByKubelet"


def test_a_restarted_kubelet_cleans_up_after_a_crash(
    cluster: Kubectl, namespace: str, start_operator: StartOperator, local_kubelet: Callable[[], LocalKubelet]
) -> None:
    start_operator("--progress-interval=0")
    first = local_kubelet()
    name = "crashed"
    cluster.apply(training_job(name, epochs=6), "-n", namespace)
    wait(
        "a reported checkpoint",
        lambda: (status_of(cluster, namespace, name).get("checkpoint") or {}).get("latest"),
        90,
    )
    orphans = trainers(namespace)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL  # the trainers outlive it
    assert all(alive(t.pid) for t in orphans.values())

    second = local_kubelet()  # the same state directory: it finds the first one's process records
    wait_for(
        "the orphaned trainers to be killed", lambda: not any(alive(t.pid) for t in orphans.values()), 60
    )
    assert "left by an earlier run" in second.log()
    status = wait_for_state(cluster, namespace, name, "Completed", timeout=180)["status"]
    assert status["restarts"]["disruption"] == 1  # lost containers: a disruption, not a failure
    assert not status["restarts"].get("failure")
    assert status["currentEpoch"] == 6
    assert "resuming from epoch" in second.pod_log(f"{name}-worker-0")
