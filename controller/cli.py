"""The `trainingjob-operator` command (also `python -m controller`): flags, wiring and signals.

Everything long-lived is built here once (one API client, one metrics registry, one manager) and
handed down explicitly; nothing relies on global client configuration.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from controller import lifecycle
from controller.kube import KubeClient, from_kubeconfig
from controller.logs import resolve_level, setup_logging
from controller.manager import Manager, Options
from controller.metrics import Metrics
from crd import contract

logger = logging.getLogger("controller")

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_lease_namespace() -> str:
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainingjob-operator",
        description="Runs TrainingJobs (ml.example.com/v1): one pod per replica, services, distributed env, "
        "gang restarts, status.",
    )
    add = parser.add_argument
    add(
        "--kubeconfig",
        help="kubeconfig file (default: in-cluster config, else $KUBECONFIG or ~/.kube/config)",
    )
    add("--context", help="kubeconfig context (default: the current one)")
    add("--namespace", help="watch only this namespace (default: all namespaces)")
    add("--workers", type=int, default=4, help="reconcile worker threads (default 4)")
    add(
        "--metrics-addr",
        default=":8080",
        help="/metrics /healthz /readyz address (default :8080, all interfaces; 127.0.0.1:8080 for loopback)",
    )
    add(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="elect a leader through a Lease so only one replica reconciles (default on)",
    )
    add("--lease-name", default=contract.OPERATOR_NAME, help="name of the leader election Lease")
    add("--lease-namespace", default=None, help="namespace of the Lease (default: the pod's namespace)")
    add(
        "--lease-duration",
        type=float,
        default=15.0,
        help="seconds a standby waits before taking over (default 15)",
    )
    add(
        "--renew-deadline", type=float, default=10.0, help="seconds the leader may fail to renew (default 10)"
    )
    add("--retry-period", type=float, default=2.0, help="seconds between lease attempts (default 2)")
    add("--qps", type=float, default=100.0, help="client-side API requests per second (default 100)")
    add("--burst", type=int, default=200, help="client-side burst of API requests (default 200)")
    add(
        "--events-qps",
        type=float,
        default=50.0,
        help="client-side requests per second for Events (default 50)",
    )
    add("--events-burst", type=int, default=100, help="client-side burst for Events (default 100)")
    add("--create-concurrency", type=int, default=16, help="pods created or deleted in parallel (default 16)")
    add(
        "--force-delete-after",
        type=float,
        default=60.0,
        help="seconds before a pod stuck terminating on a lost node is force-deleted (default 60)",
    )
    add(
        "--node-lost-after",
        type=float,
        default=30.0,
        help="seconds a node may be NotReady before its pods count as lost, restarting the gang (default 30)",
    )
    add(
        "--progress-interval",
        type=float,
        default=5.0,
        help="minimum seconds between status updates from one job's progress reports (default 5)",
    )
    add("--log-level", default=None, help="DEBUG, INFO, WARNING or ERROR (default: $LOG_LEVEL or INFO)")
    return parser


def build(args: argparse.Namespace, metrics: Metrics) -> Manager:
    workers = max(1, args.workers)
    pool = workers + 12 + args.create_concurrency
    client = from_kubeconfig(
        args.kubeconfig, args.context, args.qps, args.burst, pool_size=pool, metrics=metrics.rest_metrics()
    )
    # Lease calls must fail fast: a renewal that retries past the renew deadline is worse than a miss.
    lease_client = KubeClient(
        client.api_client,
        qps=0,
        burst=0,
        metrics=metrics.rest_metrics(),
        max_attempts=2,
        max_elapsed=args.retry_period,
        timeout=(args.retry_period, args.renew_deadline / 2),
    )
    # Events get their own client and rate limit (as client-go's broadcaster does), so a burst of
    # Events never delays a reconcile's writes and vice versa.
    events_client = KubeClient(
        client.api_client,
        qps=args.events_qps,
        burst=args.events_burst,
        metrics=metrics.rest_metrics(),
        max_attempts=3,
    )
    options = Options(
        namespace=args.namespace,
        workers=workers,
        metrics_addr=args.metrics_addr,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace or default_lease_namespace(),
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        create_concurrency=max(1, args.create_concurrency),
        settings=lifecycle.Settings(
            force_delete_after=args.force_delete_after,
            progress_min_interval=args.progress_interval,
            node_lost_after=args.node_lost_after,
        ),
    )
    return Manager(client, lease_client, options, metrics, events_client=events_client)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        level = resolve_level(args.log_level)
    except ValueError as error:
        print(f"trainingjob-operator: {error}", file=sys.stderr)
        return 2
    setup_logging(level)
    try:
        manager = build(args, Metrics())
    except Exception as error:
        logger.error("cannot start: %s", error)
        return 1

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("received %s", signal.Signals(signum).name)
        manager.shutdown()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return manager.run()


if __name__ == "__main__":
    sys.exit(main())
