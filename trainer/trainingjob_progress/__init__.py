"""Progress reports and checkpoint housekeeping for code running inside a TrainingJob's worker pods.

Why this exists: the operator learns how far training got (epoch, step, metrics, latest checkpoint)
only from one annotation that rank 0 patches on its own Pod (docs/progress.md); after a restart it
resumes the job from the checkpoint reported there. Training code must therefore be able to report
without ever being slowed down or broken by the Kubernetes API: a report is a value dropped into a
one-slot mailbox (the newest value wins) that a background daemon thread sends with short timeouts,
one request at a time, at most once per `min_interval`. Errors are logged once per distinct error
and the report is dropped; the next report simply replaces it.

The operator never reads training storage, so the trainer also owns its checkpoints: where they go
(`checkpoint_path`, under CHECKPOINT_DIR), how they are written so a crash never leaves a half-written
one behind (`atomic_checkpoint`), which one to resume from (`resume_path`, `latest_checkpoint_dir`)
and how many are kept (`enforce_retention`, CHECKPOINT_RETENTION). Retention works on filesystem
paths only (pvc and nfs storage); for s3:// and gs:// the bucket's lifecycle rules or the user's own
code must delete old checkpoints.

Standard library only, Python 3.9 or later (training images bring their own Python): the operator
ships it next to the reference trainer in every namespace's trainer ConfigMap (mounted at
/etc/trainingjob), and custom training code can import it from there or copy the package's folder
(trainingjob_progress/, every module of it). This file is the helper's whole public surface: the
Reporter, the checkpoint helpers re-exported from the module checkpoints, what to do when the pod
is told to stop (stop), and waiting until a peer's name resolves (peers). The Reporter puts together
the report's content (report), the background sender (sender) and the PATCH of the pod (transport);
base holds what they share.

    from trainingjob_progress import Reporter

    reporter = Reporter.from_env()  # a no-op outside a cluster and on every rank but 0
    for epoch in range(start, epochs):
        ...
        reporter.report(epoch=epoch + 1, total_epochs=epochs, metrics={"loss": loss, "accuracy": acc})
    reporter.close()  # sends the last report
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .base import (
    API_URL_ENV,
    CA_FILE_ENV,
    DEFAULT_ANNOTATION,
    DEFAULT_MIN_INTERVAL,
    DEFAULT_TIMEOUT,
    GPU_UTILIZATION,
    SERVICE_ACCOUNT_DIR,
    TOKEN_FILE_ENV,
    OnceLogger,
    log,
)
from .checkpoints import (
    atomic_checkpoint,
    checkpoint_dir,
    checkpoint_epoch,
    checkpoint_path,
    checkpoint_step,
    enforce_retention,
    is_remote,
    latest_checkpoint_dir,
    list_checkpoints,
    resolve_checkpoint,
    resume_path,
)
from .peers import DEFAULT_NAME_TIMEOUT, wait_for_name
from .report import ReportBuilder
from .sender import Sender
from .stop import EXIT_TERMINATED, GRACE_PERIOD_ENV, grace_period_seconds, stop_on_sigterm
from .transport import ApiAccess, PodPatcher, pod_url, rank, read_text

__all__ = [
    "API_URL_ENV",
    "CA_FILE_ENV",
    "DEFAULT_ANNOTATION",
    "DEFAULT_MIN_INTERVAL",
    "DEFAULT_NAME_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "EXIT_TERMINATED",
    "GPU_UTILIZATION",
    "GRACE_PERIOD_ENV",
    "SERVICE_ACCOUNT_DIR",
    "TOKEN_FILE_ENV",
    "Reporter",
    "atomic_checkpoint",
    "checkpoint_dir",
    "checkpoint_epoch",
    "checkpoint_path",
    "checkpoint_step",
    "enforce_retention",
    "grace_period_seconds",
    "is_remote",
    "latest_checkpoint_dir",
    "list_checkpoints",
    "resolve_checkpoint",
    "resume_path",
    "stop_on_sigterm",
    "wait_for_name",
]


class Reporter:
    """Reports training progress by patching the progress annotation on this process's own Pod.

    `report()` never blocks and never raises. A disabled reporter (see `from_env`) accepts the same
    calls and does nothing, so training code needs no `if rank == 0` around them.
    """

    def __init__(
        self,
        *,
        api_url: str,
        namespace: str,
        pod_name: str,
        annotation: str = DEFAULT_ANNOTATION,
        token_path: str | None = f"{SERVICE_ACCOUNT_DIR}/token",
        ca_path: str | None = f"{SERVICE_ACCOUNT_DIR}/ca.crt",
        min_interval: float = DEFAULT_MIN_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """A reporter that sends to `api_url` (https://host:port, or http:// for local tests).

        token_path is re-read before every request because projected service-account tokens rotate;
        ca_path verifies the API server's certificate for https URLs.
        """
        self._enabled = True
        self._reason = f"reporting to pod {namespace}/{pod_name}"
        self._once = OnceLogger()
        self._patcher = PodPatcher(
            url=pod_url(api_url, namespace, pod_name),
            annotation=annotation,
            token_path=token_path,
            ca_path=ca_path,
            timeout=float(timeout),
            once=self._once,
        )
        self._builder = ReportBuilder(self._once)
        self._sender = Sender(self._patcher.send, min_interval, self._once)

    @classmethod
    def disabled(cls, reason: str) -> Reporter:
        """A reporter whose methods do nothing; `reason` says why (logged once by from_env)."""
        reporter = cls(api_url="http://disabled.invalid", namespace="-", pod_name="-")
        reporter._enabled = False
        reporter._reason = reason
        return reporter

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        min_interval: float = DEFAULT_MIN_INTERVAL,
        timeout: float = DEFAULT_TIMEOUT,
        service_account_dir: str = SERVICE_ACCOUNT_DIR,
    ) -> Reporter:
        """The reporter for this process, configured from the variables the operator injects.

        Disabled (a no-op) on every rank but 0, and outside a cluster: without KUBERNETES_SERVICE_HOST
        and KUBERNETES_SERVICE_PORT (or TRAININGJOB_PROGRESS_API_URL), POD_NAME, or a namespace
        (TRAININGJOB_NAMESPACE, else the service account's namespace file). The token and, for https,
        the CA come from the service account's directory unless TRAININGJOB_PROGRESS_TOKEN_FILE and
        TRAININGJOB_PROGRESS_CA_FILE name other files.
        """
        env = os.environ if environ is None else environ
        try:
            own_rank = rank(env)
        except ValueError:
            return cls._disabled_logged(f"cannot tell this process's rank (RANK={env.get('RANK')!r})")
        if own_rank != 0:
            return cls._disabled_logged(f"rank {own_rank}: only rank 0 reports progress")
        access = ApiAccess.from_env(env, service_account_dir)
        pod_name = env.get("POD_NAME", "").strip()
        namespace = env.get("TRAININGJOB_NAMESPACE", "").strip() or read_text(
            f"{service_account_dir}/namespace"
        )
        if access is None or not pod_name or not namespace:
            return cls._disabled_logged(
                "not running in a TrainingJob pod (no Kubernetes API address, POD_NAME or namespace)"
            )
        reporter = cls(
            api_url=access.url,
            namespace=namespace,
            pod_name=pod_name,
            annotation=env.get("TRAININGJOB_PROGRESS_ANNOTATION", "").strip() or DEFAULT_ANNOTATION,
            token_path=access.token_path,
            ca_path=access.ca_path,
            min_interval=min_interval,
            timeout=timeout,
        )
        log.info(
            "progress reports go to the annotation %s of pod %s/%s", reporter.annotation, namespace, pod_name
        )
        return reporter

    @classmethod
    def _disabled_logged(cls, reason: str) -> Reporter:
        log.info("progress reporting is off: %s", reason)
        return cls.disabled(reason)

    @property
    def enabled(self) -> bool:
        return self._enabled

    @property
    def url(self) -> str:
        """The Pod this reporter patches."""
        return self._patcher.url

    @property
    def annotation(self) -> str:
        return self._patcher.annotation

    @property
    def reason(self) -> str:
        """Why the reporter is disabled, or where it reports to."""
        return self._reason

    @property
    def sent(self) -> int:
        """Reports the API accepted so far."""
        return self._sender.sent

    @property
    def failed(self) -> int:
        """Reports dropped because the API was unreachable or refused them."""
        return self._sender.failed

    def report(
        self,
        *,
        epoch: int | None = None,
        total_epochs: int | None = None,
        step: int | None = None,
        total_steps: int | None = None,
        metrics: Mapping[str, Any] | None = None,
        checkpoint: str | None = None,
        checkpoint_time: datetime | str | None = None,
    ) -> None:
        """Queues a report and returns at once; a report not yet sent is replaced by this one.

        epoch: completed epochs. metrics: numbers (floats, ints, numpy scalars, one-element tensors);
        anything else is left out. `successPolicy.metric` (default "accuracy") names the one the success
        policy watches; GPU_UTILIZATION ("gpu_utilization", percent) is the one the GPU alert and
        dashboard panel show. checkpoint: the newest complete checkpoint; it is repeated in every
        later report until a newer one is given, so a report replaced before it was sent cannot lose it.
        checkpoint_time defaults to the time a new checkpoint path is first reported.
        """
        if not self._enabled:
            return
        try:
            body = self._builder.build(
                epoch=epoch,
                total_epochs=total_epochs,
                step=step,
                total_steps=total_steps,
                metrics=metrics,
                checkpoint=checkpoint,
                checkpoint_time=checkpoint_time,
            )
            self._sender.put(body)
        except Exception as error:  # report() must never break training
            self._once.warning(f"report:{type(error).__name__}:{error}", "progress report dropped: %s", error)

    def tracking(
        self,
        *,
        mlflow_run_id: str | None = None,
        mlflow_experiment_id: str | None = None,
        error: str | None = None,
        wandb_run_id: str | None = None,
        wandb_run_url: str | None = None,
        wandb_mode: str | None = None,
    ) -> None:
        """Names the experiment-tracking run in every later report (the operator shows it in
        status.tracking, and an Event when it changes), and why the last call to the tracking server
        failed (`error`; None once one succeeds: training goes on either way). Sent with the next
        report(). A call naming W&B (`wandb_*`: its run's id, its page when online, its mode) sets
        or clears W&B's error, any other call MLflow's: each tracker's error stands until it clears it."""
        if self._enabled:
            wandb = {"runId": wandb_run_id, "url": wandb_run_url, "mode": wandb_mode}
            self._builder.set_tracking(
                mlflow_run_id=mlflow_run_id,
                mlflow_experiment_id=mlflow_experiment_id,
                error=error,
                wandb=wandb,
                tracker="wandb" if any(wandb.values()) else "mlflow",
            )

    def flush(self, timeout: float | None = None) -> bool:
        """Sends a pending report now (ignoring min_interval) and waits until nothing is pending or in
        flight. False if that took longer than `timeout` seconds."""
        if not self._enabled:
            return True
        return self._sender.flush(timeout)

    def close(self, timeout: float = 2 * DEFAULT_TIMEOUT) -> None:
        """Sends the last pending report (waiting at most `timeout` seconds) and stops the sender.

        Later reports are dropped. Called at interpreter exit for a reporter that was never closed.
        """
        if not self._enabled:
            return
        self._sender.close(timeout)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
