"""Runs a JAX program with its cross-process (gloo) collectives on 127.0.0.1: `python jax_loopback.py
PROGRAM [ARGS]`.

Why: JAX's CPU collectives bind their sockets to the address this machine's host name resolves to,
with no setting to choose another; tests listen on 127.0.0.1 only. This wrapper gives JAX's gloo
collectives the host name 127.0.0.1, then runs the program as `python PROGRAM` would. The program itself
is unchanged (the example's, as a pod runs it); the coordinator's own address is JAX's setting
JAX_COORDINATOR_BIND_ADDRESS, which the test sets.
"""

from __future__ import annotations

import functools
import runpy
import sys

from jax._src.lib import _jax

_jax.make_gloo_tcp_collectives = functools.partial(_jax.make_gloo_tcp_collectives, hostname="127.0.0.1")

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
