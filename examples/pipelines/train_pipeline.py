"""A two-step Kubeflow pipeline around a TrainingJob, and the program that compiles it.

Step one chooses the learning rate from the batch size (the linear scaling rule); step two trains with
it as a TrainingJob on the operator (`trainingjob_pipelines.component.training_step`) and outputs the
job's final metrics, checkpoint and name, which the pipeline outputs in turn. The job's name is a
prefix by default ("mnist-pipeline-"), so every run trains a job of its own. `python
examples/pipelines/train_pipeline.py` writes train-pipeline.yaml next to this file, the file to
upload to a Kubeflow Pipelines install (docs/pipelines.md); a unit test fails when the two differ.
"""

import sys
from pathlib import Path
from typing import NamedTuple

from kfp import compiler, dsl
from kfp.dsl import Metrics

from trainingjob_pipelines.component import BASE_IMAGE, training_step

COMPILED = Path(__file__).with_name("train-pipeline.yaml")


@dsl.component(base_image=BASE_IMAGE)
def scaled_learning_rate(batch_size: int, base_rate: float, base_batch_size: int) -> float:
    """The learning rate for `batch_size`, scaled linearly from `base_rate` at `base_batch_size`."""
    return base_rate * batch_size / base_batch_size


class PipelineOutputs(NamedTuple):
    metrics: Metrics
    checkpoint: str
    job_name: str


@dsl.pipeline(
    name="train-on-trainingjob",
    description="Chooses a learning rate, trains a TrainingJob with it, outputs its metrics and checkpoint.",
)
def train_pipeline(  # noqa: PLR0917 - kfp passes the parameters by name
    job_name: str = "mnist-pipeline-",
    namespace: str = "",
    batch_size: int = 64,
    epochs: int = 3,
    num_workers: int = 2,
    timeout_seconds: float = 3600.0,
) -> PipelineOutputs:
    rate = scaled_learning_rate(batch_size=batch_size, base_rate=0.01, base_batch_size=32)
    train = training_step(
        name=job_name,
        namespace=namespace,
        model="cnn",
        dataset="mnist",
        num_workers=num_workers,
        gpus_per_worker=0,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=rate.output,
        # A failed worker fails the job, and so the step, at once: whether to try again is the
        # pipeline's decision (the task's set_retry), not a restart inside the step.
        spec={"failurePolicy": {"restartPolicy": "Never"}},
        timeout_seconds=timeout_seconds,
    )
    return PipelineOutputs(
        metrics=train.outputs["metrics"],
        checkpoint=train.outputs["checkpoint"],
        job_name=train.outputs["job_name"],
    )


def compile_to(path: Path) -> None:
    compiler.Compiler().compile(train_pipeline, str(path))


if __name__ == "__main__":
    compile_to(Path(sys.argv[1]) if len(sys.argv) > 1 else COMPILED)
