"""The reference trainer's training loop: resume, train and evaluate each epoch, checkpoint, report.

Split out of train.py so that the loop reads as what the operator expects of training code
(docs/progress.md): a report after every epoch from rank 0, the newest checkpoint in it, and an exit
status that says whether to restart.
"""

from __future__ import annotations

import logging

import trainingjob_progress as progress
from trainer_checkpoints import resume_point, save_checkpoint, should_checkpoint
from trainer_config import EXIT_FAILED, Config
from trainer_engines import Engine

log = logging.getLogger("train")


def train(config: Config, engine: Engine, reporter: progress.Reporter) -> int:
    epoch, step, resumed = engine.resume(resume_point(config))
    if resumed is not None and config.resume_origin:
        resumed = config.resume_origin
    if resumed is not None:
        log.info(
            "resuming from epoch %d (checkpoint %s): %d of %d epochs left",
            epoch,
            resumed,
            max(config.epochs - epoch, 0),
            config.epochs,
        )
    reporter.report(
        epoch=min(epoch, config.epochs),
        total_epochs=config.epochs,
        step=step,
        total_steps=config.total_steps,
        checkpoint=resumed,
    )
    for index in range(epoch, config.epochs):
        loss = engine.train_epoch(index)
        accuracy = engine.evaluate()
        completed = index + 1
        step += config.steps_per_epoch
        saved = None
        if should_checkpoint(config, completed):
            saved = save_checkpoint(config, engine, epoch=completed, step=step)
        log.info(
            "epoch %d/%d: loss %.4f accuracy %.4f (step %d/%d)",
            completed,
            config.epochs,
            loss,
            accuracy,
            step,
            config.total_steps,
        )
        reporter.report(
            epoch=completed,
            total_epochs=config.epochs,
            step=step,
            total_steps=config.total_steps,
            metrics={"loss": loss, "accuracy": accuracy},
            checkpoint=saved,
        )
        if config.fail_at_epoch == completed:
            log.error("TRAIN_FAIL_AT_EPOCH=%d: failing on purpose after epoch %d", completed, completed)
            return EXIT_FAILED
    log.info("training finished: %d epochs, %d steps", config.epochs, step)
    return 0
