"""hack/local_kubelet/loopback_torchrun.py: the stores torchrun starts listen on 127.0.0.1 only, and the
processes it starts for a script run through the same file first.

Real torch (the train extra): a TCPStore server is created the ways torchrun's agent and
init_process_group create one, and its socket is read back from /proc.
"""

from __future__ import annotations

import datetime
import os
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from tests.hack.clusters import listening_addresses

pytest.importorskip("torch.distributed", reason="needs the train extra: pip install -e .[train]")

from hack.local_kubelet import loopback_torchrun


def test_a_store_this_process_hosts_listens_on_the_loopback_only() -> None:
    before = listening_addresses(os.getpid())
    store = loopback_torchrun.LoopbackTCPStore(
        "127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=30), multi_tenant=True
    )
    store.set("key", "value")
    assert store.get("key") == b"value"
    hosted = listening_addresses(os.getpid()) - before
    assert hosted == {("127.0.0.1", store.port)}
    client = loopback_torchrun.LoopbackTCPStore("127.0.0.1", store.port, None, False)
    assert client.get("key") == b"value"
    assert listening_addresses(os.getpid()) - before == hosted  # a client listens nowhere


def test_every_module_that_starts_a_store_gets_the_loopback_one(monkeypatch: pytest.MonkeyPatch) -> None:
    dist = sys.modules["torch.distributed"]
    c10d_rendezvous_backend = sys.modules["torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"]
    plain = sys.modules["torch.distributed.rendezvous"]
    for module in (dist, c10d_rendezvous_backend, plain):
        monkeypatch.setattr(module, "TCPStore", module.TCPStore)  # restored afterwards
    loopback_torchrun.use_loopback_stores()
    assert dist.TCPStore is c10d_rendezvous_backend.TCPStore is plain.TCPStore
    assert plain.TCPStore is loopback_torchrun.LoopbackTCPStore


def test_torchruns_processes_run_a_script_through_this_file_first() -> None:
    def config_from_args(args: Any) -> tuple[str, str, list[str]]:
        return "config", sys.executable, list(args.arguments)

    config = loopback_torchrun.through_this_file(config_from_args)
    wrapper = os.path.abspath(loopback_torchrun.__file__)
    script = config(SimpleNamespace(arguments=["-u", "/code/train.py", "--lr", "1"]))
    assert script == ("config", sys.executable, ["-u", wrapper, "--worker", "/code/train.py", "--lr", "1"])
    # A module (-m) or a program of its own (--no-python) is left as torchrun would run it.
    module = config(SimpleNamespace(arguments=["-u", "-m", "pkg.train"]))
    assert module == ("config", sys.executable, ["-u", "-m", "pkg.train"])
