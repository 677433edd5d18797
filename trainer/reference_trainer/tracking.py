"""The reference trainer's MLflow run: one run for the whole TrainingJob, whatever its restarts.

Why: a job that restarts (a failure, a preemption, a gang restart) runs the trainer again from its
latest checkpoint, and a trainer that opens a run at every start scatters one training over several
runs with overlapping steps. Here rank 0 looks for the job's run first, by the tag holding the job's
UID (TRAININGJOB_UID), and opens one only when there is none (experiment MLFLOW_EXPERIMENT_NAME, run
name the job's name, tags with its namespace, name and UID, the hyperparameters as params). A later
attempt finds that run and logs on into it from the step it resumed at; steps the run holds already
(logged after the checkpoint it resumed from) are not logged again, so the history of a metric has
each step once.

Tracking never stops training: every call is guarded, a failure is one warning in the log and the
reason in the progress report (status.tracking.unavailable), and the metrics of an epoch that could
not be logged are sent with the next epoch's. A run deleted in MLflow while the job runs is replaced
by a new one (the operator says so in an Event, as the run's id in the report changes). MLflow's
client is imported only when MLFLOW_TRACKING_URI is set, and only by rank 0: a job without it pays
nothing. Its HTTP retries are cut short (MLFLOW_HTTP_REQUEST_MAX_RETRIES, _TIMEOUT; spec.env may set
them), so a server that does not answer costs seconds per epoch, not minutes.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Mapping
from typing import Any, Final, Protocol

import trainingjob_progress as progress

from .config import Config
from .wandb_run import WandbRun

log = logging.getLogger("train")

TAG_NAMESPACE: Final = "trainingjob.namespace"
TAG_NAME: Final = "trainingjob.name"
TAG_UID: Final = "trainingjob.uid"
# MLflow's client retries a failed request 7 times with exponential backoff by default (minutes).
CLIENT_DEFAULTS: Final = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
# Metrics of epochs that could not be logged, kept for the next try: at most this many.
MAX_PENDING: Final = 1000
# As an attempt ends with metrics the server missed, how long it keeps trying to send them.
FLUSH_SECONDS: Final = 60.0
FLUSH_RETRY_SECONDS: Final = 2.0


class Saves(Protocol):
    def save(self, directory: str, *, epoch: int, step: int) -> None: ...


def params(config: Config, env: Mapping[str, str]) -> dict[str, str]:
    """The run's params: the hyperparameters and the shape of the job."""
    return {key: str(value) for key, value in config.hyperparameters(env).items()}


class Tracking(Protocol):
    """What the training loop calls: at start, after each epoch, at the end of training."""

    def start(self, step: int) -> None: ...

    def log_epoch(self, metrics: Mapping[str, float], *, epoch: int, step: int) -> None: ...

    def log_model(self, engine: Saves, *, epoch: int, step: int) -> None: ...

    def finish(self, *, completed: bool) -> None: ...


class NoTracking:
    """No tracker configured: every call does nothing."""

    def start(self, step: int) -> None:
        return None

    def log_epoch(self, metrics: Mapping[str, float], *, epoch: int, step: int) -> None:
        return None

    def log_model(self, engine: Saves, *, epoch: int, step: int) -> None:
        return None

    def finish(self, *, completed: bool) -> None:
        return None


NO_TRACKING: Final = NoTracking()


class MlflowRun:
    """Rank 0's MLflow run of the job. `start` finds or opens it; `log_epoch` logs an epoch's metrics
    at its global step; `log_model` uploads the final model; `finish` ends it when training
    completed. None of them raises."""

    def __init__(self, config: Config, reporter: progress.Reporter, env: Mapping[str, str]) -> None:
        for name, value in CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient  # noqa: PLC0415 - only when tracking is asked for

        self.client = MlflowClient(env["MLFLOW_TRACKING_URI"])
        self.config = config
        self.reporter = reporter
        self.experiment_name = env.get("MLFLOW_EXPERIMENT_NAME", "") or env.get(
            "TRAININGJOB_NAME", "training"
        )
        self.job = {
            TAG_NAMESPACE: env.get("TRAININGJOB_NAMESPACE", ""),
            TAG_NAME: env.get("TRAININGJOB_NAME", ""),
            TAG_UID: env.get("TRAININGJOB_UID", ""),
        }
        self.params = params(config, env)
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.last_step = -1  # the highest step the run holds a metric at
        self.pending: list[tuple[str, float, int]] = []
        self.failing: str | None = None

    @classmethod
    def from_env(
        cls, config: Config, reporter: progress.Reporter, env: Mapping[str, str]
    ) -> MlflowRun | None:
        """Rank 0's run when MLFLOW_TRACKING_URI is set; None otherwise or when the client is missing."""
        if config.rank != 0 or not env.get("MLFLOW_TRACKING_URI", "").strip():
            return None
        try:
            return cls(config, reporter, env)
        except ImportError:
            log.warning("MLFLOW_TRACKING_URI is set but mlflow is not installed in the image: not tracking")
            reporter.tracking(error="mlflow is not installed in the trainer's image")
            return None

    # ------------------------------------------------------------------------------------ the run

    def _experiment(self) -> str:
        from mlflow.exceptions import MlflowException  # noqa: PLC0415

        found = self.client.get_experiment_by_name(self.experiment_name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(self.experiment_name))
        except MlflowException:  # another job created it meanwhile
            again = self.client.get_experiment_by_name(self.experiment_name)
            if again is None:
                raise
            return str(again.experiment_id)

    def _find(self, experiment_id: str) -> str | None:
        """The job's run that is not deleted, by its UID tag."""
        if not self.job[TAG_UID]:
            return None
        runs = self.client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{TAG_UID}` = '{self.job[TAG_UID]}'",
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        return str(runs[0].info.run_id) if runs else None

    def _open(self, experiment_id: str) -> str:
        from mlflow.entities import Param  # noqa: PLC0415

        tags = {key: value for key, value in self.job.items() if value}
        run = self.client.create_run(experiment_id, run_name=self.job[TAG_NAME] or None, tags=tags)
        run_id = str(run.info.run_id)
        self.client.log_batch(run_id, params=[Param(key, value) for key, value in self.params.items()])
        log.info("MLflow: opened run %s in experiment %s", run_id, self.experiment_name)
        return run_id

    def _last_step(self, run_id: str) -> int:
        history = self.client.get_metric_history(run_id, "accuracy")
        return max((int(metric.step) for metric in history), default=-1)

    def _attach(self) -> None:
        """Finds the job's run (or opens it) and what step it holds metrics up to."""
        self.experiment_id = self._experiment()
        found = self._find(self.experiment_id)
        if found is not None:
            self.run_id, self.last_step = found, self._last_step(found)
            log.info("MLflow: continuing run %s after step %d", found, self.last_step)
        else:
            self.run_id, self.last_step = self._open(self.experiment_id), -1
        self._ok()

    def _ok(self) -> None:
        if self.failing is not None:
            log.info("MLflow: the tracking server answers again")
        self.failing = None
        self.reporter.tracking(mlflow_run_id=self.run_id, mlflow_experiment_id=self.experiment_id)

    def _failed(self, what: str, error: Exception) -> None:
        message = f"{what}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500]
        if message != self.failing:
            log.warning("MLflow: %s; training goes on", message)
        self.failing = message
        self.reporter.tracking(
            mlflow_run_id=self.run_id, mlflow_experiment_id=self.experiment_id, error=message
        )

    def _deleted(self) -> bool:
        """Whether the run was deleted in MLflow (or is gone): a reason to open another."""
        from mlflow.exceptions import MlflowException  # noqa: PLC0415

        if self.run_id is None:
            return False
        try:
            return str(self.client.get_run(self.run_id).info.lifecycle_stage) == "deleted"
        except MlflowException as error:
            return getattr(error, "error_code", "") == "RESOURCE_DOES_NOT_EXIST"

    def start(self, step: int) -> None:
        try:
            self._attach()
        except Exception as error:
            self._failed(f"cannot reach {self.client.tracking_uri}", error)

    # -------------------------------------------------------------------------------- logging

    def log_epoch(self, metrics: Mapping[str, float], *, epoch: int, step: int) -> None:
        """The epoch's metrics at global step `step` (and `epoch`), unless the run holds that step."""
        if step > self.last_step:
            values = {**metrics, "epoch": float(epoch)}
            self.pending.extend((name, float(value), step) for name, value in values.items())
            del self.pending[:-MAX_PENDING]
        self._send()

    def _send(self) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415

        try:
            if self.run_id is None:
                self._attach()
            elif self._deleted():
                old = self.run_id
                self.experiment_id = self._experiment()
                self.run_id, self.last_step = self._open(self.experiment_id), -1
                log.warning("MLflow: run %s was deleted; logging into a new run %s", old, self.run_id)
            metrics = [
                Metric(name, value, timestamp_ms(), step)
                for name, value, step in self.pending
                if step > self.last_step
            ]
            if metrics and self.run_id is not None:
                self.client.log_batch(self.run_id, metrics=metrics)
                self.last_step = max(metric.step for metric in metrics)
            self.pending.clear()
            self._ok()
        except Exception as error:
            self._failed("could not log metrics", error)

    def log_model(self, engine: Saves, *, epoch: int, step: int) -> None:
        """The trained model (the engine's saved state) as the run's artifact `model`."""
        if self.run_id is None:
            return
        try:
            with tempfile.TemporaryDirectory(prefix="model-") as directory:
                engine.save(directory, epoch=epoch, step=step)
                self.client.log_artifacts(self.run_id, directory, artifact_path="model")
            log.info("MLflow: logged the model of step %d to run %s", step, self.run_id)
        except Exception as error:
            self._failed("could not log the model", error)

    def finish(self, *, completed: bool) -> None:
        """Sends what the server missed (a server restarting as the attempt ends) for FLUSH_SECONDS at
        most, then ends the run when training completed; an attempt that stops (a restart) leaves it
        running. A server never reached costs no wait."""
        deadline = time.monotonic() + FLUSH_SECONDS
        while self.pending and self.run_id is not None and time.monotonic() < deadline:
            time.sleep(FLUSH_RETRY_SECONDS)
            self._send()
        if not completed or self.run_id is None:
            return
        try:
            self.client.set_terminated(self.run_id, "FINISHED")
        except Exception as error:
            self._failed("could not end the run", error)


def timestamp_ms() -> int:
    return int(time.time() * 1000)


class TensorBoardLog:
    """Rank 0's TensorBoard event files in TENSORBOARD_LOG_DIR (monitoring.tensorboardEnabled; on the
    checkpoint claim unless tensorboardLogDir says otherwise): the epoch's metrics at the global step,
    through torch's SummaryWriter. Every attempt writes into the same directory; one resumed at step S
    starts its file with a purge of the steps after S, so TensorBoard drops what an earlier attempt
    wrote after the checkpoint it resumed from and each step shows once."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.writer: Any = None

    @classmethod
    def from_env(cls, config: Config, env: Mapping[str, str]) -> TensorBoardLog | None:
        directory = env.get("TENSORBOARD_LOG_DIR", "").strip()
        return cls(directory) if directory and config.rank == 0 else None

    def start(self, step: int) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - only when asked for

            os.makedirs(self.directory, exist_ok=True)
            # Events an earlier attempt wrote after the step this one resumed at are dropped.
            self.writer = SummaryWriter(log_dir=self.directory, purge_step=step + 1 if step else None)
            log.info("TensorBoard: writing event files to %s from step %d", self.directory, step)
        except Exception as error:  # no tensorboard in the image, a directory it cannot write
            log.warning("TensorBoard: cannot write to %s (%s); training goes on", self.directory, error)

    def log_epoch(self, metrics: Mapping[str, float], *, epoch: int, step: int) -> None:
        if self.writer is None:
            return
        try:
            for name, value in {**metrics, "epoch": float(epoch)}.items():
                self.writer.add_scalar(name, value, step)
            self.writer.flush()
        except Exception as error:
            log.warning("TensorBoard: could not write step %d: %s", step, error)

    def log_model(self, engine: Saves, *, epoch: int, step: int) -> None:
        return None

    def finish(self, *, completed: bool) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception as error:
                log.warning("TensorBoard: could not close the event file: %s", error)


class Trackers:
    """Every tracker the job asks for, called in turn."""

    def __init__(self, trackers: list[Tracking]) -> None:
        self.trackers = trackers

    def start(self, step: int) -> None:
        for tracker in self.trackers:
            tracker.start(step)

    def log_epoch(self, metrics: Mapping[str, float], *, epoch: int, step: int) -> None:
        for tracker in self.trackers:
            tracker.log_epoch(metrics, epoch=epoch, step=step)

    def log_model(self, engine: Saves, *, epoch: int, step: int) -> None:
        for tracker in self.trackers:
            tracker.log_model(engine, epoch=epoch, step=step)

    def finish(self, *, completed: bool) -> None:
        for tracker in self.trackers:
            tracker.finish(completed=completed)


def trackers(config: Config, reporter: progress.Reporter, env: Mapping[str, str]) -> Tracking:
    """What spec.monitoring asks rank 0 to log to: MLflow, W&B (wandb_run.py), TensorBoard, any of
    them or nothing."""
    candidates: tuple[Tracking | None, ...] = (
        MlflowRun.from_env(config, reporter, env),
        WandbRun.from_env(config, reporter, env),
        TensorBoardLog.from_env(config, env),
    )
    found = [tracker for tracker in candidates if tracker is not None]
    return Trackers(found) if found else NO_TRACKING
