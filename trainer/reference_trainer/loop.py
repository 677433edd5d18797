"""The reference trainer's training loop: resume, train and evaluate each epoch, checkpoint, report, and
stop cleanly when told to.

A module of its own so that the loop reads as what the operator expects of training code
(docs/progress.md): a report after every epoch from rank 0, the newest checkpoint in it, an exit
status that says whether to restart, and on SIGTERM (a preemption, an eviction, a gang restart, a
suspension) a checkpoint of the step where the signal came, reported before the process exits 143, so
the next attempt continues from that step instead of from the last epoch's checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
from types import FrameType

import trainingjob_progress as progress

from .checkpoints import resume_point, save_checkpoint, should_checkpoint, writes_checkpoints
from .config import EXIT_FAILED, EXIT_TERMINATED, Config, FailedOnPurpose, Terminated
from .engines import Engine
from .tracking import NO_TRACKING, Tracking

log = logging.getLogger("train")


class Stop:
    """SIGTERM as the reference trainer takes it. Until the training loop runs (joining the rendezvous,
    loading the checkpoint) it ends the run at once (Terminated): nothing was trained to save. While
    the loop runs it is a request the loop acts on after the current step: every rank agrees on that
    step (Engine.agree_to_stop), rank 0 saves it and reports it, and every rank exits 143."""

    def __init__(self) -> None:
        self.requested = False
        self.in_loop = False
        # Global steps completed so far (the loop keeps it up to date): the signal comes during the next.
        self.step = 0

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self.in_loop:
            raise Terminated(name)
        if not self.requested:
            grace = progress.grace_period_seconds()
            within = f"; the pod's grace period is {grace:g} s" if grace is not None else ""
            log.info(
                "%s received during step %d: stopping after it, with a checkpoint of it%s",
                name,
                self.step + 1,
                within,
            )
        self.requested = True


def train(
    config: Config,
    engine: Engine,
    reporter: progress.Reporter,
    stop: Stop | None = None,
    tracking: Tracking = NO_TRACKING,
) -> int:
    stop = stop or Stop()
    epoch, step, resumed = engine.resume(resume_point(config))
    tracking.start(step)
    if resumed is not None and config.resume_origin:
        resumed = config.resume_origin
    if resumed is not None:
        _log_resume(config, epoch, step, resumed)
    reporter.report(
        epoch=min(epoch, config.epochs),
        total_epochs=config.epochs,
        step=step,
        total_steps=config.total_steps,
        checkpoint=resumed,
    )
    stop.in_loop, stop.step = True, step
    start = step
    for index in range(epoch, config.epochs):
        # A run resumed from a checkpoint saved mid-epoch continues that epoch at the step after it.
        first = _step_within(config, index, step) if index == epoch else 0
        total, done = 0.0, 0
        for position in range(first, config.steps_per_epoch):
            try:
                total += engine.train_step(index, position)
                step += 1
                done += 1
                stop.step = step
                stopping = engine.agree_to_stop(stop.requested)
            except Exception:
                if not stop.requested:
                    raise
                # A peer stopped without waiting (its pod went first): the state after the last
                # completed step is still whole here.
                log.warning("a peer left while stopping: saving the %d completed steps", step, exc_info=True)
                stopping = True
            if config.fail_file and _appeared(config.fail_file):
                raise FailedOnPurpose(f"TRAIN_FAIL_FILE {config.fail_file} appeared during step {step}")
            if stopping:
                return _stop_here(config, engine, reporter, epoch=index, step=step, trained=step > start)
        # An epoch whose every step was trained before a stop has no loss of its own in this run.
        metrics = {"loss": engine.epoch_loss(total, done)} if done else {}
        metrics["accuracy"] = engine.evaluate()
        completed = index + 1
        saved = None
        if should_checkpoint(config, completed):
            saved = save_checkpoint(config, engine, epoch=completed, step=step)
        log.info(
            "epoch %d/%d: %s (step %d/%d)",
            completed,
            config.epochs,
            " ".join(f"{name} {value:.4f}" for name, value in metrics.items()),
            step,
            config.total_steps,
        )
        reporter.report(
            epoch=completed,
            total_epochs=config.epochs,
            step=step,
            total_steps=config.total_steps,
            metrics=metrics,
            checkpoint=saved,
        )
        tracking.log_epoch(metrics, epoch=completed, step=step)
        if config.fail_at_epoch == completed:
            log.error("TRAIN_FAIL_AT_EPOCH=%d: failing on purpose after epoch %d", completed, completed)
            return EXIT_FAILED
    log.info("training finished: %d epochs, %d steps", config.epochs, step)
    tracking.log_model(engine, epoch=config.epochs, step=step)
    return 0


def _appeared(path: str) -> bool:
    """Whether the file at `path` exists, removing it: it fails this run only, not the next one."""
    try:
        os.remove(path)
    except FileNotFoundError:
        return False
    return True


def _step_within(config: Config, epoch: int, step: int) -> int:
    """Where global step `step` is within epoch `epoch` (0-based), clamped to the epoch."""
    return min(max(step - epoch * config.steps_per_epoch, 0), config.steps_per_epoch)


def _log_resume(config: Config, epoch: int, step: int, resumed: str) -> None:
    """One line, the same for every checkpoint (log readers match it); a checkpoint saved mid-epoch
    adds the step the run continues at."""
    within = ""
    if step > epoch * config.steps_per_epoch:
        within = f", at step {step} of {config.total_steps}"
    log.info(
        "resuming from epoch %d (checkpoint %s): %d of %d epochs left%s",
        epoch,
        resumed,
        max(config.epochs - epoch, 0),
        config.epochs,
        within,
    )


def _stop_here(
    config: Config, engine: Engine, reporter: progress.Reporter, *, epoch: int, step: int, trained: bool
) -> int:
    """Told to stop after global step `step` (of epoch `epoch` + 1): rank 0 saves that state, whole,
    reports it and waits until the report is sent; every rank then exits 143. Nothing trained since the
    run began: nothing to save."""
    log.info("stopping at step %d of %d (epoch %d/%d)", step, config.total_steps, epoch + 1, config.epochs)
    saved = None
    if trained and writes_checkpoints(config):
        saved = save_checkpoint(config, engine, epoch=epoch, step=step, mid_epoch=True)
    reporter.report(
        epoch=epoch, total_epochs=config.epochs, step=step, total_steps=config.total_steps, checkpoint=saved
    )
    if not reporter.flush(progress.DEFAULT_TIMEOUT):
        log.warning("the progress report of step %d may not have reached the API server", step)
    return EXIT_TERMINATED
