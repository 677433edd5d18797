"""The reference trainer's wait for rank 0's store before it joins the process group.

Why: torch's store client pauses about half a second before it tries a refused connection again, and
the ranks of a gang restarted in place start together, so rank 0 is often not listening yet when the
others first try; the trainer polls the port instead (torch_engine.wait_for_master).
"""

from __future__ import annotations

import socket
import threading

import pytest
from reference_trainer.torch_engine import wait_for_master


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_it_returns_once_rank_0_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    listening = threading.Event()
    accepted: list[bool] = []

    def rank_0() -> None:
        with socket.socket() as server:
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("127.0.0.1", port))
            server.listen()
            listening.set()
            server.settimeout(30)
            connection, _ = server.accept()
            connection.close()
            accepted.append(True)

    def first_try_refused() -> None:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()

    first_try_refused()
    thread = threading.Thread(target=rank_0)
    threading.Timer(0.1, thread.start).start()
    wait_for_master(30)
    assert listening.is_set()
    thread.join(30)
    assert accepted == [True]


def test_without_a_master_address_or_when_none_listens_it_leaves_it_to_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    wait_for_master(30)  # returns at once: nothing to wait for
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    wait_for_master(0.2)  # nobody listens: it gives up at its deadline, init_process_group reports
