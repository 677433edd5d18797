"""The Kubeflow Pipelines component end to end: examples/pipelines' two-step pipeline run by kfp's local
runner against the local cluster and the real operator.

kfp's SubprocessRunner runs each step as a subprocess of this interpreter, as a KFP install runs it
in a pod: the first step computes the learning rate, the training step creates the TrainingJob through
the Python client, prints its progress and outputs its metrics and checkpoint, which the test reads
back from the run's outputs. The step has the rights docs/pipelines.md gives a KFP install's
`pipeline-runner` and no others: its kubeconfig ($KUBECONFIG) holds a token of that ServiceAccount,
bound by the page's Role and RoleBinding, applied as they are. The job runs on kwok's nodes, where no
trainer runs: the test plays rank 0's reporter (the progress annotation, docs/progress.md) and the
kubelet (the workers' exit), as the lifecycle tests do. The runner writes its outputs under the test's
tmp_path. A job that ends Failed fails the step, whose log says the job's reason.
"""

from __future__ import annotations

import importlib.util
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from kfp import local

from testbed import Kubectl, end_pod, wait_for
from tests.cluster import REPO
from tests.e2e.jobs import wait_for_state
from tests.e2e.lifecycle_support import progress_patch, running_pods, token_kubectl, wait_status
from tests.e2e.operator import OperatorProcess
from tests.e2e.test_docs_yaml import yaml_blocks

EXAMPLE = REPO / "examples" / "pipelines" / "train_pipeline.py"
PIPELINES_DOC = REPO / "docs" / "pipelines.md"
STEP_ACCOUNT = "pipeline-runner"
RUN_SECONDS = 120.0


def docs_blocks() -> list[str]:
    """docs/pipelines.md's YAML: the training step's Role and its RoleBinding to `pipeline-runner`."""
    return yaml_blocks(PIPELINES_DOC.read_text(encoding="utf-8"))


def step_kubeconfig(cluster: Kubectl, namespace: str, directory: Path) -> Path:
    """A kubeconfig with a token of `pipeline-runner` in `namespace`, bound by the docs' Role alone."""
    cluster.run("create", "serviceaccount", STEP_ACCOUNT, "-n", namespace)
    (block,) = docs_blocks()
    cluster.run("apply", "-n", namespace, "-f", "-", stdin=block)
    token = cluster.run("create", "token", STEP_ACCOUNT, "-n", namespace, "--duration=1h").strip()
    path = directory / f"{STEP_ACCOUNT}.kubeconfig"
    token_kubectl(cluster, token, path)
    return path


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_pipeline_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class PipelineRun:
    """The pipeline running in a thread of its own while the test plays the trainer."""

    thread: threading.Thread
    outputs: dict[str, Any] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)

    def join(self) -> None:
        self.thread.join(RUN_SECONDS)
        assert not self.thread.is_alive(), f"the pipeline did not end within {RUN_SECONDS:.0f}s"


@pytest.fixture
def run_pipeline(
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> Iterator[Callable[..., PipelineRun]]:
    """Starts examples/pipelines' pipeline with kfp's local runner (outputs under tmp_path), its steps
    with `pipeline-runner`'s rights; returns at once. Afterwards the namespace's jobs are deleted, which
    ends a step still waiting (a test that failed half-way), and the pipeline is waited for while its
    output is still captured (`capfd`)."""
    monkeypatch.setenv("KUBECONFIG", str(step_kubeconfig(kubectl, namespace, tmp_path)))
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "kfp"))
    example = load_example()
    started: list[PipelineRun] = []

    def start(**arguments: Any) -> PipelineRun:
        run = PipelineRun(threading.Thread(target=lambda: None))

        def body() -> None:
            try:
                task = example.train_pipeline(namespace=namespace, timeout_seconds=RUN_SECONDS, **arguments)
                run.outputs.update(task.outputs)
            except BaseException as error:  # handed to the test's thread
                run.errors.append(error)

        run.thread = threading.Thread(target=body, name="pipeline")
        run.thread.start()
        started.append(run)
        return run

    yield start
    kubectl.run("delete", "trainingjobs", "--all", "-n", namespace, "--wait=false")
    for run in started:
        run.thread.join(RUN_SECONDS)


def created_job(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    """The one TrainingJob the training step created in `namespace`, once it is Running."""

    def probe() -> str | None:
        items = kubectl.get_json("trainingjobs", "-n", namespace)["items"]
        return str(items[0]["metadata"]["name"]) if items else None

    name = wait_for("a TrainingJob created by the pipeline", probe, timeout=RUN_SECONDS)
    return wait_for_state(kubectl, namespace, name, "Running", timeout=RUN_SECONDS)


def report(kubectl: Kubectl, namespace: str, pod: str, progress: dict[str, Any]) -> None:
    """What rank 0's reporter sends: the progress annotation on its own pod (docs/progress.md)."""
    kubectl.run("patch", "pod", pod, "-n", namespace, "--type=merge", "-p", progress_patch(progress))


@pytest.fixture
def operator(start_operator: Callable[..., OperatorProcess]) -> OperatorProcess:
    """The operator, taking every progress report into status at once."""
    return start_operator("--progress-interval=0")


@pytest.mark.usefixtures("operator")
def test_a_two_step_pipeline_trains_a_trainingjob_and_outputs_its_metrics_and_checkpoint(
    kubectl: Kubectl,
    namespace: str,
    run_pipeline: Callable[..., PipelineRun],
    capfd: pytest.CaptureFixture[str],
) -> None:
    run = run_pipeline(job_name="kfp-train", batch_size=64, epochs=2, num_workers=2)
    job = created_job(kubectl, namespace)
    assert job["metadata"]["name"] == "kfp-train"
    # The first step's value, in the job the second one created: 0.01 scaled from 32 to 64.
    assert job["spec"]["hyperparameters"] == {"epochs": 2, "batchSize": 64, "learningRate": 0.02}
    assert (job["spec"]["numWorkers"], job["spec"]["gpusPerWorker"]) == (2, 0)
    running_pods(kubectl, namespace, "kfp-train", attempt=0, count=2)
    metrics = {"accuracy": 0.93, "loss": 0.21}
    final = {"epoch": 2, "totalEpochs": 2, "metrics": metrics, "checkpoint": "/checkpoints/epoch-2"}
    report(kubectl, namespace, "kfp-train-worker-0", {"epoch": 1, "metrics": {"accuracy": 0.5, "loss": 0.9}})
    wait_status(kubectl, namespace, "kfp-train", "epoch 1", lambda s: s.get("currentEpoch") == 1)
    report(kubectl, namespace, "kfp-train-worker-0", final)
    wait_status(kubectl, namespace, "kfp-train", "epoch 2", lambda s: s.get("currentEpoch") == 2)
    for rank in (0, 1):
        end_pod(kubectl, namespace, f"kfp-train-worker-{rank}")
    wait_for_state(kubectl, namespace, "kfp-train", "Completed", timeout=RUN_SECONDS)
    run.join()
    assert run.errors == []
    assert run.outputs["checkpoint"] == "/checkpoints/epoch-2"
    assert run.outputs["job_name"] == "kfp-train"
    assert run.outputs["metrics"].metadata == metrics
    log = capfd.readouterr().out
    # The step's progress lines, one per change of the job's status.
    assert f"TrainingJob {namespace}/kfp-train created" in log
    job_line = rf"TrainingJob {re.escape(namespace)}/kfp-train: "
    assert re.search(job_line + r"Running +epoch 1/2 +progress +50% +accuracy 0\.500 +loss 0\.900", log)
    assert re.search(job_line + r"Completed +epoch 2/2 +progress 100% +accuracy 0\.930", log)


@pytest.mark.usefixtures("operator")
def test_a_trainingjob_that_fails_fails_its_step_with_the_jobs_reason(
    kubectl: Kubectl,
    namespace: str,
    run_pipeline: Callable[..., PipelineRun],
    capfd: pytest.CaptureFixture[str],
) -> None:
    run = run_pipeline()  # the example's default name: a prefix, the job's name made by the API server
    name = created_job(kubectl, namespace)["metadata"]["name"]
    assert re.fullmatch(r"mnist-pipeline-[a-z0-9]{5}", name)
    running_pods(kubectl, namespace, name, attempt=0, count=2)
    end_pod(kubectl, namespace, f"{name}-worker-1", exit_code=3, reason="Error")
    failed = wait_for_state(kubectl, namespace, name, "Failed", timeout=RUN_SECONDS)
    run.join()
    assert run.outputs == {}
    assert len(run.errors) == 1
    assert "Inner task failed" in str(run.errors[0])
    assert "train-on-operator" in str(run.errors[0])
    status = failed["status"]
    log = capfd.readouterr().out
    expected = f"TrainingStepFailed: TrainingJob {namespace}/{name} ended Failed: {status['failureReason']}"
    assert expected in log
    assert status["message"] in log
