"""`python -m hack.local_kubelet`: the local kubelet's command line (see the package's docstring)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from controller.kube import KubeClient, from_kubeconfig
from hack.common import DEV
from hack.local_kubelet import __doc__ as package_doc
from hack.local_kubelet.kubelet import Kubelet

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
        "--log-dir", default=str(DEV / "logs" / "pods"), help="one log per pod: <ns>_<pod>.log"
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

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        kubelet.stop.set()
        kubelet.events.put(None)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    kubelet.run()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
