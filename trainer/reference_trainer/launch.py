"""The reference trainer's own launcher: one process per local rank when nobody else starts them
(LOCAL_WORLD_SIZE > 1 without torchrun).

A module of its own: process supervision (signals passed on, a failed rank stopping its peers after a
grace period) is a concern of its own. It starts the entry script it is given (train.py at the top of
the mount) again, once per local rank.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from types import FrameType
from typing import Final

import trainingjob_progress as progress

from .config import Config
from .engines import why_simulate

KILL_GRACE_SECONDS: Final = 30.0

log = logging.getLogger("train")


# After one local rank fails, how long the others may take to end by themselves (they often fail the same
# way at the same moment, and their own messages say more than a SIGTERM) before they are stopped.
PEER_GRACE_SECONDS: Final = 10


def launch_local_ranks(config: Config, script: str) -> int:
    """Starts LOCAL_WORLD_SIZE copies of `script` with RANK = RANK + local rank and LOCAL_RANK set, and
    waits for them. When one fails the others are stopped after PEER_GRACE_SECONDS (they would wait for it
    forever); SIGTERM and SIGINT are passed on."""
    count = config.local_world_size
    log.info(
        "LOCAL_WORLD_SIZE=%d: starting one process per local rank (ranks %d-%d of %d)",
        count,
        config.rank,
        config.rank + count - 1,
        config.world_size,
    )
    shared: dict[str, str] = {}
    private: str | None = None
    if config.resume_from and not progress.is_remote(config.resume_from):
        # Every local rank must start from the same checkpoint: resolve a directory of checkpoints once,
        # before rank 0 can add a newer one (or delete this one) to it.
        resolved = progress.resolve_checkpoint(config.resume_from)
        shared["RESUME_FROM"] = resolved
        if why_simulate(config) is not None:
            # The simulation has no collective: every rank reads the checkpoint itself, and rank 0 may
            # save the next one and prune this one (CHECKPOINT_RETENTION) before the others have read
            # it. They read a private copy instead (torch ranks get the state from rank 0).
            private = tempfile.mkdtemp(prefix="trainingjob-resume-")
            copy = os.path.join(private, os.path.basename(resolved.rstrip("/")))
            shutil.copytree(resolved, copy)
            shared.update(RESUME_FROM=copy, TRAIN_RESUME_ORIGIN=resolved)
    children: list[subprocess.Popen[bytes]] = []
    for local in range(count):
        env = dict(os.environ, **shared)
        env.update(RANK=str(config.rank + local), LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(count))
        children.append(subprocess.Popen([sys.executable, script, *sys.argv[1:]], env=env))

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    finished: queue.Queue[tuple[int, int]] = queue.Queue()
    for local, child in enumerate(children):
        threading.Thread(
            target=lambda local=local, child=child: finished.put((local, child.wait())), daemon=True
        ).start()
    status = 0
    remaining = len(children)
    stop_at: float | None = None
    while remaining:
        try:
            local, code = finished.get(
                timeout=None if stop_at is None else max(0.0, stop_at - time.monotonic())
            )
        except queue.Empty:
            log.error("stopping the other local ranks")
            stop_children(children)
            stop_at = None
            continue
        remaining -= 1
        if code != 0 and status == 0:
            status = code if code > 0 else 128 - code
            log.error(
                "local rank %d exited with status %d: the other local ranks get %d s to end on their own",
                local,
                code,
                PEER_GRACE_SECONDS,
            )
            stop_at = time.monotonic() + PEER_GRACE_SECONDS
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)
    return status


def stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()

    def kill() -> None:
        for child in children:
            if child.poll() is None:
                child.kill()

    timer = threading.Timer(KILL_GRACE_SECONDS, kill)
    timer.daemon = True
    timer.start()
