"""Being told to stop: what SIGTERM means in a TrainingJob's pod, and how long there is to act on it.

Kubernetes ends a pod (a preemption, an eviction, a node drain, the operator restarting or suspending
the gang, Kueue taking the job's admission back) by sending its containers SIGTERM, then SIGKILL once
the pod's grace period is over (terminationGracePeriodSeconds: 60 s unless the job's podTemplate says
otherwise; the operator passes it as TRAININGJOB_TERMINATION_GRACE_SECONDS). Whatever the trainer
saves and reports in between counts: the operator resumes the next attempt from the checkpoint rank 0
reported last (docs/progress.md, "When the pod is told to stop"). Python's default for SIGTERM is to
die at once; `stop_on_sigterm` turns it into a flag the training loop looks at between steps, so a
step is never cut in half and the checkpoint is consistent.

The package (trainingjob_progress/__init__.py) re-exports it: import it from there.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping
from types import FrameType
from typing import Final

from .base import log

GRACE_PERIOD_ENV: Final = "TRAININGJOB_TERMINATION_GRACE_SECONDS"
# What a process stopped by SIGTERM exits with (128 + 15), as a shell reports it; failurePolicy
# restartPolicy ExitCode retries it.
EXIT_TERMINATED: Final = 143


def grace_period_seconds(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between SIGTERM and SIGKILL for this pod (TRAININGJOB_TERMINATION_GRACE_SECONDS), None
    outside a TrainingJob's pod."""
    env = os.environ if environ is None else environ
    text = env.get(GRACE_PERIOD_ENV, "").strip()
    try:
        return float(text) if text else None
    except ValueError:
        return None


def stop_on_sigterm() -> threading.Event:
    """Installs a SIGTERM handler that only sets the returned Event (call it from the main thread);
    the training loop checks `is_set()` between steps, saves a checkpoint, reports it and exits with
    EXIT_TERMINATED. A second SIGTERM changes nothing; SIGKILL at the end of the grace period still
    ends the process wherever it is.

        stop = tp.stop_on_sigterm()
        for step in range(start, total):
            train_step(step)
            if stop.is_set():
                ...  # save, report, reporter.close()
                sys.exit(tp.EXIT_TERMINATED)
    """
    stop = threading.Event()

    def note(signum: int, _frame: FrameType | None) -> None:
        if not stop.is_set():
            grace = grace_period_seconds()
            within = f" (within the pod's {grace:g} s grace period)" if grace is not None else ""
            log.info("%s received: stopping after the current step%s", signal.Signals(signum).name, within)
        stop.set()

    signal.signal(signal.SIGTERM, note)
    return stop
