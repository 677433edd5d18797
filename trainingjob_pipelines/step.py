"""The training step's work, without kfp: create a TrainingJob, follow it to its end, return its results.

Why apart from the component: the KFP component (`trainingjob_pipelines.component`) is only the typed
face a pipeline author sees; its function body, which KFP copies into the step's pod as source, calls
`run_training_step` here. So the behaviour (what a progress line says, what a failure says, what the
outputs hold) is plain Python on `TrainingJobClient`, tested without kfp, and kfp is needed only where
the pipeline is compiled or run. A step's log is a text log (the KFP UI shows it, a local run prints
it), so progress is one line per change of the job's status, never a redrawn bar.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from trainingjob_client.client import TrainingJobClient
from trainingjob_client.manifest import JobFields, JsonDict, build_manifest
from trainingjob_client.views import TrainingJob, describe_status

DEFAULT_TIMEOUT_SECONDS = 24 * 3600.0


class TrainingStepFailed(RuntimeError):
    """The TrainingJob ended Failed: the message names the job and says why, from its status."""

    def __init__(self, message: str, job: TrainingJob) -> None:
        super().__init__(message)
        self.job = job


@dataclass(frozen=True)
class StepResult:
    """What the step outputs: the job's name, its final metrics and its latest checkpoint ("" if none)."""

    job_name: str
    namespace: str
    state: str
    metrics: Mapping[str, float] = field(default_factory=dict)
    checkpoint: str = ""
    epoch: int | None = None


def training_manifest(
    name: str,
    *,
    model: str,
    dataset: str,
    num_workers: int,
    framework: str,
    gpus_per_worker: int | None = None,
    image: str = "",
    command: Sequence[str] | None = None,
    args: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    epochs: int | None = None,
    learning_rate: float | None = None,
    batch_size: int | None = None,
    spec: Mapping[str, Any] | None = None,
) -> JsonDict:
    """The TrainingJob the component's inputs describe: what `TrainingJobClient.submit` would create from
    the same keywords. Inputs left at None (or `image` at "") are not set, so the CRD's defaults apply;
    the API server judges the values and names the field it refuses. A `name` ending in "-" is a prefix
    (metadata.generateName): the API server adds a suffix, so every run of a pipeline gets a job of
    its own."""
    given: dict[str, Any] = {
        "gpus_per_worker": gpus_per_worker,
        "image": image or None,
        "command": command,
        "args": args,
        "env": env,
        "epochs": epochs,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "spec": spec,
    }
    fields = {key: value for key, value in given.items() if value is not None}
    fields.update(model=model, dataset=dataset, num_workers=num_workers, framework=framework)
    manifest = build_manifest(name, **cast(JobFields, fields))
    if name.endswith("-"):
        manifest["metadata"]["generateName"] = manifest["metadata"].pop("name")
    return manifest


def progress_line(job: TrainingJob) -> str:
    """One line of the step's log: the job and what its status says now (state, epoch, metrics...)."""
    return f"TrainingJob {job.namespace}/{job.name}: {describe_status(job.status)}"


def failure_message(job: TrainingJob) -> str:
    """Why the step fails: the job's failure reason and message as the operator wrote them."""
    status = job.status
    failed = status.condition("Failed")
    reason = status.failure_reason or (failed.reason if failed is not None else "")
    detail = status.message or (failed.message if failed is not None else "")
    text = f"TrainingJob {job.namespace}/{job.name} ended {status.state}"
    explained = ": ".join(part for part in (reason, detail) if part)
    return f"{text}: {explained}" if explained else text


def result_of(job: TrainingJob) -> StepResult:
    """The outputs of a job that finished Completed."""
    status = job.status
    return StepResult(
        job_name=job.name,
        namespace=job.namespace,
        state=str(status.state),
        metrics=dict(status.metrics),
        checkpoint=status.latest_checkpoint or "",
        epoch=status.current_epoch,
    )


def run_training_step(
    client: TrainingJobClient,
    manifest: Mapping[str, Any],
    *,
    timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
    say: Callable[[str], None] = print,
) -> StepResult:
    """Creates the TrainingJob of `manifest`, says every change of its status, and returns its results
    once it is Completed. Raises TrainingStepFailed when it ends Failed, and the client's errors (the
    API refused the manifest, WaitTimeout after `timeout` seconds, the job deleted) as they come."""
    created = client.create(manifest)
    say(f"TrainingJob {created.namespace}/{created.name} created")
    watch = client.watch(created.name, namespace=created.namespace, timeout=timeout)
    last_line = ""
    try:
        for job in watch:
            line = progress_line(job)
            if line != last_line:
                say(line)
                last_line = line
    finally:
        watch.close()
    final = watch.last
    if final.status.state != "Completed":
        raise TrainingStepFailed(failure_message(final), final)
    return result_of(final)
