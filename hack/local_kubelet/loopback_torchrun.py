"""torchrun as the local kubelet runs it: the same launcher, every store it starts listening on 127.0.0.1.

Why: torchrun's agent hosts the c10d rendezvous store when it is the rendezvous host, and the process
of rank 0 hosts the store its round shares (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which elastic
TrainingJobs get). A TCPStore server listens on every interface; the local kubelet runs pods as
processes on this machine, where nothing may listen beyond 127.0.0.1. This wrapper hands every store
server a socket bound to 127.0.0.1 (TCPStore's `master_listen_fd`, which the store then owns) and
changes nothing else:

    python loopback_torchrun.py [torchrun's arguments]          the agent: torch.distributed.run
    python -u loopback_torchrun.py --worker SCRIPT [ARGS]       a process the agent starts: SCRIPT

The agent runs torch.distributed.run with the arguments it was given; the processes it starts for a
script run this file first (in worker mode), which runs the script as `python -u SCRIPT ARGS` would.
Standard library and torch only: the local kubelet starts it from this file's path with the
interpreter it runs trainers with.
"""

from __future__ import annotations

import importlib
import os
import runpy
import socket
import sys
from collections.abc import Callable
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0]) == _HERE:
    del sys.path[0]  # this directory's modules must not shadow any the launcher imports

import torch.distributed as dist  # noqa: E402
from torch.distributed import run  # noqa: E402
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend  # noqa: E402

LOOPBACK = "127.0.0.1"
BACKLOG = 256
WORKER = "--worker"
# TCPStore's parameters after is_master, in order; master_listen_fd is the fourth of them.
LISTEN_FD_POSITION = 3


class LoopbackTCPStore(dist.TCPStore):  # type: ignore[misc]
    """A TCPStore whose server, when this process hosts one, listens on 127.0.0.1 only."""

    def __init__(
        self,
        host_name: str,
        port: int,
        world_size: int | None = None,
        is_master: bool = False,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        given = len(args) > LISTEN_FD_POSITION or kwargs.get("master_listen_fd") is not None
        if is_master and not given:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((LOOPBACK, port))
            listener.listen(BACKLOG)
            port = listener.getsockname()[1]
            kwargs["master_listen_fd"] = listener.detach()
        super().__init__(host_name, port, world_size, is_master, *args, **kwargs)


def use_loopback_stores() -> None:
    """Every module that creates a TCPStore server in an agent or a training process gets this one."""
    # init_process_group's env:// and tcp:// stores come from torch.distributed.rendezvous, the module
    # (the package's attribute of that name is a function).
    plain = importlib.import_module("torch.distributed.rendezvous")
    for module in (dist, c10d_rendezvous_backend, plain):
        module.__dict__["TCPStore"] = LoopbackTCPStore


def through_this_file(config_from_args: Callable[..., Any]) -> Callable[..., Any]:
    """torchrun's command for its processes, with this file (worker mode) before a python script."""

    def config(args: Any) -> Any:
        launch, command, arguments = config_from_args(args)
        python = os.getenv("PYTHON_EXEC", sys.executable)
        if command == python and arguments[:1] == ["-u"] and arguments[1:2] != ["-m"]:
            arguments = ["-u", os.path.abspath(__file__), WORKER, *arguments[1:]]
        return launch, command, arguments

    return config


def run_worker(script: str, arguments: list[str]) -> None:
    sys.argv = [script, *arguments]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    use_loopback_stores()
    if sys.argv[1:2] == [WORKER]:
        run_worker(sys.argv[2], sys.argv[3:])
        return
    run.config_from_args = through_this_file(run.config_from_args)
    sys.argv[0] = "torchrun"
    run.main()


if __name__ == "__main__":
    main()
