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

Standard library only, one file, Python 3.9 or later (training images bring their own Python): the
operator ships it next to the reference trainer in every job's ConfigMap (mounted at /etc/trainingjob),
and custom training code can import it from there or copy it.

    from trainingjob_progress import Reporter

    reporter = Reporter.from_env()  # a no-op outside a cluster and on every rank but 0
    for epoch in range(start, epochs):
        ...
        reporter.report(epoch=epoch + 1, total_epochs=epochs, metrics={"loss": loss, "accuracy": acc})
    reporter.close()  # sends the last report
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import re
import secrets
import shutil
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import Any, Final

__all__ = [
    "GPU_UTILIZATION",
    "Reporter",
    "atomic_checkpoint",
    "checkpoint_dir",
    "checkpoint_epoch",
    "checkpoint_path",
    "enforce_retention",
    "is_remote",
    "latest_checkpoint_dir",
    "list_checkpoints",
    "resolve_checkpoint",
    "resume_path",
]

DEFAULT_ANNOTATION: Final = "ml.example.com/progress"
# The metrics key for GPU utilisation in percent (0-100). The operator exports it per job as
# trainingjob_gpu_utilization_percent, which the TrainingJobLowGPUUtilization alert and the dashboard's
# GPU utilisation panel read; a job that does not report it has no such series. This helper does not
# measure it: read it in your code (e.g. torch.cuda.utilization(), or pynvml) and report it.
GPU_UTILIZATION: Final = "gpu_utilization"
SERVICE_ACCOUNT_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
# Local runs and tests only: where to report instead of the in-cluster API, and with which
# credentials. The API's base URL: https://host:port (e.g. the local control plane, as the local
# kubelet hack/local_kubelet.py sets it) or plain http:// (`kubectl proxy`, tests). The token file
# (re-read for every request, like the mounted one) and the CA bundle that verifies an https API
# replace the service-account directory's `token` and `ca.crt`. The TRAININGJOB_ prefix is reserved at
# admission, so a job's spec.env can never set them: inside a pod the reporter always talks to the
# in-cluster API with the pod's own service-account token.
API_URL_ENV: Final = "TRAININGJOB_PROGRESS_API_URL"
TOKEN_FILE_ENV: Final = "TRAININGJOB_PROGRESS_TOKEN_FILE"  # noqa: S105 - a variable name, not a secret
CA_FILE_ENV: Final = "TRAININGJOB_PROGRESS_CA_FILE"
# The operator copies a report into status at most every few seconds; sending more often only adds
# API traffic.
DEFAULT_MIN_INTERVAL: Final = 5.0
DEFAULT_TIMEOUT: Final = 5.0
MAX_METRICS: Final = 64
MAX_METRIC_NAME: Final = 63
MAX_DISTINCT_ERRORS: Final = 64
MAX_RESPONSE_BYTES: Final = 64 * 1024
CHECKPOINT_PREFIX: Final = "epoch-"
_CHECKPOINT_NAME: Final = re.compile(r"^epoch-(\d+)$")
# Training images bring their own Python, older than the operator's: this file runs on 3.9 and later.
_UTC: Final = timezone.utc  # noqa: UP017 - datetime.UTC is 3.11+

log = logging.getLogger("trainingjob_progress")


class _OnceLogger:
    """Logs each distinct message once: a trainer that cannot reach the API for hours reports every few
    seconds, and the same warning each time would bury its own logs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    def warning(self, key: str, message: str, *args: object) -> None:
        with self._lock:
            if key in self._seen or len(self._seen) >= MAX_DISTINCT_ERRORS:
                return
            self._seen.add(key)
        log.warning(message, *args)


_module_once = _OnceLogger()


# ---------------------------------------------------------------------------------------------------
# Progress reports


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(_UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _count(value: object) -> int | None:
    """A non-negative whole number, or None for anything else (bools, negatives, NaN, strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def _number(value: object) -> float | None:
    """A finite float from anything float() accepts (numbers, numpy scalars, one-element tensors)."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        return None
    return number if math.isfinite(number) else None


def _rank(environ: Mapping[str, str]) -> int:
    """This process's global rank: RANK (the operator sets it for a pod's first process, torchrun and the
    reference trainer for each process they start), else the operator's arithmetic from the replica
    index and LOCAL_RANK, else 0 for a plain single process."""
    if environ.get("RANK", "").strip():
        return int(environ["RANK"])
    index = int(environ.get("TRAININGJOB_REPLICA_INDEX", "").strip() or 0)
    local = int(environ.get("LOCAL_RANK", "").strip() or 0)
    processes = int(environ.get("LOCAL_WORLD_SIZE", "").strip() or 1)
    return index * processes + local


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _in_cluster_url(environ: Mapping[str, str]) -> str | None:
    host = environ.get("KUBERNETES_SERVICE_HOST", "").strip()
    port = environ.get("KUBERNETES_SERVICE_PORT", "").strip()
    if not host or not port:
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 service address
    return f"https://{host}:{port}"


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
        quote = urllib.parse.quote
        self._url = f"{api_url.rstrip('/')}/api/v1/namespaces/{quote(namespace, safe='')}/pods/" + quote(
            pod_name, safe=""
        )
        self._annotation = annotation
        self._token_path = token_path
        self._ca_path = ca_path
        self._min_interval = max(0.0, float(min_interval))
        self._timeout = float(timeout)
        self._enabled = True
        self._reason = f"reporting to pod {namespace}/{pod_name}"
        self._once = _OnceLogger()
        self._cond = threading.Condition()
        self._slot: dict[str, Any] | None = None
        self._in_flight = False
        self._urgent = False
        self._closing = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._last_start: float | None = None
        self._checkpoint: str | None = None
        self._checkpoint_time: str | None = None
        self._sent = 0
        self._failed = 0

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
            rank = _rank(env)
        except ValueError:
            return cls._disabled_logged(f"cannot tell this process's rank (RANK={env.get('RANK')!r})")
        if rank != 0:
            return cls._disabled_logged(f"rank {rank}: only rank 0 reports progress")
        override = env.get(API_URL_ENV, "").strip()
        api_url = override or _in_cluster_url(env)
        pod_name = env.get("POD_NAME", "").strip()
        namespace = env.get("TRAININGJOB_NAMESPACE", "").strip() or _read_text(
            f"{service_account_dir}/namespace"
        )
        if not api_url or not pod_name or not namespace:
            return cls._disabled_logged(
                "not running in a TrainingJob pod (no Kubernetes API address, POD_NAME or namespace)"
            )
        reporter = cls(
            api_url=api_url,
            namespace=namespace,
            pod_name=pod_name,
            annotation=env.get("TRAININGJOB_PROGRESS_ANNOTATION", "").strip() or DEFAULT_ANNOTATION,
            token_path=env.get(TOKEN_FILE_ENV, "").strip() or f"{service_account_dir}/token",
            ca_path=None
            if api_url.startswith("http://")
            else env.get(CA_FILE_ENV, "").strip() or f"{service_account_dir}/ca.crt",
            min_interval=min_interval,
            timeout=timeout,
        )
        log.info(
            "progress reports go to the annotation %s of pod %s/%s", reporter._annotation, namespace, pod_name
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
        return self._url

    @property
    def annotation(self) -> str:
        return self._annotation

    @property
    def reason(self) -> str:
        """Why the reporter is disabled, or where it reports to."""
        return self._reason

    @property
    def sent(self) -> int:
        """Reports the API accepted so far."""
        with self._cond:
            return self._sent

    @property
    def failed(self) -> int:
        """Reports dropped because the API was unreachable or refused them."""
        with self._cond:
            return self._failed

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
            body = self._body(
                epoch=epoch,
                total_epochs=total_epochs,
                step=step,
                total_steps=total_steps,
                metrics=metrics,
                checkpoint=checkpoint,
                checkpoint_time=checkpoint_time,
            )
            with self._cond:
                if self._closing:
                    self._once.warning("closed", "progress report after close() dropped")
                    return
                self._slot = body
                self._start_thread()
                self._cond.notify_all()
        except Exception as error:  # report() must never break training
            self._once.warning(f"report:{type(error).__name__}:{error}", "progress report dropped: %s", error)

    def flush(self, timeout: float | None = None) -> bool:
        """Sends a pending report now (ignoring min_interval) and waits until nothing is pending or in
        flight. False if that took longer than `timeout` seconds."""
        if not self._enabled:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._urgent = True
            self._cond.notify_all()
            while self._slot is not None or self._in_flight:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if self._thread is None or not self._thread.is_alive():
                    return False
                self._cond.wait(remaining)
            return True

    def close(self, timeout: float = 2 * DEFAULT_TIMEOUT) -> None:
        """Sends the last pending report (waiting at most `timeout` seconds) and stops the sender.

        Later reports are dropped. Called at interpreter exit for a reporter that was never closed.
        """
        if not self._enabled:
            return
        with self._cond:
            if self._closed:
                return
            self._closing = True
            self._urgent = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                self._once.warning("close", "the last progress report was not sent within %.0fs", timeout)
        with self._cond:
            self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------------

    def _body(
        self,
        *,
        epoch: int | None,
        total_epochs: int | None,
        step: int | None,
        total_steps: int | None,
        metrics: Mapping[str, Any] | None,
        checkpoint: str | None,
        checkpoint_time: datetime | str | None,
    ) -> dict[str, Any]:
        now = datetime.now(_UTC)
        report: dict[str, Any] = {}
        for key, value in (
            ("epoch", epoch),
            ("totalEpochs", total_epochs),
            ("step", step),
            ("totalSteps", total_steps),
        ):
            if value is None:
                continue
            count = _count(value)
            if count is None:
                self._once.warning(
                    f"field:{key}", "progress field %s=%r is not a count, left out", key, value
                )
            else:
                report[key] = count
        if metrics:
            report["metrics"] = self._metrics(metrics)
        with self._cond:
            if checkpoint and checkpoint != self._checkpoint:
                self._checkpoint = str(checkpoint)
                self._checkpoint_time = None
            if checkpoint and checkpoint_time is not None:
                self._checkpoint_time = (
                    _rfc3339(checkpoint_time) if isinstance(checkpoint_time, datetime) else checkpoint_time
                )
            if self._checkpoint is not None:
                if self._checkpoint_time is None:
                    self._checkpoint_time = _rfc3339(now)
                report["checkpoint"] = self._checkpoint
                report["checkpointTime"] = self._checkpoint_time
        report["time"] = _rfc3339(now)
        return report

    def _metrics(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        accepted: dict[str, float] = {}
        for name, value in metrics.items():
            number = _number(value)
            if not isinstance(name, str) or not name or number is None:
                self._once.warning(
                    f"metric:{name}", "metric %r=%r is not a finite number, left out", name, value
                )
                continue
            if len(accepted) >= MAX_METRICS:
                self._once.warning("metrics", "more than %d metrics: the rest are left out", MAX_METRICS)
                break
            accepted[name[:MAX_METRIC_NAME]] = number
        return accepted

    def _start_thread(self) -> None:
        # Called with the lock held.
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="trainingjob-progress", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._slot is None and not self._closing:
                    self._urgent = False
                    self._cond.notify_all()
                    self._cond.wait()
                if self._slot is None:
                    self._cond.notify_all()
                    return
                while not self._urgent and self._last_start is not None:
                    delay = self._last_start + self._min_interval - time.monotonic()
                    if delay <= 0:
                        break
                    self._cond.wait(delay)
                report, self._slot = self._slot, None
                self._in_flight = True
                self._last_start = time.monotonic()
            ok = self._send(report)
            with self._cond:
                self._in_flight = False
                if ok:
                    self._sent += 1
                else:
                    self._failed += 1
                self._cond.notify_all()

    def _send(self, report: Mapping[str, Any]) -> bool:
        try:
            text = json.dumps(report, sort_keys=True, separators=(",", ":"))
            body = json.dumps({"metadata": {"annotations": {self._annotation: text}}}).encode()
            request = urllib.request.Request(self._url, data=body, method="PATCH")  # noqa: S310 - the API's http(s) URL
            request.add_header("Content-Type", "application/merge-patch+json")
            request.add_header("Accept", "application/json")
            token = _read_text(self._token_path) if self._token_path else None
            if token:
                request.add_header("Authorization", f"Bearer {token}")
            elif self._token_path:
                self._once.warning(
                    "token", "no service-account token at %s: reporting unauthenticated", self._token_path
                )
            with self._opener().open(request, timeout=self._timeout) as response:
                response.read(MAX_RESPONSE_BYTES)
            return True
        except urllib.error.HTTPError as error:
            detail = _status_message(error)
            self._once.warning(
                f"http:{error.code}:{detail}",
                "progress report refused by the Kubernetes API (HTTP %d): %s; dropped",
                error.code,
                detail,
            )
        except Exception as error:
            reason = getattr(error, "reason", error)
            self._once.warning(
                f"transport:{type(reason).__name__}:{reason}",
                "progress report could not reach the Kubernetes API (%s): %s; dropped",
                type(reason).__name__,
                reason,
            )
        return False

    def _opener(self) -> urllib.request.OpenerDirector:
        # No proxies: HTTPS_PROXY in a training image must not reroute calls to the in-cluster API.
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if self._url.startswith("https://"):
            # Re-created for every request, like the token: ca.crt can be rotated too.
            context = ssl.create_default_context(cafile=self._ca_path)
            handlers.append(urllib.request.HTTPSHandler(context=context))
        return urllib.request.build_opener(*handlers)


def _status_message(error: urllib.error.HTTPError) -> str:
    """The message of a metav1.Status answer, else the HTTP reason."""
    try:
        status = json.loads(error.read(MAX_RESPONSE_BYTES) or b"{}")
    except (OSError, ValueError):
        status = {}
    message = status.get("message") if isinstance(status, dict) else None
    return str(message or error.reason)[:300]


# ---------------------------------------------------------------------------------------------------
# Checkpoints


def is_remote(path: str) -> bool:
    """True for object-store URLs (s3://, gs://, ...), which the helpers below do not touch."""
    return "://" in path


def checkpoint_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """CHECKPOINT_DIR, or None when checkpointing is off."""
    env = os.environ if environ is None else environ
    return env.get("CHECKPOINT_DIR", "").strip() or None


def resume_path(environ: Mapping[str, str] | None = None) -> str | None:
    """RESUME_FROM, or None: the checkpoint to start from, decided by the operator (spec.checkpoint.
    resumeFrom on the first start, the latest checkpoint the job reported after a restart)."""
    env = os.environ if environ is None else environ
    return env.get("RESUME_FROM", "").strip() or None


def _directory(directory: str | None) -> str:
    resolved = directory or checkpoint_dir()
    if not resolved:
        raise ValueError("no checkpoint directory: CHECKPOINT_DIR is not set (spec.checkpoint.enabled)")
    return resolved


def checkpoint_path(epoch: int, directory: str | None = None) -> str:
    """Where the checkpoint after `epoch` completed epochs lives: <directory>/epoch-<epoch>.

    directory defaults to CHECKPOINT_DIR; object-store URLs are joined with "/".
    """
    if _count(epoch) is None:
        raise ValueError(f"epoch must be a non-negative integer, not {epoch!r}")
    base = _directory(directory)
    if is_remote(base):
        return f"{base.rstrip('/')}/{CHECKPOINT_PREFIX}{int(epoch)}"
    return os.path.join(base, f"{CHECKPOINT_PREFIX}{int(epoch)}")


def checkpoint_epoch(path: str) -> int | None:
    """The epoch of a checkpoint path named epoch-<N>, else None."""
    match = _CHECKPOINT_NAME.match(os.path.basename(path.rstrip("/")))
    return int(match.group(1)) if match else None


def list_checkpoints(directory: str | None = None) -> list[tuple[int, str]]:
    """(epoch, path) of every checkpoint directory epoch-<N> in a local directory, oldest first.

    Empty for object-store URLs and for a directory that does not exist.
    """
    base = _directory(directory)
    if is_remote(base):
        return []
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(base) as entries:
            for entry in entries:
                epoch = checkpoint_epoch(entry.name)
                if epoch is not None and entry.is_dir(follow_symlinks=False):
                    found.append((epoch, entry.path))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(found)


def latest_checkpoint_dir(directory: str | None = None) -> str | None:
    """The newest checkpoint directory (highest epoch) in a local directory, or None."""
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1][1] if checkpoints else None


def resolve_checkpoint(path: str) -> str:
    """A checkpoint to load from RESUME_FROM: a local directory holding epoch-<N> checkpoints resolves
    to the newest of them; anything else (a checkpoint directory, a file, a URL) is returned as is."""
    if is_remote(path) or not os.path.isdir(path) or checkpoint_epoch(path) is not None:
        return path
    return latest_checkpoint_dir(path) or path


def _fsync(path: str, *, directory: bool) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        descriptor = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems (and some NFS setups) refuse fsync on directories
    finally:
        os.close(descriptor)


def _fsync_tree(root: str) -> None:
    for parent, _dirs, files in os.walk(root):
        for name in files:
            _fsync(os.path.join(parent, name), directory=False)
        _fsync(parent, directory=True)


@contextlib.contextmanager
def atomic_checkpoint(epoch: int, directory: str | None = None) -> Iterator[str]:
    """Yields an empty temporary directory next to checkpoint_path(epoch); when the block succeeds its
    files are flushed to disk and it is renamed to checkpoint_path(epoch) (replacing an older one of
    the same epoch), so a checkpoint directory is always complete. On error it is removed.

        with atomic_checkpoint(epoch) as tmp:
            torch.save(state, os.path.join(tmp, "model.pt"))
    """
    final = checkpoint_path(epoch, directory)
    if is_remote(final):
        raise ValueError(f"atomic_checkpoint writes local directories only, not {final}")
    parent, name = os.path.split(final)
    os.makedirs(parent, exist_ok=True)
    temporary = os.path.join(parent, f".{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    os.mkdir(temporary)  # not mkdtemp: its 0700 mode would hide the checkpoint from other users
    try:
        yield temporary
        _fsync_tree(temporary)
        if os.path.lexists(final):
            previous = os.path.join(parent, f".{name}.old-{os.getpid()}-{secrets.token_hex(4)}")
            os.rename(final, previous)
            os.rename(temporary, final)
            shutil.rmtree(previous, ignore_errors=True)
        else:
            os.rename(temporary, final)
        _fsync(parent, directory=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _retention_from_env() -> int | None:
    text = os.environ.get("CHECKPOINT_RETENTION", "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        _module_once.warning("retention-env", "CHECKPOINT_RETENTION=%r is not a number: keeping all", text)
        return None


def enforce_retention(directory: str | None = None, keep: int | None = None) -> list[str]:
    """Deletes the oldest checkpoint directories (epoch-<N>) beyond the newest `keep`; returns the
    deleted paths, oldest first.

    directory defaults to CHECKPOINT_DIR and keep to CHECKPOINT_RETENTION (nothing is deleted when it
    is unset). Only epoch-<N> directories are touched. Object-store URLs are left alone: use the
    bucket's lifecycle rules or your own code there. A directory that cannot be deleted is logged and
    skipped.
    """
    base = directory or checkpoint_dir()
    if not base:
        return []
    if is_remote(base):
        _module_once.warning(
            f"remote:{base}",
            "checkpoint retention is not enforced for %s: use the storage's lifecycle rules",
            base,
        )
        return []
    limit = _retention_from_env() if keep is None else keep
    if limit is None:
        return []
    if isinstance(limit, bool) or limit < 1:
        raise ValueError(f"keep must be at least 1, not {limit!r}")
    deleted: list[str] = []
    for _epoch, path in list_checkpoints(base)[:-limit]:
        try:
            shutil.rmtree(path)
        except OSError as error:
            _module_once.warning(f"retention:{path}", "could not delete old checkpoint %s: %s", path, error)
            continue
        deleted.append(path)
        log.info("deleted old checkpoint %s (retention %d)", path, limit)
    return deleted
