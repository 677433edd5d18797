"""The reference trainer's Weights & Biases run: one run for the whole TrainingJob, kept on the checkpoint
claim when no W&B server is reachable.

Why: as with MLflow (tracking.py), a job that restarts must not scatter one training over several runs,
and training must never wait for, or fail because of, a tracking server. Rank 0 opens the W&B run with
an id the job keeps across its attempts (WANDB_RUN_ID when spec.env sets it, else the job's UID,
TRAININGJOB_UID) and `resume="allow"`, in project WANDB_PROJECT (entity WANDB_ENTITY), grouped and
named after the job, with the hyperparameters as its config. A later attempt opens the same id and logs
on from the step it resumed at; steps an earlier attempt logged already (after the checkpoint this one
resumed from) are not logged again, so a metric's history has each step once, in order. W&B's own
files go under WANDB_DIR, which the operator points at the checkpoint claim: in offline mode each
attempt's run directory (`wandb/offline-run-<time>-<id>`) stays there for `wandb sync`.

Mode: WANDB_MODE when spec.env sets it; else online with an API key (WANDB_API_KEY, from a Secret),
offline without one. An online run that cannot start (no server answers, the key is refused) is one
warning and the reason in the progress report (status.tracking.unavailable), and the attempt logs
offline instead. The `wandb` package is imported only when WANDB_PROJECT is set, and only by rank 0.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Final

import trainingjob_progress as progress

from .config import Config

log = logging.getLogger("train")

# How long wandb.init waits for the server before the attempt logs offline (wandb's default is 90 s);
# spec.env may set WANDB_INIT_TIMEOUT.
INIT_TIMEOUT_SECONDS: Final = 30.0
# Beside W&B's run directories: the id of the job's run and the last step any attempt logged into it.
STATE_FILE: Final = "trainingjob-run.json"


def run_mode(env: Mapping[str, str]) -> str:
    """WANDB_MODE as the user set it; else online with an API key, offline without."""
    configured = env.get("WANDB_MODE", "").strip()
    if configured:
        return configured
    return "online" if env.get("WANDB_API_KEY", "").strip() else "offline"


def run_id(env: Mapping[str, str]) -> str | None:
    """The id every attempt of the job opens: WANDB_RUN_ID, else the job's UID (None outside a job:
    W&B picks one, and a later attempt gets a run of its own)."""
    return env.get("WANDB_RUN_ID", "").strip() or env.get("TRAININGJOB_UID", "").strip() or None


def _seconds(text: str | None) -> float:
    try:
        value = float(text or INIT_TIMEOUT_SECONDS)
    except ValueError:
        return INIT_TIMEOUT_SECONDS
    return value if value > 0 else INIT_TIMEOUT_SECONDS


class WandbRun:
    """Rank 0's W&B run of the job. `start` opens (or resumes) it; `log_epoch` logs an epoch's metrics
    at its global step; `finish` ends it when training completed, and otherwise marks it preempted
    (resumable) with this attempt's data written. None of them raises."""

    def __init__(
        self, config: Config, reporter: progress.Reporter, env: Mapping[str, str], wandb: Any
    ) -> None:
        self.wandb = wandb
        self.config = config
        self.reporter = reporter
        self.mode = run_mode(env)
        self.id = run_id(env)
        self.name = env.get("TRAININGJOB_NAME", "").strip() or None
        self.project = env.get("WANDB_PROJECT", "").strip()
        self.entity = env.get("WANDB_ENTITY", "").strip() or None
        self.group = env.get("WANDB_RUN_GROUP", "").strip() or self.name
        self.hyperparameters = config.hyperparameters(env)
        self.directory = env.get("WANDB_DIR", "").strip() or None
        # W&B's settings from the job's environment, given to each run rather than read by wandb from
        # the process's (which it reads once per process).
        self.settings: dict[str, Any] = {
            "console": "off",
            "init_timeout": _seconds(env.get("WANDB_INIT_TIMEOUT")),
        }
        for name, setting in (("WANDB_BASE_URL", "base_url"), ("WANDB_API_KEY", "api_key")):
            if env.get(name, "").strip():
                self.settings[setting] = env[name].strip()
        self.run: Any = None
        self.last_step = -1  # the highest step any attempt logged into the run
        self.state_path: str | None = None
        self.failing: str | None = None

    @classmethod
    def from_env(cls, config: Config, reporter: progress.Reporter, env: Mapping[str, str]) -> WandbRun | None:
        """Rank 0's run when WANDB_PROJECT is set; None otherwise or when the package is missing."""
        if config.rank != 0 or not env.get("WANDB_PROJECT", "").strip():
            return None
        try:
            import wandb  # noqa: PLC0415 - only when tracking is asked for
        except ImportError:
            log.warning("WANDB_PROJECT is set but wandb is not installed in the image: not tracking")
            reporter.tracking(
                error="W&B: wandb is not installed in the trainer's image", wandb_mode=run_mode(env)
            )
            return None
        except Exception as error:  # a wandb that cannot load (a dependency at a version it refuses)
            message = f"W&B: cannot import wandb: {type(error).__name__}: {error}"[:500]
            log.warning("%s; not tracking", message)
            reporter.tracking(error=message, wandb_mode=run_mode(env))
            return None
        return cls(config, reporter, env, wandb)

    # ------------------------------------------------------------------------------------ the run

    def _init(self, mode: str) -> Any:
        return self.wandb.init(
            project=self.project,
            entity=self.entity,
            group=self.group,
            name=self.name,
            id=self.id,
            resume="allow" if self.id else None,
            config=self.hyperparameters,
            dir=self.directory,
            mode=mode,
            settings=self.wandb.Settings(**self.settings),
        )

    def start(self, step: int) -> None:
        try:
            self.run = self._init(self.mode)
        except Exception as error:
            self._failed(f"cannot start the {self.mode} run", error)
            if self.mode != "online":
                return
            try:  # the metrics stay in the run directory for `wandb sync`
                self.wandb.teardown()  # W&B's service still holds the run's id
                self.mode, self.run = "offline", self._init("offline")
            except Exception as again:
                self._failed("cannot start the run offline either", again)
                return
        self.state_path = os.path.join(os.path.dirname(str(self.run.settings.sync_dir)), STATE_FILE)
        self.last_step = self._logged_before()
        log.info(
            "W&B: %s run %s in project %s from step %d (files in %s)",
            self.mode,
            self.run.id,
            self.project,
            step,
            self.run.settings.sync_dir,
        )
        self._report()

    def _logged_before(self) -> int:
        """The last step an earlier attempt logged: from the state file beside the run directories
        (offline or online), or the resumed run's step counter (online)."""
        last = -1
        try:
            with open(str(self.state_path), encoding="utf-8") as file:
                state = json.load(file)
            if state.get("runId") == self.run.id:
                last = int(state.get("lastStep", -1))
        except (OSError, ValueError, TypeError, AttributeError):
            pass
        if getattr(self.run, "resumed", False):
            last = max(last, int(getattr(self.run, "step", 0)) - 1)
        return last

    def _remember(self) -> None:
        if self.state_path is None:
            return
        temporary = f"{self.state_path}.tmp"
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump({"runId": self.run.id, "lastStep": self.last_step}, file)
        os.replace(temporary, self.state_path)

    def _url(self) -> str | None:
        if self.mode != "online":
            return None
        try:
            url = self.run.url
        except Exception:
            return None
        return str(url) if url else None

    def _report(self) -> None:
        if self.failing is not None and self.mode == "online":
            log.info("W&B: the server answers again")
            self.failing = None
        self.reporter.tracking(
            wandb_run_id=str(self.run.id),
            wandb_run_url=self._url(),
            wandb_mode=self.mode,
            error=self.failing,
        )

    def _failed(self, what: str, error: Exception) -> None:
        first_line = str(error).splitlines()[0] if str(error) else ""
        message = f"W&B: {what}: {type(error).__name__}: {first_line}"[:500]
        if message != self.failing:
            log.warning("%s; training goes on", message)
        self.failing = message
        self.reporter.tracking(
            wandb_run_id=str(self.run.id) if self.run is not None else None,
            wandb_mode=self.mode,
            error=message,
        )

    # -------------------------------------------------------------------------------- logging

    def log_epoch(self, metrics: Mapping[str, float], *, epoch: int, step: int) -> None:
        """The epoch's metrics at global step `step` (and `epoch`), unless the run holds that step."""
        if self.run is None or step <= self.last_step:
            return
        try:
            self.run.log({**metrics, "epoch": epoch}, step=step)
            self.last_step = step
            self._remember()
        except Exception as error:
            self._failed("could not log metrics", error)

    def log_model(self, engine: object, *, epoch: int, step: int) -> None:
        return None

    def finish(self, *, completed: bool) -> None:
        """Ends the run, finished when training completed, preempted (to be resumed by the next
        attempt) when the attempt stops; then stops W&B's service, which writes out its files."""
        if self.run is None:
            return
        try:
            if completed:
                self.run.finish(exit_code=0)
            else:
                self.run.mark_preempting()
                self.run.finish(exit_code=1)
            self.wandb.teardown()
        except Exception as error:
            self._failed("could not end the run", error)
