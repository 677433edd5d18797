"""The whole loop on the real node: operator -> pods -> kubelet -> trainer -> progress -> status.

Why: the tests on kwok end pods by hand (kwok runs nothing), so none of them shows that a
TrainingJob actually trains to Completed, that the trainer's reports reach the status through the
API server with the per-job ServiceAccount's own token, that a gang restart resumes from the
checkpoint the trainer reported (in place: in the same pods), or that deleting a job stops its
trainers. Here the real operator runs for the test's namespace and the jobs run on the local
cluster's real node (testbed/node/realnode.py): the reference trainer with real torch in the trainer
image, its checkpoints on a claim of the default StorageClass (the local-path provisioner), its token
the one the kubelet projects into the container.

Epochs are 5 steps of at least 0.2 s (tests/e2e/realnode.py PACE): long enough to look at a running
trainer, short enough for 2 busy cores. The operator runs with --progress-interval=0 so each report
the trainer sends shows in status.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trainingjob_progress as tp

from builders.configmap import PROGRESS_HELPER_FILE, TRAINER_FILES
from controller.planner.inplace_steps import RECREATING
from crd import contract
from testbed import REAL_NODE, Kubectl, claim_directory, ensure_image, pod_processes, terminated, wait_for
from tests.cluster import DEV
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    PodWatch,
    event_messages,
    events_of,
    job_manifest,
    pods_of,
    status_of,
    wait,
    wait_for_state,
)
from tests.e2e.operator import OperatorProcess
from tests.e2e.realnode import evict, job_on_node, training_job, wait_running

JsonDict = dict[str, Any]
pytestmark = pytest.mark.slow

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
CHECKPOINTS = "/checkpoints"  # checkpoint.mountPath's default
# The files under the trainer's mount by path, without the ConfigMap volume's own ..data links.
MOUNTED_FILES = f"""
import json, os
root = {contract.CONFIG_MOUNT_PATH!r}
found = []
for directory, folders, files in os.walk(root, followlinks=True):
    folders[:] = [name for name in folders if not name.startswith("..")]
    found += [os.path.relpath(os.path.join(directory, name), root) for name in files]
print(json.dumps(sorted(found)))
"""


def jwt_claims(token: str) -> JsonDict:
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert isinstance(claims, dict)
    return claims


def in_trainer(kubectl: Kubectl, namespace: str, pod: str, *command: str) -> str:
    """`kubectl exec` into the pod's trainer container."""
    return kubectl.run("exec", pod, "-n", namespace, "-c", contract.CONTAINER_NAME, "--", *command)


def checkpoints_claim(job: str) -> str:
    return f"{job}{contract.CHECKPOINTS_SUFFIX}"


# ---------------------------------------------------------------------------------------------------
# Training to Completed, reporting with the job's own token


def test_a_job_trains_to_completed_reporting_with_its_own_service_account(
    real_node: Kubectl, namespace: str, start_operator: StartOperator, tmp_path: Path
) -> None:
    cluster = real_node
    operator = start_operator("--progress-interval=0")
    name = "trained"
    # Epochs of 2.5 s: rank 0 still trains while the test looks into its container.
    job = training_job(
        name, epochs=4, env={"TRAIN_STEP_SECONDS": "0.5"}, checkpoint={"enabled": True, "retention": 2}
    )
    cluster.apply(job, "-n", namespace)

    rank0 = f"{name}-worker-0"
    wait_running(cluster, namespace, rank0, timeout=180)
    # The token the kubelet projected into rank 0's container: the job's ServiceAccount, bound to the pod.
    token = in_trainer(cluster, namespace, rank0, "cat", f"{SERVICE_ACCOUNT}/token").strip()
    claims = jwt_claims(token)
    assert claims["sub"] == f"system:serviceaccount:{namespace}:{contract.TRAINER_ACCOUNT}"
    assert claims["kubernetes.io"]["pod"]["name"] == rank0
    ca = in_trainer(cluster, namespace, rank0, "cat", f"{SERVICE_ACCOUNT}/ca.crt")
    assert ca == (DEV / "run" / "pki" / "ca.crt").read_text()
    # It reports to the in-cluster API (the `kubernetes` Service), not to an address a local run sets.
    env = dict(
        line.split("=", 1)
        for line in in_trainer(cluster, namespace, rank0, "env").splitlines()
        if "=" in line
    )
    assert env["KUBERNETES_SERVICE_HOST"] == REAL_NODE.api_service_ip
    assert not {tp.API_URL_ENV, tp.TOKEN_FILE_ENV, tp.CA_FILE_ENV} & set(env), env
    assert "KUBECONFIG" not in env
    # The trainer's ConfigMap is mounted as trainer/'s tree (the entry script and the two packages, each
    # file at its path, nothing else), and a user's code imports the helper from it with PYTHONPATH.
    mounted = in_trainer(cluster, namespace, rank0, "python", "-c", MOUNTED_FILES)
    assert json.loads(mounted) == sorted(TRAINER_FILES)
    helper = "import trainingjob_progress as tp; print(tp.__file__, tp.Reporter.from_env({}).enabled)"
    imported = in_trainer(
        cluster, namespace, rank0, "env", f"PYTHONPATH={contract.CONFIG_MOUNT_PATH}", "python", "-c", helper
    )
    assert imported.split() == [f"{contract.CONFIG_MOUNT_PATH}/{PROGRESS_HELPER_FILE}", "False"]
    # That identity may patch its own pod (the admission policy narrows it to its progress) and
    # nothing else.
    server = json.loads((DEV / "run" / "state.json").read_text())["server"]
    (tmp_path / "ca.crt").write_text(ca)
    credentials = (f"--server={server}", f"--token={token}", f"--certificate-authority={tmp_path / 'ca.crt'}")
    as_trainer = Kubectl(cluster.binary, Path(os.devnull), credentials)  # no kubeconfig: only the token
    assert as_trainer.run("auth", "can-i", "patch", f"pods/{rank0}", "-n", namespace).strip() == "yes"
    assert as_trainer.attempt("auth", "can-i", "list", "pods", "-n", namespace).stdout.strip() == "no"
    assert as_trainer.attempt("auth", "can-i", "get", "secrets", "-n", namespace).stdout.strip() == "no"

    def reporting() -> JsonDict | None:
        status = status_of(cluster, namespace, name)
        seen = status.get("state") == "Running" and status.get("currentEpoch", 0) >= 1
        return status if seen and status.get("metrics") and status.get("checkpoint") else None

    during = wait("progress in status while Running", reporting, 240)
    assert during["totalEpochs"] == 4
    assert during["progress"].endswith("%")
    assert set(during["metrics"]) == {"accuracy", "loss"}

    job = wait_for_state(cluster, namespace, name, "Completed", timeout=240)
    status = job["status"]
    assert (status["currentEpoch"], status["totalEpochs"], status["progress"]) == (4, 4, "100%")
    assert status["checkpoint"]["latest"] == f"{CHECKPOINTS}/epoch-4"
    assert status["checkpoint"]["count"] >= 2
    assert status.get("restartCount", 0) == 0
    # The checkpoints are on the claim the operator made, retention 2.
    stored = claim_directory(cluster, namespace, checkpoints_claim(name))
    assert sorted(path.name for path in stored.glob("epoch-*")) == ["epoch-3", "epoch-4"]

    # The job is Completed once both trainers exited 0 (the trainer's end decides); the kubelet makes
    # a pod Succeeded a moment later, once it has stopped the pod's sandbox. cleanPodPolicy Running
    # (the default) keeps such finished pods, for their logs.
    def succeeded() -> list[JsonDict] | None:
        pods = pods_of(cluster, namespace, name)
        return pods if [p["status"]["phase"] for p in pods] == ["Succeeded", "Succeeded"] else None

    pods = wait("both pods Succeeded", succeeded, 60)
    for pod in pods:
        assert pod["spec"]["nodeName"] == REAL_NODE.name
        ended = terminated(pod, contract.CONTAINER_NAME)
        assert ended is not None
        assert (ended["exitCode"], ended["reason"]) == (0, "Completed")
    # Only rank 0 reported, on its own pod.
    annotations = [p["metadata"].get("annotations", {}) for p in pods]
    report = json.loads(annotations[0][contract.PROGRESS_ANNOTATION])
    assert (report["epoch"], report["checkpoint"]) == (4, f"{CHECKPOINTS}/epoch-4")
    assert status["metrics"] == report["metrics"]  # the last report's metrics, as rank 0 measured them
    assert contract.PROGRESS_ANNOTATION not in annotations[1]
    assert "training finished: 4 epochs" in cluster.run("logs", rank0, "-n", namespace)
    assert "progress reporting is off: rank 1" in cluster.run("logs", f"{name}-worker-1", "-n", namespace)
    assert operator.alive()


# ---------------------------------------------------------------------------------------------------
# A gang restart in place resumes from the reported checkpoint in the same pods


def run_of(pod: JsonDict) -> JsonDict | None:
    """What the pod's supervisor last reported (the run annotation), None before its first report."""
    text = pod["metadata"].get("annotations", {}).get(contract.RUN_ANNOTATION)
    return json.loads(text) if text else None


def test_a_failed_worker_restarts_the_gang_in_place_and_an_eviction_falls_back_to_recreating(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """restartStrategy InPlace: the ranks' supervisors stop and start the trainers in the pods they are
    in (the same names and UIDs), with the next attempt's RESUME_FROM; the restart is counted as any
    other. Then a rank is evicted (the Eviction API, as a drain does): its pod is gone, so that restart
    recreates the gang, says why in an Event, and counts one disruption. (The recreating restart alone
    is proven on the real node by the fault tests: an OOM kill retried, an eviction and a drain.)"""
    cluster = real_node
    start_operator("--progress-interval=0")
    name = "resumed"
    epochs = 8
    # TRAIN_FAIL_AT_EPOCH is the reference trainer's own knob, not a reserved name: every rank exits 1
    # after epoch 2 unless its run resumed past it. Which rank's exit the operator sees first decides
    # whether epoch-2's report made it into status; either way the restart must resume from what status
    # says, and a run resumed from epoch-1 fails again, so the backoff limit leaves room for that.
    policy = {"backoffLimit": 8, "restartBackoff": {"initialDelaySeconds": 0}, "restartStrategy": "InPlace"}
    job = training_job(
        name,
        epochs=epochs,
        env={"TRAIN_FAIL_AT_EPOCH": "2"},
        checkpoint={"enabled": True},
        failurePolicy=policy,
    )
    cluster.apply(job, "-n", namespace)

    def created() -> dict[str, str] | None:
        pods = pods_of(cluster, namespace, name)
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods} if len(pods) == 2 else None

    pods_created = wait("both ranks created", created, 120)
    rank0 = f"{name}-worker-0"
    resumed = (
        f"resuming from epoch 2 (checkpoint {CHECKPOINTS}/epoch-2): {epochs - 2} of {epochs} epochs left"
    )

    def restarted_in_place() -> tuple[JsonDict, list[JsonDict]] | None:
        status = status_of(cluster, namespace, name)
        if status.get("attempt", 0) < 1:
            return None
        pods = pods_of(cluster, namespace, name)
        runs = [run_of(p) for p in pods]
        started = all(
            r is not None and r["attempt"] == status["attempt"] and r["state"] == "Running" for r in runs
        )
        if len(pods) != 2 or not started or resumed not in cluster.run("logs", rank0, "-n", namespace):
            return None
        return status, pods

    status, pods = wait("the gang restarted in place past epoch 2", restarted_in_place, 300)
    evict(cluster, namespace, f"{name}-worker-1")
    assert status["lastRestartKind"] == "InPlace", status
    assert status["lastRestartReason"] == "PodFailed"
    assert status["restarts"] == {"failure": status["restartCount"]}, status
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods} == pods_created
    assert {p["metadata"]["labels"][contract.ATTEMPT_LABEL] for p in pods} == {"0"}
    # One container log holds every attempt of the kept pod: the failure, then the run resumed past it.
    log = cluster.run("logs", rank0, "-n", namespace)
    assert "failing on purpose" in log
    assert re.findall(r"epoch (\d)/8:", log)[-1] != "8", "the job ended before the eviction"

    final = wait_for_state(cluster, namespace, name, "Completed", timeout=600)["status"]
    assert (final["currentEpoch"], final["checkpoint"]["latest"]) == (epochs, f"{CHECKPOINTS}/epoch-{epochs}")
    assert final["restarts"] == {"failure": status["restartCount"], "disruption": 1}, final["restarts"]
    assert final["restartCount"] == status["restartCount"] + 1
    assert final["lastRestartKind"] == "Recreate"
    events = events_of(cluster, namespace, name)
    assert len(event_messages(events, "RestartedInPlace")) >= 1, [e["reason"] for e in events]
    fallbacks = event_messages(events, "InPlaceRestartFallback")
    assert len(fallbacks) == 1, fallbacks
    assert "disruption" in next(iter(fallbacks)), fallbacks
    # New pods for the last attempt, supervised too: each process ran that attempt and exited 0.
    finished = pods_of(cluster, namespace, name)
    assert not {p["metadata"]["uid"] for p in finished} & set(pods_created.values())
    assert {p["metadata"]["labels"][contract.ATTEMPT_LABEL] for p in finished} == {str(final["attempt"])}
    for pod in finished:
        assert {**(run_of(pod) or {}), "at": None} == {
            "attempt": final["attempt"],
            "state": "Exited",
            "exitCode": 0,
            "at": None,
        }
    # The supervisors end with their last process's 0 (the job may be Completed a moment before).
    wait(
        "both pods Succeeded",
        lambda: {p["status"]["phase"] for p in pods_of(cluster, namespace, name)} == {"Succeeded"} or None,
        60,
    )
    log = cluster.run("logs", rank0, "-n", namespace)
    assert "failing on purpose" not in log
    assert re.findall(r"epoch (\d)/8:", log)[-1] == "8", log
    stored = claim_directory(cluster, namespace, checkpoints_claim(name))
    assert (stored / f"epoch-{epochs}").is_dir()


def test_an_image_without_python3_runs_its_command_directly_after_one_uncounted_restart(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """restartStrategy InPlace with an image that has no python3 (busybox) for the supervisor: the
    kubelet cannot start the supervised container; the operator restarts the gang once without counting
    it (backoffLimit 0 would otherwise fail the job), says why, and the pods it creates then run the
    command directly, to Completed."""
    cluster = real_node
    start_operator("--progress-interval=0")
    name = "no-python"
    job = job_manifest(
        name,
        image=ensure_image("busybox").references[0],  # busybox:<version>, which the node holds
        command=["sh", "-c", "echo trained without python3"],
        failurePolicy={"backoffLimit": 0, "restartStrategy": "InPlace"},
    )
    cluster.apply(job_on_node(job), "-n", namespace)
    status = wait_for_state(cluster, namespace, name, "Completed", timeout=180)["status"]
    assert (status.get("restarts") or {}, status["restartCount"]) == ({}, 1), status
    assert (status["lastRestartReason"], status["lastRestartKind"]) == ("SupervisorNotStarted", "Recreate")
    why = status["inPlaceUnavailable"]
    assert "the supervisor did not start in pod no-python-worker-" in why, why
    assert '"python3": executable file not found' in why, why  # the kubelet's StartError
    events = events_of(cluster, namespace, name)
    assert event_messages(events, "InPlaceRestartFallback") == {why + "; " + RECREATING}, events
    for pod in pods_of(cluster, namespace, name):
        assert pod["spec"]["containers"][0]["command"] == ["sh", "-c", "echo trained without python3"]
        said = cluster.run("logs", pod["metadata"]["name"], "-n", namespace, "-c", contract.CONTAINER_NAME)
        assert said.strip() == "trained without python3"


# ---------------------------------------------------------------------------------------------------
# Deleting a job stops its trainers


def test_deleting_a_job_terminates_its_trainers(
    real_node: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    cluster = real_node
    name = "deleted"
    cluster.apply(training_job(name, epochs=100), "-n", namespace)
    ranks = [f"{name}-worker-{index}" for index in range(2)]

    def training(pod: str) -> bool:
        return "epoch 1/100:" in cluster.attempt("logs", pod, "-n", namespace).stdout

    wait_for("both trainers training", lambda: all(training(pod) for pod in ranks), 300)
    uids = {p["metadata"]["uid"] for p in pods_of(cluster, namespace, name)}
    assert pod_processes(uids)  # their containers run on this machine
    follows = [
        subprocess.Popen(
            [*cluster.command(), "logs", "-f", pod, "-n", namespace, "--tail=1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pod in ranks
    ]
    watch = PodWatch(cluster, namespace, name)
    try:
        wait("the watch in place", lambda: len(watch.events()) >= 2, 30)
        cluster.run("delete", "trainingjob", name, "-n", namespace, "--wait=false")
        outputs = [follow.communicate(timeout=120)[0] for follow in follows]
        wait_for("the pods gone", lambda: not pods_of(cluster, namespace, name), 120)
    finally:
        for follow in follows:
            follow.kill()
        events = watch.stop()
    # Each trainer got the kubelet's SIGTERM, stopped after its step (saying so in its log), and its
    # container ended with 143.
    for output in outputs:
        assert "terminated by SIGTERM: stopped after a step" in output, output
    ends = {
        pod["metadata"]["name"]: ended["exitCode"]
        for _, pod in events
        if (ended := terminated(pod, contract.CONTAINER_NAME)) is not None
    }
    assert ends == dict.fromkeys(ranks, 143), ends
    wait_for("no process of the job's pods left on the node", lambda: not pod_processes(uids), 60)
