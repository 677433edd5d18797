"""The API server, as the real node and its pods reach it: a TCP relay from the node's network namespace.

Why: the dev cluster's API server listens on 127.0.0.1 only, and the real node lives in a network
namespace of its own (testbed/node/realnode.py), whose loopback is not the machine's. Its kubelet,
kube-proxy and CoreDNS, and every pod through the `kubernetes` Service, need the API server; a real
cluster gives them its advertise address. This relay is that address: it listens on the node's own
address inside the node's namespace and opens, for every connection, one to the API server on the
machine's loopback. It relays bytes only: TLS is end to end between the client and the API server
(whose certificate names the node's address and the `kubernetes` Service's names).

The listening socket is made inside the node's namespace and everything else outside: a socket
stays in the namespace it was created in, so the process enters the namespace (setns) just long
enough to create it. Standard library only (setns through libc), like the rest of testbed/cluster.

    python3 -m testbed.node.apiforward --netns PATH --listen IP:PORT --to 127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Final

CLONE_NEWNET: Final = 0x40000000
_CHUNK: Final = 256 * 1024


def setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"setns: {os.strerror(error)}")


@contextlib.contextmanager
def inside(netns_path: str) -> Iterator[None]:
    """The calling thread in the network namespace at `netns_path` for the block, then back."""
    with open("/proc/thread-self/ns/net") as home, open(netns_path) as target:
        setns(target.fileno())
        try:
            yield
        finally:
            setns(home.fileno())


def listen_in(netns_path: str, host: str, port: int) -> socket.socket:
    with inside(netns_path):
        return socket.create_server((host, port), backlog=128)


def pump(source: socket.socket, sink: socket.socket) -> None:
    """Copies one direction until its end, then passes the end on (half-close) so TLS closes cleanly."""
    try:
        while True:
            data = source.recv(_CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def relay(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=10)
    except OSError as error:
        print(f"apiforward: cannot reach the API server at {target[0]}:{target[1]}: {error}", flush=True)
        client.close()
        return
    upstream.settimeout(None)
    for sock in (client, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve(server: socket.socket, target: tuple[str, int]) -> None:
    while True:
        client, _ = server.accept()
        threading.Thread(target=relay, args=(client, target), daemon=True).start()


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--netns", required=True, help="the node's network namespace (a path)")
    parser.add_argument("--listen", required=True, type=address, help="IP:PORT inside that namespace")
    parser.add_argument("--to", required=True, type=address, help="the API server, IP:PORT on loopback")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server = listen_in(args.netns, *args.listen)
    except OSError as error:
        print(f"apiforward: cannot listen on {args.listen[0]}:{args.listen[1]} in {args.netns}: {error}")
        return 2
    print(
        f"apiforward: {args.listen[0]}:{args.listen[1]} in {args.netns} -> {args.to[0]}:{args.to[1]}",
        flush=True,
    )
    serve(server, args.to)
    return 0


if __name__ == "__main__":
    sys.exit(main())
