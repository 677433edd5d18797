"""Waiting for another pod of the job to have an address, for frameworks that look a name up once.

A TrainingJob's pods start together, and the job's Services give a pod its DNS name as soon as the pod
has an IP (docs/env.md, "Names"). A pod may still start before rank 0 has one: the name then does not
resolve yet (NXDOMAIN), for a second or two. torch's rendezvous, JAX's coordinator client and
`paddle.distributed.launch` retry a failed lookup until their timeout; xgboost's collective (and any
code that calls `socket.getaddrinfo` once) fails at once. `wait_for_name` is the retry those need:

    tp.wait_for_name(os.environ["MASTER_ADDR"])  # before joining xgboost's tracker

The package (trainingjob_progress/__init__.py) re-exports it: import it from there.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Final

from .base import log

# Long enough for a pod that waits for its node, its image or a gang scheduler's other members.
DEFAULT_NAME_TIMEOUT: Final = 600.0


def wait_for_name(
    host: str,
    timeout: float = DEFAULT_NAME_TIMEOUT,
    *,
    interval: float = 0.5,
    resolve: Callable[[str], object] = socket.gethostbyname,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Returns once `host` resolves; retries a failed lookup every `interval` seconds, and raises
    TimeoutError naming the host after `timeout` seconds without an answer."""
    deadline = clock() + timeout
    logged = False
    while True:
        try:
            resolve(host)
            return
        except OSError as error:
            if clock() >= deadline:
                raise TimeoutError(f"{host} did not resolve within {timeout:g} s: {error}") from error
            if not logged:
                log.info("waiting for %s to resolve (%s)", host, error)
                logged = True
        sleep(interval)
