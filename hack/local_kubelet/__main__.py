"""`python -m hack.local_kubelet`: the local kubelet's command line (see the package's docstring)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
from pathlib import Path
from types import FrameType

from controller.resources import from_kubeconfig
from controller.runtime.client import KubeClient
from controller.runtime.errors import KubeError
from hack.common import DEV
from hack.local_kubelet import __doc__ as package_doc
from hack.local_kubelet import loop
from hack.local_kubelet.kubelet import Kubelet
from hack.local_kubelet.logfiles import PodLogs
from hack.local_kubelet.logserver import LogServer, node_ports, server_context

log = logging.getLogger("local-kubelet")


def main(argv: list[str] | None = None) -> int:
    description = (package_doc or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="python -m hack.local_kubelet", description=description)
    parser.add_argument(
        "--namespace", "-n", action="append", required=True, help="watch this namespace (repeatable)"
    )
    parser.add_argument(
        "--kubeconfig", default=str(DEV / "kubeconfig"), help="admin kubeconfig (default: the dev cluster's)"
    )
    parser.add_argument(
        "--state-dir", default=str(DEV / "local-kubelet"), help="volumes, tokens and process records"
    )
    parser.add_argument(
        "--log-dir",
        default=str(DEV / "logs" / "pods"),
        help="container logs and one journal per pod (<ns>_<pod>.log); local kubelets sharing a cluster "
        "should share it: any of them may answer a log request",
    )
    pki = DEV / "run" / "pki"
    parser.add_argument(
        "--tls-cert-file", default=str(pki / "kubelet.crt"), help="the kubelet API's certificate"
    )
    parser.add_argument("--tls-private-key-file", default=str(pki / "kubelet.key"), help="its key")
    parser.add_argument(
        "--client-ca-file", default=str(pki / "ca.crt"), help="CA that signs the callers' client certificates"
    )
    parser.add_argument(
        "--port",
        type=int,
        action="append",
        help="serve the kubelet API on 127.0.0.1:PORT (repeatable; default: the kubelet ports the nodes "
        "at 127.0.0.1 name in their status)",
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter for the trainer (default: this one)"
    )
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        client = from_kubeconfig(args.kubeconfig, None, qps=50, burst=100)
    except Exception as error:
        log.error("cannot load the kubeconfig %s: %s", args.kubeconfig, error)
        return 1
    client = KubeClient(client.api_client, qps=50, burst=100, max_elapsed=10.0)
    kubelet = Kubelet(
        client,
        sorted(set(args.namespace)),
        Path(args.state_dir).resolve(),
        Path(args.log_dir).resolve(),
        python=args.python,
    )
    server = log_server(args, client, kubelet.logs)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        kubelet.stop.set()
        kubelet.events.put(None)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if server is not None:
        server.start()
    try:
        loop.run(kubelet)
    finally:
        if server is not None:
            server.stop()
    log.info("stopped")
    return 0


def log_server(args: argparse.Namespace, client: KubeClient, logs: PodLogs) -> LogServer | None:
    """The kubelet API's log endpoint on the nodes' kubelet ports, or None (said why) when it cannot be."""
    files = [Path(args.tls_cert_file), Path(args.tls_private_key_file), Path(args.client_ca_file)]
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        log.warning(
            "not serving container logs: %s missing (`kubectl logs` will not work)", ", ".join(missing)
        )
        return None
    try:
        ports = args.port or node_ports(client)
    except KubeError as error:
        log.warning("not serving container logs: cannot list the nodes (%s)", error)
        return None
    if not ports:
        log.warning("not serving container logs: no node at 127.0.0.1 names a kubelet port in its status")
        return None
    try:
        return LogServer(ports, server_context(*files), client, logs)
    except (OSError, ssl.SSLError) as error:
        log.warning("not serving container logs on %s: %s", ports, error)
        return None


if __name__ == "__main__":
    sys.exit(main())
