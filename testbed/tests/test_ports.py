"""testbed/common.py's ports for listeners: below the kernel's ephemeral range, where no outgoing
connection takes a port between the choice and the bind, distinct, and free."""

from __future__ import annotations

import random
import socket

from testbed.common import LISTEN_PORTS_FROM, free_ports, listening_port_range


def test_the_range_ends_where_the_kernels_ephemeral_range_begins() -> None:
    assert listening_port_range("32768\t60999\n") == range(LISTEN_PORTS_FROM, 32768)
    assert listening_port_range("49152 65535") == range(LISTEN_PORTS_FROM, 49152)
    assert listening_port_range("not a range") == range(LISTEN_PORTS_FROM, 32768)  # Linux's default
    assert len(listening_port_range("1024 65535")) == 0  # no room: the kernel chooses


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(port in listening_port_range() for port in ports), ports
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_a_seeded_random_does_not_make_two_choices_alike() -> None:
    kept = random.getstate()
    try:
        random.seed(7)
        first = free_ports(6)
        random.seed(7)
        assert free_ports(6) != first
    finally:
        random.setstate(kept)


def test_a_port_someone_listens_on_is_not_chosen() -> None:
    candidates = listening_port_range()
    held = []
    try:
        for port in range(candidates.start, candidates.start + 200):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            sock.listen()
            held.append(sock)
        taken = {sock.getsockname()[1] for sock in held}
        for _ in range(50):
            assert not taken.intersection(free_ports(10))
    finally:
        for sock in held:
            sock.close()
