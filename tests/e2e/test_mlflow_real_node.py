"""One training, one MLflow run (and one TensorBoard log): the reference trainer against MLflow's own
server on the real node.

Why: a job that restarts must not scatter one training over several runs. Here the reference trainer
(real torch, two workers, checkpoints on a claim) logs to the dev cluster's MLflow server
(`hack/dev-cluster.sh up --with mlflow`: SQLite, artifacts served from a claim), fails on purpose
after epoch 3 (a gang restart from the checkpoint), and meanwhile the server itself is restarted.
Read back with MLflow's own client: one run for the job (the id status.tracking shows), its params, an
accuracy history with each epoch's step once and in order across both attempts and the server's
restart, the model as an artifact; the same steps in W&B's offline run on the job's claim (one run
id, a run directory per attempt, read from W&B's own files) and in TensorBoard's event files there,
read with TensorBoard's event reader, and served by `kubectl trainingjob tensorboard` (through the real
kubectl: TensorBoard in a pod of the job's image on the claim, port-forwarded) over TensorBoard's own
HTTP API, its pod deleted on Ctrl-C. Beside it, two light jobs (the trainer's simulation): one whose
run is deleted in MLflow while it trains (a new run, said in an Event), one whose tracking URI does
not resolve (it completes; status and an Event say tracking is unavailable). One test, so the real
node's group pays for the jobs once.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from testbed import MLFLOW, Kubectl, claim_directory, is_ready, wait_for
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import events_of, job_manifest, status_of, wait, wait_for_state
from tests.e2e.realnode import PACE, job_on_node
from tests.wandb_offline import offline_runs

JsonDict = dict[str, Any]

pytestmark = pytest.mark.slow

NAME = "mnist-mlflow"
EPOCHS = 6
STEPS_PER_EPOCH = 4
FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+)")


@contextmanager
def mlflow_client(kubectl: Kubectl) -> Iterator[MlflowClient]:
    """MLflow's client on the machine, through `kubectl port-forward` to the server's Service (on
    127.0.0.1, a port of the kernel's choosing)."""
    command = [
        *kubectl.command(),
        "port-forward",
        f"--namespace={MLFLOW.namespace}",
        f"service/{MLFLOW.service}",
        f":{MLFLOW.port}",
        "--address=127.0.0.1",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        found = FORWARDING.search(line)
        assert found, line
        yield MlflowClient(f"http://127.0.0.1:{found.group(1)}")
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextmanager
def tensorboard_viewer(kubectl: Kubectl, namespace: str, name: str) -> Iterator[str]:
    """`kubectl trainingjob tensorboard` as a user runs it (the built kubectl finds the plugin on PATH,
    $KUBECONFIG), on a free local port; yields the URL it prints, then stops it with Ctrl-C (SIGINT)
    and checks it exited 0 with its pod deleted."""
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}:{kubectl.binary.parent}:/usr/bin:/bin",
        KUBECONFIG=str(kubectl.kubeconfig),
    )
    command = [str(kubectl.binary), "trainingjob", "tensorboard", name, "-n", namespace, "--port=0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None
    assert process.stderr is not None
    lines: queue.Queue[str] = queue.Queue()
    said: list[str] = []

    def read_stdout() -> None:
        for line in process.stdout or ():
            lines.put(line)
        lines.put("")  # it ended

    readers = [
        threading.Thread(target=read_stdout, daemon=True),
        threading.Thread(target=lambda: said.extend(process.stderr or ()), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        try:
            url = lines.get(timeout=240).strip()
        except queue.Empty:
            url = ""
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), f"{url!r}: {''.join(said)}"
        yield url
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=120)
        for reader in readers:
            reader.join(timeout=10)
    assert code == 0, "".join(said)
    assert f"pod {namespace}/{name}-tensorboard deleted\n" in said, said
    assert not kubectl.items("pods", "-n", namespace, "-l", "app.kubernetes.io/name=tensorboard")


def served_steps(url: str, tag: str) -> list[int] | None:
    """The steps of a scalar of the run in the log directory's root ("."), from TensorBoard's HTTP API;
    None until it has loaded them."""
    address = f"{url}data/plugin/scalars/scalars?run=.&tag={tag}"
    try:
        with urllib.request.urlopen(address, timeout=10) as answer:  # noqa: S310 - the viewer's http URL
            points = json.load(answer)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return [int(step) for _, step, _ in points] or None


def tracking(kubectl: Kubectl, namespace: str, name: str) -> JsonDict:
    return dict(status_of(kubectl, namespace, name).get("tracking") or {})


def run_reported(kubectl: Kubectl, namespace: str, name: str) -> str:
    def probe() -> str | None:
        return tracking(kubectl, namespace, name).get("mlflowRunId")

    return wait(f"{name}'s MLflow run in its status", probe, timeout=300)


def tracked_example(experiment: str) -> JsonDict:
    """examples/trainingjob-mlflow.yaml on the real node, paced, failing once after epoch 3 (a gang
    restart from that epoch's checkpoint), in an experiment of the test's own."""
    job = job_on_node(yaml.safe_load((REPO / "examples" / "trainingjob-mlflow.yaml").read_text()))
    spec = job["spec"]
    assert spec["monitoring"]["mlflowTrackingUri"] == MLFLOW.tracking_uri
    assert spec["monitoring"]["tensorboardEnabled"] is True
    assert spec["hyperparameters"]["epochs"] == EPOCHS
    spec["monitoring"]["mlflowExperiment"] = experiment
    spec["monitoring"]["wandbProject"] = "mnist"  # no key: offline, into wandb/ on the claim
    spec["failurePolicy"] = {"restartBackoff": {"initialDelaySeconds": 0}}
    pace = {**PACE, "TRAIN_STEPS_PER_EPOCH": str(STEPS_PER_EPOCH), "TRAIN_STEP_SECONDS": "0.5"}
    spec["env"] = [
        {"name": key, "value": value} for key, value in {**pace, "TRAIN_FAIL_AT_EPOCH": "3"}.items()
    ]
    return job


def simulated(name: str, epochs: int, uri: str, experiment: str) -> JsonDict:
    """One worker of the trainer's simulation (no torch), paced: light beside the torch job."""
    env = {"TRAIN_SIMULATE": "1", "TRAIN_STEPS_PER_EPOCH": "2", "TRAIN_STEP_SECONDS": "0.5"}
    manifest = job_manifest(
        name,
        numWorkers=1,
        hyperparameters={"epochs": epochs},
        env=[{"name": key, "value": value} for key, value in {**env, "TRAIN_PROGRESS_INTERVAL": "0"}.items()],
        monitoring={"mlflowTrackingUri": uri, "mlflowExperiment": experiment},
    )
    return job_on_node(manifest, memory="512Mi")


def server_pods(kubectl: Kubectl) -> list[JsonDict]:
    return kubectl.items("pods", "-n", MLFLOW.namespace, "-l", MLFLOW.selector)


def restart_server(kubectl: Kubectl) -> None:
    """The server's pod deleted; its Deployment's new pod serves the same SQLite file and artifacts."""
    old = {pod["metadata"]["uid"] for pod in server_pods(kubectl)}
    kubectl.run("delete", "pods", "-n", MLFLOW.namespace, "-l", MLFLOW.selector, "--wait=false")

    def serving() -> bool:
        return any(pod["metadata"]["uid"] not in old and is_ready(pod) for pod in server_pods(kubectl))

    wait_for("a new MLflow server pod ready", serving, timeout=180)


def reasons(kubectl: Kubectl, namespace: str, name: str) -> set[str]:
    return {str(event.get("reason")) for event in events_of(kubectl, namespace, name)}


def assert_one_offline_wandb_run(kubectl: Kubectl, namespace: str, status: JsonDict) -> None:
    """W&B, offline (no key): one run id, the job's UID, in a run directory per attempt on the claim,
    read back from W&B's own files: each epoch's step once, in order, across the gang restart."""
    uid = kubectl.get_json("trainingjob", NAME, "-n", namespace)["metadata"]["uid"]
    assert (status["tracking"]["wandbRunId"], status["tracking"]["wandbMode"]) == (uid, "offline")
    assert "WandbRunStarted" in reasons(kubectl, namespace, NAME)
    attempts = offline_runs(claim_directory(kubectl, namespace, f"{NAME}-checkpoints") / "wandb")
    assert [(run.run_id, run.exit_code) for run in attempts] == [(uid, 1), (uid, 0)]
    logged = [step for run in attempts for step in run.steps("accuracy")]
    assert logged == [STEPS_PER_EPOCH * epoch for epoch in range(1, EPOCHS + 1)], logged
    assert attempts[0].config["world_size"] == 2


def test_one_training_is_one_mlflow_run_across_a_gang_restart_and_a_server_restart(
    mlflow_server: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    kubectl = mlflow_server
    start_operator("--progress-interval=0")
    experiment = f"tracked-{namespace}"
    kubectl.apply(tracked_example(experiment), "-n", namespace)
    kubectl.apply(simulated("replaced", 100, MLFLOW.tracking_uri, experiment), "-n", namespace)
    nowhere = f"http://nowhere.{MLFLOW.namespace}.svc.cluster.local:{MLFLOW.port}"
    kubectl.apply(simulated("untracked", 3, nowhere, experiment), "-n", namespace)

    run_id = run_reported(kubectl, namespace, NAME)
    deleted = run_reported(kubectl, namespace, "replaced")
    with mlflow_client(kubectl) as client:
        client.delete_run(deleted)
    restart_server(kubectl)

    # The deleted run's job logs into a new run, and says so.
    def replaced() -> str | None:
        current = tracking(kubectl, namespace, "replaced").get("mlflowRunId")
        return current if current not in (None, deleted) else None

    new_run = wait("the deleted run replaced", replaced, timeout=180)
    wait("an MLflowRunReplaced Event", lambda: "MLflowRunReplaced" in reasons(kubectl, namespace, "replaced"))

    # A URI that does not resolve: training completes, status and an Event say tracking is unavailable.
    untracked = wait_for_state(kubectl, namespace, "untracked", "Completed", timeout=180)["status"]
    assert "nowhere" in untracked["tracking"]["unavailable"], untracked["tracking"]
    assert "TrackingUnavailable" in reasons(kubectl, namespace, "untracked")

    done = wait_for_state(kubectl, namespace, NAME, "Completed", timeout=420)["status"]
    assert done["restarts"] == {"failure": 1}, done.get("restarts")
    assert done["tracking"]["mlflowRunId"] == run_id
    assert done["tracking"]["mlflowRunUrl"].startswith(f"{MLFLOW.tracking_uri}/#/experiments/")
    assert "MLflowRunCreated" in reasons(kubectl, namespace, NAME)
    assert_one_offline_wandb_run(kubectl, namespace, done)
    kubectl.run("delete", "trainingjob", "replaced", "-n", namespace, "--wait=false")

    with mlflow_client(kubectl) as client:
        uid = kubectl.get_json("trainingjob", NAME, "-n", namespace)["metadata"]["uid"]
        found = client.get_experiment_by_name(experiment)
        assert found is not None
        runs = client.search_runs([found.experiment_id], filter_string=f"tags.`trainingjob.uid` = '{uid}'")
        assert [run.info.run_id for run in runs] == [run_id]
        run = client.get_run(run_id)
        assert (run.info.run_name, run.info.status) == (NAME, "FINISHED")
        assert run.data.tags["trainingjob.namespace"] == namespace
        assert run.data.params["epochs"] == str(EPOCHS)
        assert run.data.params["world_size"] == "2"
        history = sorted(client.get_metric_history(run_id, "accuracy"), key=lambda metric: metric.timestamp)
        logged = [int(metric.step) for metric in history]
        # Every epoch once, at its global step, in the order trained: attempt 0 logged epochs 1 to 3,
        # attempt 1 resumed from epoch 3's checkpoint and logged 4 to 6, the server's restart between.
        assert logged == [STEPS_PER_EPOCH * epoch for epoch in range(1, EPOCHS + 1)], logged
        assert [artifact.path for artifact in client.list_artifacts(run_id, "model")]
        assert client.get_run(deleted).info.lifecycle_stage == "deleted"
        assert client.get_run(new_run).data.tags["trainingjob.name"] == "replaced"

    # The same metrics in TensorBoard's event files on the checkpoint claim, one directory for both
    # attempts, read back with TensorBoard's own reader: each epoch's step once.
    events = EventAccumulator(str(claim_directory(kubectl, namespace, f"{NAME}-checkpoints") / "tensorboard"))
    events.Reload()
    steps = [event.step for event in events.Scalars("accuracy")]
    assert steps == [STEPS_PER_EPOCH * epoch for epoch in range(1, EPOCHS + 1)], steps

    # And served: `kubectl trainingjob tensorboard` runs TensorBoard in the cluster on the job's claim
    # (in the job's own image, on the real node where the job's pods ran) and port-forwards it; its
    # HTTP API has the same steps. Ctrl-C ends it and deletes its pod.
    with tensorboard_viewer(kubectl, namespace, NAME) as url:
        served = wait("TensorBoard serving the accuracy scalars", lambda: served_steps(url, "accuracy"), 120)
    assert served == steps, served
