"""The KFP v2 component that runs a TrainingJob as a pipeline step: `train_on_operator`.

Why a lightweight Python component (`@dsl.component`) and not a container component: its inputs are
typed parameters the KFP UI shows and a pipeline wires (a learning rate from the step before), its
outputs are a `Metrics` artifact the UI draws plus typed values the next step reads, and kfp's local
runner can run it (its SubprocessRunner runs only Python components). The inputs are the Python client's
`submit` keywords (docs/client.md), so a pipeline reads like a notebook; `spec` passes any other spec
field as the API spells it.

KFP copies the function's source into the step's pod, so the body imports what it needs itself and is
a thin call into `trainingjob_pipelines.step`; the pod needs this package and `trainingjob_client`
installed: `packages_to_install` names this distribution at the version that compiled the pipeline
(from the pipeline's package index, `pip_index_urls`), or `make_training_component(base_image=...)`
names an image that has it (docs/pipelines.md).
"""

from importlib.metadata import version
from typing import Any, NamedTuple, Optional

from kfp import dsl
from kfp.dsl import Metrics, Output

DISTRIBUTION = "trainingjob-operator"
# The package needs Python 3.11; KFP's default base image is older.
BASE_IMAGE = "python:3.11-slim"


def train_on_operator(  # noqa: PLR0917 - kfp passes the inputs by name
    metrics: Output[Metrics],
    name: str,
    model: str,
    dataset: str,
    num_workers: int = 1,
    namespace: str = "",
    framework: str = "pytorch",
    gpus_per_worker: Optional[int] = None,  # noqa: UP045 - kfp reads Optional, not `int | None`
    image: str = "",
    command: Optional[list[str]] = None,  # noqa: UP045
    args: Optional[list[str]] = None,  # noqa: UP045
    env: Optional[dict[str, str]] = None,  # noqa: UP045
    epochs: Optional[int] = None,  # noqa: UP045
    learning_rate: Optional[float] = None,  # noqa: UP045
    batch_size: Optional[int] = None,  # noqa: UP045
    spec: Optional[dict[str, Any]] = None,  # noqa: UP045
    timeout_seconds: float = 86400.0,
) -> NamedTuple(  # type: ignore[valid-type]
    "TrainingOutputs", [("job_name", str), ("checkpoint", str), ("final_metrics", dict[str, float])]
):
    """Creates the TrainingJob `name` (a prefix if it ends in "-") in `namespace` (default: the pod's),
    prints a line at every change of its status, and outputs its final metrics (`metrics`,
    `final_metrics`), its latest checkpoint (`checkpoint`, "" if it reported none) and its name. A job
    that ends Failed fails the step with the job's reason; so do a refused manifest and a job not
    finished in `timeout_seconds`."""
    # Imports here: KFP runs this function's source alone in the step's pod.
    from typing import NamedTuple  # noqa: PLC0415

    from trainingjob_client import TrainingJobClient  # noqa: PLC0415
    from trainingjob_pipelines.step import run_training_step, training_manifest  # noqa: PLC0415

    manifest = training_manifest(
        name,
        model=model,
        dataset=dataset,
        num_workers=num_workers,
        framework=framework,
        gpus_per_worker=gpus_per_worker,
        image=image,
        command=command,
        args=args,
        env=env,
        epochs=epochs,
        learning_rate=learning_rate,
        batch_size=batch_size,
        spec=spec,
    )
    result = run_training_step(TrainingJobClient(namespace or None), manifest, timeout=timeout_seconds)
    for key, value in sorted(result.metrics.items()):
        metrics.log_metric(key, value)
    TrainingOutputs = NamedTuple(  # noqa: UP014 - what the return annotation names
        "TrainingOutputs", [("job_name", str), ("checkpoint", str), ("final_metrics", dict[str, float])]
    )
    return TrainingOutputs(result.job_name, result.checkpoint, dict(result.metrics))


def make_training_component(
    *,
    base_image: str = BASE_IMAGE,
    packages_to_install: list[str] | None = None,
    pip_index_urls: list[str] | None = None,
) -> Any:
    """The component for pods of `base_image`, which install `packages_to_install` (default: this
    distribution at this version) from `pip_index_urls` (default: pip's own). An image that already
    has the package: `packages_to_install=[]`."""
    packages = (
        [f"{DISTRIBUTION}=={version(DISTRIBUTION)}"] if packages_to_install is None else packages_to_install
    )
    return dsl.component(
        train_on_operator,
        base_image=base_image,
        packages_to_install=packages,
        pip_index_urls=pip_index_urls,
    )


training_step = make_training_component()
