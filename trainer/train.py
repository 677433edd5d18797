"""The reference trainer: what a TrainingJob runs when spec.command is not set.

Why it exists: it shows, in one self-contained file, everything the operator expects of training code
(docs/env.md, docs/progress.md) and lets a job be tried without writing any: it joins the job's
torch.distributed rendezvous from the injected environment, trains a small classifier on synthetic
data with gradients all-reduced across every process (DistributedDataParallel), reports progress from
rank 0, writes a checkpoint every CHECKPOINT_FREQUENCY epochs and after the last one (keeping
CHECKPOINT_RETENTION of them) and, after a restart, continues from RESUME_FROM instead of starting over.
In an elastic job (TRAININGJOB_MAX_WORKERS is set; torchrun starts the processes) it continues from the
newest checkpoint under CHECKPOINT_DIR instead: torchrun starts the processes of a pod again after every
change of the world, and the pod's RESUME_FROM is only as recent as the pod.

The operator ships this file in the namespace's trainer ConfigMap together with the modules it imports
from its own directory, mounted at /etc/trainingjob: the progress helper (trainingjob_progress*.py)
and the trainer's parts, trainer_config.py (the environment read into a Config), trainer_checkpoints.py,
trainer_engines.py and trainer_torch.py (the simulation and torch), trainer_loop.py (the epochs) and
trainer_launch.py (one process per local rank). This file is the entry point: logging, signals, exit
status and the termination message.

- torch importable: real training. Backend from TORCH_DISTRIBUTED_BACKEND (default gloo;
  nccl falls back to gloo without a GPU), init_method env:// (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
  RANK). With LOCAL_WORLD_SIZE > 1 and no launcher (torchrun sets LOCAL_RANK) it starts one process per
  local rank itself, with RANK = RANK + local rank.
- torch not importable (e.g. the jax default image): a pure-Python simulation of the same loop
  (logistic regression, no gradient exchange between ranks) so the job still trains, checkpoints,
  resumes and reports progress. It says so in its log.

Knobs besides the operator's variables (set them in spec.env): TRAIN_STEPS_PER_EPOCH (20),
TRAIN_STEP_SECONDS (0: extra time per step, to watch progress in a demo), TRAIN_SAVE_SECONDS (0: extra
time each checkpoint takes to write, to see a save outlast the grace period), TRAIN_SEED (0),
TRAIN_FAIL_AT_EPOCH (exit 1 right after completing that epoch, unless this run resumed past it: tests
restarts), TRAIN_SIMULATE=1 (the simulation even with torch), TRAIN_PROGRESS_INTERVAL (seconds between
progress reports, default 5), TRAIN_DIST_TIMEOUT (seconds to wait for peers, default 1800).

SIGTERM (the pod is being deleted: docs/progress.md, "When the pod is told to stop"): before training
starts, the run ends at once; while it trains, every rank finishes the step it is in, they agree on it,
rank 0 saves a checkpoint of that step (epoch-<E>-step-<S>) and reports it, and every rank exits 143.
The next attempt resumes at that step.

Standard library besides torch, Python 3.9 or later. Exit status: 0 done, 1 training failed, 2 bad
configuration, 143 terminated (SIGTERM).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Final

# The progress helper and the trainer's parts live next to this file (all from the trainer ConfigMap).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import trainingjob_progress as progress  # noqa: E402
from trainer_config import EXIT_CONFIG, EXIT_FAILED, EXIT_TERMINATED, Config, ConfigError, Terminated  # noqa: E402
from trainer_engines import Engine, make_engine  # noqa: E402
from trainer_launch import launch_local_ranks  # noqa: E402
from trainer_loop import Stop, train  # noqa: E402

TERMINATION_LOG: Final = "/dev/termination-log"

log = logging.getLogger("train")


# ---------------------------------------------------------------------------------------------------
# Entry point


def configure_logging() -> None:
    rank = os.environ.get("RANK", "0").strip() or "0"
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank={rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def termination_message(message: str) -> None:
    """Also writes the reason into the pod's termination message (status.containerStatuses) when the
    kubelet provides the file; the operator shows it in the job's conditions."""
    if os.path.isfile(TERMINATION_LOG):
        try:
            with open(TERMINATION_LOG, "w", encoding="utf-8") as handle:
                handle.write(message[:4000])
        except OSError:
            pass


def fail(message: str, status: int) -> int:
    log.error("%s", message)
    termination_message(message)
    return status


def run_process(config: Config) -> int:
    stop = Stop()
    stop.install()
    reporter = progress.Reporter.from_env(min_interval=config.progress_interval)
    engine: Engine | None = None
    status = EXIT_FAILED
    try:
        engine = make_engine(config)
        status = train(config, engine, reporter, stop)
        if status == EXIT_TERMINATED:
            return fail(
                "terminated by SIGTERM: stopped after a step, its checkpoint saved and reported",
                status,
            )
        if status != 0:
            return fail(f"training failed on purpose after epoch {config.fail_at_epoch}", status)
        return status
    except ConfigError as error:
        return fail(f"configuration error: {error}", EXIT_CONFIG)
    except Terminated as signal_name:
        return fail(f"terminated by {signal_name}: stopping", EXIT_TERMINATED)
    except Exception as error:
        log.exception("training failed")
        return fail(f"training failed: {type(error).__name__}: {error}", EXIT_FAILED)
    finally:
        reporter.close()
        if engine is not None:
            try:
                engine.close(finished=status == 0)
            except Exception as error:
                log.warning("could not shut down cleanly: %s", error)


def main() -> int:
    configure_logging()
    try:
        config = Config.from_env(os.environ)
    except ConfigError as error:
        return fail(f"configuration error: {error}", EXIT_CONFIG)
    if config.local_world_size > 1 and not config.launched:
        return launch_local_ranks(config, os.path.abspath(__file__))
    return run_process(config)


if __name__ == "__main__":
    sys.exit(main())
