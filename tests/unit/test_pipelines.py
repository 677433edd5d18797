"""The Kubeflow Pipelines component without a cluster: its interface, the manifest its inputs make, what
its log and its failure say, the checked-in compiled pipeline, and kfp kept away from the operator.

The component running a pipeline against the operator is tests/e2e/test_pipelines_e2e.py.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from trainingjob_client import TrainingJob
from trainingjob_pipelines.component import training_step
from trainingjob_pipelines.step import failure_message, progress_line, result_of, training_manifest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "pipelines"


def job(status: dict[str, Any]) -> TrainingJob:
    return TrainingJob.from_dict(
        {"metadata": {"name": "mnist", "namespace": "team-a"}, "spec": {"numWorkers": 2}, "status": status}
    )


def test_the_checked_in_pipeline_is_what_the_compiler_makes_now(tmp_path: Path) -> None:
    compiled = tmp_path / "train-pipeline.yaml"
    subprocess.run(
        [sys.executable, str(EXAMPLE / "train_pipeline.py"), str(compiled)], check=True, cwd=tmp_path
    )
    checked_in = (EXAMPLE / "train-pipeline.yaml").read_text(encoding="utf-8")
    assert compiled.read_text(encoding="utf-8") == checked_in, (
        "examples/pipelines/train-pipeline.yaml is stale: python examples/pipelines/train_pipeline.py"
    )
    # The training step's pod installs this distribution at this version.
    assert f"'trainingjob-operator=={version('trainingjob-operator')}'" in checked_in
    assert list(tmp_path.iterdir()) == [compiled]


def test_the_component_takes_the_clients_submit_keywords_and_outputs_metrics_and_the_checkpoint() -> None:
    spec = training_step.component_spec
    required = {name for name, entry in spec.inputs.items() if not entry.optional}
    assert required == {"name", "model", "dataset"}
    assert set(spec.inputs) == {
        *required,
        *("num_workers", "namespace", "framework", "gpus_per_worker", "image", "command", "args"),
        *("env", "epochs", "learning_rate", "batch_size", "spec", "timeout_seconds"),
    }
    outputs = {name: entry.type for name, entry in spec.outputs.items()}
    assert outputs == {
        "metrics": "system.Metrics@0.0.1",
        "job_name": "String",
        "checkpoint": "String",
        "final_metrics": "Dict[String, Float]",
    }


def test_the_manifest_holds_the_inputs_given_and_leaves_the_rest_to_the_crds_defaults() -> None:
    bare = training_manifest("mnist", model="cnn", dataset="mnist", num_workers=2, framework="pytorch")
    assert bare["spec"] == {"model": "cnn", "dataset": "mnist", "numWorkers": 2, "framework": "pytorch"}
    assert bare["metadata"] == {"name": "mnist"}
    full = training_manifest(
        "mnist",
        model="cnn",
        dataset="mnist",
        num_workers=2,
        framework="jax",
        gpus_per_worker=0,
        image="trainer:1",
        command=["python", "train.py"],
        env={"SEED": "1"},
        epochs=3,
        learning_rate=0.02,
        batch_size=64,
        spec={"successPolicy": {"targetAccuracy": 0.9}},
    )
    assert full["spec"] == {
        "model": "cnn",
        "dataset": "mnist",
        "numWorkers": 2,
        "framework": "jax",
        "gpusPerWorker": 0,
        "image": "trainer:1",
        "command": ["python", "train.py"],
        "env": [{"name": "SEED", "value": "1"}],
        "hyperparameters": {"epochs": 3, "learningRate": 0.02, "batchSize": 64},
        "successPolicy": {"targetAccuracy": 0.9},
    }


def test_a_progress_line_says_the_job_and_its_status() -> None:
    line = progress_line(
        job({"state": "Running", "currentEpoch": 1, "totalEpochs": 4, "metrics": {"loss": 0.5}})
    )
    assert line.startswith("TrainingJob team-a/mnist: Running")
    assert "epoch 1/4" in line
    assert "loss 0.500" in line


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            {"state": "Failed", "failureReason": "BackoffLimitExceeded", "message": "3 restarts"},
            "TrainingJob team-a/mnist ended Failed: BackoffLimitExceeded: 3 restarts",
        ),
        (
            {
                "state": "Failed",
                "conditions": [
                    {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "after 1h"}
                ],
            },
            "TrainingJob team-a/mnist ended Failed: DeadlineExceeded: after 1h",
        ),
        ({"state": "Failed"}, "TrainingJob team-a/mnist ended Failed"),
    ],
)
def test_a_failed_step_says_the_jobs_reason(status: dict[str, Any], expected: str) -> None:
    assert failure_message(job(status)) == expected


def test_the_outputs_are_the_final_metrics_and_the_latest_checkpoint() -> None:
    done = result_of(
        job(
            {
                "state": "Completed",
                "currentEpoch": 4,
                "metrics": {"accuracy": 0.9},
                "checkpoint": {"latest": "/ckpt/epoch-4", "count": 4},
            }
        )
    )
    assert (done.job_name, done.namespace, done.state) == ("mnist", "team-a", "Completed")
    assert (done.metrics, done.checkpoint, done.epoch) == ({"accuracy": 0.9}, "/ckpt/epoch-4", 4)
    assert result_of(job({"state": "Completed"})).checkpoint == ""


def test_kfp_stays_out_of_the_operator_the_client_and_the_steps_work() -> None:
    program = (
        "import sys, controller.cli, trainingjob_client, trainingjob_pipelines.step; "
        "print(sorted(name for name in sys.modules if name == 'kfp' or name.startswith('kfp.')))"
    )
    imported = subprocess.run(
        [sys.executable, "-c", program], check=True, capture_output=True, text=True, cwd=REPO
    ).stdout
    assert imported.strip() == "[]"
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert "trainingjob_pipelines" not in dockerfile
    assert "kfp" not in (REPO / "requirements" / "runtime.txt").read_text(encoding="utf-8")
