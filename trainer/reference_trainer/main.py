"""The reference trainer's run from start to end: logging, the configuration, one process per local rank
or the training itself, and how it ends (exit status, the pod's termination message).

Why apart from the entry script: train.py at the top of the mount stays a few lines that the default
command, torchrun and the launcher of local ranks run; everything it does is here, importable and
checked like the rest of the package.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Final, NoReturn

import trainingjob_progress as progress

from .config import EXIT_CONFIG, EXIT_FAILED, EXIT_TERMINATED, Config, ConfigError, Terminated
from .engines import Engine, make_engine
from .launch import launch_local_ranks
from .loop import Stop, train
from .tracking import NO_TRACKING, Tracking, trackers

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
    tracking: Tracking = NO_TRACKING
    status = EXIT_FAILED
    try:
        engine = make_engine(config)
        log.info("training with %s (%s)", config.settings(), engine.framework)
        tracking = trackers(config, reporter, os.environ)
        status = train(config, engine, reporter, stop, tracking)
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
        tracking.finish(completed=status == 0)
        reporter.close()
        if engine is not None:
            try:
                engine.close(finished=status == 0)
            except Exception as error:
                log.warning("could not shut down cleanly: %s", error)


def end(status: int) -> NoReturn:
    """Ends the process with `status`. A run that did not succeed ends at once, its logs flushed: the
    interpreter's shutdown with torch loaded (its thread pools, the process group) takes about half a
    second, which the rest of the gang waits for before it can restart. Everything else the run wrote
    (checkpoints, the termination message, the last progress report) is closed by then."""
    if status == 0:
        sys.exit(0)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def main(entry_script: str) -> int:
    """One run of the trainer; `entry_script` is the script that started it (train.py), which the
    launcher runs again for every local rank. Returns the exit status."""
    configure_logging()
    try:
        config = Config.from_env(os.environ)
    except ConfigError as error:
        return fail(f"configuration error: {error}", EXIT_CONFIG)
    if config.local_world_size > 1 and not config.launched:
        return launch_local_ranks(config, entry_script)
    return run_process(config)
