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
from typing import Any

import kubernetes
import yaml

from controller import flags, planner
from controller.manager import DISABLED, Manager, Options
from controller.metrics import Metrics
from controller.resources import GANG_SCHEDULER_CHOICES, from_kubeconfig
from controller.runtime.authfilter import DelegatingAuth
from controller.runtime.client import KubeClient
from controller.runtime.leaderelection import JITTER_FACTOR
from controller.runtime.logs import parse_level, resolve_level, setup_logging
from controller.runtime.serving import parse_address
from controller.runtime.servingcert import CertificateError, ServingCertificate
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


ENV_PREFIX = "TRAININGJOB_OPERATOR_"
EPILOG = """\
Booleans take --flag, --flag=true or --flag=false. Durations take Go syntax (15s, 2m, 1h30m, 500ms) or
a number of seconds. Every flag can also be set through the environment variable named in brackets;
the command line wins. A bad flag or value, an unreadable kubeconfig, a port in use or a serving
certificate that does not load ends the operator with one line and exit code 2."""


def parser() -> flags.FlagParser:
    parser = flags.FlagParser(
        prog="trainingjob-operator",
        description="Runs TrainingJobs (ml.example.com/v1): one pod per replica, services, distributed env, "
        "gang restarts, status.",
        epilog=EPILOG,
    )

    def add(flag: str, env: str | None = None, **kwargs: Any) -> None:
        parser.add_flag(flag, env=env or flags.environment_name(ENV_PREFIX, flag), **kwargs)

    def duration(flag: str, default: float, text: str, *, positive: bool = False) -> None:
        add(
            flag,
            type=flags.duration_type(positive=positive),
            default=default,
            metavar="DURATION",
            help=f"{text} (default {flags.format_duration(default)})",
        )

    add(
        "--kubeconfig",
        env="KUBECONFIG",
        help="kubeconfig file (default: in-cluster config, else ~/.kube/config)",
    )
    add("--context", help="kubeconfig context (default: the current one)")
    add("--namespace", help="watch only this namespace (default: all namespaces)")
    add("--workers", type=flags.int_type(1), default=4, help="reconcile worker threads (default 4)")
    add(
        "--metrics-bind-address",
        type=flags.checked(listen_address_or_disabled, "address"),
        default=":8443",
        help="address /metrics is served on (default :8443, every interface; 127.0.0.1:8443 for loopback; "
        "0 serves no metrics)",
    )
    add(
        "--metrics-secure",
        action=flags.BoolAction,
        default=True,
        help="serve /metrics over HTTPS, only to requesters whose bearer token the API server "
        "authenticates (TokenReview) and whose user may get the non-resource URL /metrics "
        "(SubjectAccessReview) (default true); false serves plain HTTP to anyone, for local development",
    )
    add(
        "--metrics-cert-path",
        default=None,
        metavar="DIRECTORY",
        help="directory holding tls.crt and tls.key for /metrics, as a Secret volume (cert-manager's) "
        "mounts them; read again when they change (default: a self-signed certificate written under "
        "the temporary directory at start-up)",
    )
    add(
        "--health-probe-bind-address",
        type=flags.checked(listen_address_or_disabled, "address"),
        default=":8081",
        help="address /healthz, /livez and /readyz are served on, in plain HTTP (default :8081; 0 serves "
        "no probes)",
    )
    add(
        DEPRECATED_METRICS_FLAG,
        type=flags.checked(listen_address, "address"),
        default=None,
        help=argparse.SUPPRESS,
    )
    add(
        "--leader-elect",
        action=flags.BoolAction,
        default=True,
        help="elect a leader through a Lease so only one replica reconciles (default true)",
    )
    add("--lease-name", default=contract.OPERATOR_NAME, help="name of the leader election Lease")
    add("--lease-namespace", default=None, help="namespace of the Lease (default: the pod's namespace)")
    duration("--lease-duration", 15.0, "how long a standby waits before taking over", positive=True)
    duration("--renew-deadline", 10.0, "how long the leader may fail to renew", positive=True)
    duration("--retry-period", 2.0, "time between lease attempts", positive=True)
    add(
        "--qps",
        type=flags.float_type(0),
        default=100.0,
        help="client-side API requests per second (default 100)",
    )
    add(
        "--burst", type=flags.int_type(1), default=200, help="client-side burst of API requests (default 200)"
    )
    add(
        "--events-qps",
        type=flags.float_type(0),
        default=50.0,
        help="client-side requests per second for Events (default 50)",
    )
    add(
        "--events-burst",
        type=flags.int_type(1),
        default=100,
        help="client-side burst for Events (default 100)",
    )
    add(
        "--fast-http-client",
        action=flags.BoolAction,
        default=True,
        help="send API requests and watches through the operator's own HTTP/1.1 client (default true); "
        "false sends them through the official client's urllib3, at more CPU per request, for an "
        "incident where the own client is suspected",
    )
    add(
        "--create-concurrency",
        type=flags.int_type(1),
        default=16,
        help="pods created or deleted in parallel (default 16)",
    )
    duration(
        "--force-delete-after",
        60.0,
        "how long a pod may stay terminating on a lost node before it is force-deleted",
    )
    duration(
        "--node-lost-after",
        30.0,
        "how long a node may be NotReady before its pods count as lost, restarting the gang",
    )
    duration(
        "--discovery-interval",
        30.0,
        "how often to ask the API server again whether a gang scheduler's or Kueue's API is served, so "
        "one installed or removed while the operator runs is noticed",
        positive=True,
    )
    add(
        "--gang-scheduler",
        type=flags.checked(gang_scheduler_choice, "gang scheduler"),
        default="auto",
        help="the gang scheduler whose PodGroups gang-scheduled jobs get: auto (scheduler-plugins' "
        "coscheduling when the cluster serves its PodGroup API, else Volcano's), coscheduling or volcano "
        "(that one only; while the cluster does not serve it, such jobs are scheduled pod by pod, with a "
        "Warning Event) (default auto)",
    )
    duration(
        "--progress-interval",
        5.0,
        "minimum time between status updates from one job's progress reports",
    )
    add(
        "--log-level",
        env="LOG_LEVEL",
        type=flags.checked(log_level_name, "level"),
        default=None,
        help="DEBUG, INFO, WARNING or ERROR (default INFO)",
    )
    return parser


def gang_scheduler_choice(text: str) -> str:
    if text not in GANG_SCHEDULER_CHOICES:
        raise ValueError(f"invalid gang scheduler {text!r}: one of {', '.join(GANG_SCHEDULER_CHOICES)}")
    return text


def listen_address(text: str) -> str:
    parse_address(text)
    return text


def listen_address_or_disabled(text: str) -> str:
    """A listen address, or "0" for none (controller-runtime's bind address flags)."""
    return DISABLED if text.strip() == DISABLED else listen_address(text)


# The flag that served /metrics and the probes in plain HTTP on one port, before the metrics endpoint
# became HTTPS and the probes got a port of their own; it still sets --metrics-bind-address.
DEPRECATED_METRICS_FLAG = "--metrics-addr"
DEPRECATION_WARNING = (
    "--metrics-addr is deprecated: use --metrics-bind-address (HTTPS unless --metrics-secure=false); "
    "/healthz and /readyz are served on --health-probe-bind-address"
)


def follow_deprecated_flags(args: argparse.Namespace) -> str | None:
    """Moves --metrics-addr's value to --metrics-bind-address; what is wrong if the two disagree."""
    if args.metrics_addr is None:
        return None
    default = parser().get_default("metrics_bind_address")
    if args.metrics_bind_address not in (default, args.metrics_addr):
        return (
            f"--metrics-addr={args.metrics_addr} and --metrics-bind-address={args.metrics_bind_address} "
            "disagree: give only --metrics-bind-address"
        )
    args.metrics_bind_address = args.metrics_addr
    return None


def log_level_name(text: str) -> str:
    parse_level(text)
    return text


def check_relations(args: argparse.Namespace) -> str | None:
    """What is wrong between flags that are each valid alone (client-go's leader election rules, the
    metrics endpoint's certificate without HTTPS, two servers on one port)."""
    if args.metrics_cert_path and not args.metrics_secure:
        return "--metrics-cert-path needs --metrics-secure: plain HTTP serves no certificate"
    addresses = (args.metrics_bind_address, args.health_probe_bind_address)
    if DISABLED not in addresses and addresses[0] == addresses[1] and parse_address(addresses[0])[1] != 0:
        return f"--metrics-bind-address and --health-probe-bind-address are both {addresses[0]}"
    if args.lease_duration <= args.renew_deadline:
        return (
            f"--lease-duration ({flags.format_duration(args.lease_duration)}) must be longer than "
            f"--renew-deadline ({flags.format_duration(args.renew_deadline)})"
        )
    if args.renew_deadline <= JITTER_FACTOR * args.retry_period:
        return (
            f"--renew-deadline ({flags.format_duration(args.renew_deadline)}) must be longer than "
            f"{JITTER_FACTOR} x --retry-period ({flags.format_duration(args.retry_period)})"
        )
    return None


class StartupError(Exception):
    """A problem that stops the operator before it runs, told in one line (exit code 2)."""


def kubeconfig_source(path: str | None) -> str:
    if path:
        return f"kubeconfig {path}"
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "the in-cluster configuration"
    return f"kubeconfig {os.path.expanduser('~/.kube/config')}"


def connect(args: argparse.Namespace, metrics: Metrics, pool: int) -> KubeClient:
    """The reconcile client from the kubeconfig (or in-cluster); StartupError naming the file if not."""
    source = kubeconfig_source(args.kubeconfig)
    try:
        if args.kubeconfig and os.pathsep not in args.kubeconfig:
            # The client library reports a missing or unreadable file as "no configuration found".
            with open(args.kubeconfig, "rb"):
                pass
        return from_kubeconfig(
            args.kubeconfig,
            args.context,
            args.qps,
            args.burst,
            pool_size=pool,
            metrics=metrics.rest_metrics(),
            fast_http_client=args.fast_http_client,
        )
    except OSError as error:
        raise StartupError(f"cannot read {source}: {error.strerror or error}") from None
    except (kubernetes.config.ConfigException, yaml.YAMLError, ValueError, TypeError, KeyError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise StartupError(f"cannot use {source}: {reason}") from None


def pool_size(args: argparse.Namespace) -> int:
    """Connections for every worker and pod-creating thread, plus the watches, the lease and Events."""
    return int(args.workers) + 12 + int(args.create_concurrency)


def lease_and_events_clients(
    args: argparse.Namespace, metrics: Metrics, client: KubeClient
) -> tuple[KubeClient, KubeClient]:
    """The Lease's client and the Events' client, on the reconcile client's credentials and connections."""
    # Lease calls must fail fast: a renewal that retries past the renew deadline is worse than a miss.
    lease_client = KubeClient(
        client.api_client,
        qps=0,
        burst=0,
        metrics=metrics.rest_metrics(),
        max_attempts=2,
        max_elapsed=args.retry_period,
        timeout=(args.retry_period, args.renew_deadline / 2),
        fast_http_client=args.fast_http_client,
    )
    # Events get their own client and rate limit (as client-go's broadcaster does), so a burst of
    # Events never delays a reconcile's writes and vice versa.
    events_client = KubeClient(
        client.api_client,
        qps=args.events_qps,
        burst=args.events_burst,
        metrics=metrics.rest_metrics(),
        max_attempts=3,
        fast_http_client=args.fast_http_client,
    )
    return lease_client, events_client


# The reviews of /metrics's requesters (TokenReview, SubjectAccessReview): their own client-side rate
# limit, so that requesters with ever new tokens never spend the reconciles' budget; answers are cached,
# so a scrape every 30 s needs none once warm.
METRICS_AUTH_QPS = 5.0
METRICS_AUTH_BURST = 10


def metrics_security(
    args: argparse.Namespace, metrics: Metrics, client: KubeClient
) -> tuple[ServingCertificate | None, DelegatingAuth | None]:
    """The serving certificate and the authentication and authorization filter of /metrics; none in
    plain mode. StartupError when the certificate cannot be loaded or made."""
    if not args.metrics_secure or args.metrics_bind_address == DISABLED:
        return None, None
    try:
        if args.metrics_cert_path:
            certificate = ServingCertificate.from_directory(args.metrics_cert_path)
        else:
            certificate = ServingCertificate.generate()
    except CertificateError as error:
        raise StartupError(f"cannot serve /metrics over HTTPS: {error}") from None
    # A scrape gives up after 10 s (Prometheus's default scrape timeout): reviews fail fast.
    reviews = KubeClient(
        client.api_client,
        qps=METRICS_AUTH_QPS,
        burst=METRICS_AUTH_BURST,
        metrics=metrics.rest_metrics(),
        max_attempts=3,
        max_elapsed=5.0,
        timeout=(5.0, 5.0),
        fast_http_client=args.fast_http_client,
    )
    return certificate, DelegatingAuth(reviews)


def build(
    args: argparse.Namespace,
    metrics: Metrics,
    client: KubeClient,
    certificate: ServingCertificate | None = None,
    auth: DelegatingAuth | None = None,
) -> Manager:
    workers = args.workers
    lease_client, events_client = lease_and_events_clients(args, metrics, client)
    options = Options(
        namespace=args.namespace,
        workers=workers,
        metrics_bind_address=args.metrics_bind_address,
        health_probe_bind_address=args.health_probe_bind_address,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace or default_lease_namespace(),
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
        create_concurrency=args.create_concurrency,
        discovery_interval=args.discovery_interval,
        gang_preference=GANG_SCHEDULER_CHOICES[args.gang_scheduler],
        settings=planner.Settings(
            force_delete_after=args.force_delete_after,
            progress_min_interval=args.progress_interval,
            node_lost_after=args.node_lost_after,
        ),
    )
    return Manager(
        client,
        lease_client,
        options,
        metrics,
        events_client=events_client,
        metrics_certificate=certificate,
        metrics_auth=auth,
    )


def start_servers(args: argparse.Namespace, manager: Manager) -> str | None:
    """Binds the probes' and the metrics' ports; what went wrong, naming the flag, if one cannot."""
    servers = (
        ("--health-probe-bind-address", args.health_probe_bind_address, manager.probe_server),
        ("--metrics-bind-address", args.metrics_bind_address, manager.metrics_server),
    )
    for flag, address, server in servers:
        if server is None:
            continue
        try:
            server.start()
        except OSError as error:
            for other in manager.servers():
                other.stop()
            return f"cannot listen on {flag}={address}: {error.strerror or error}"
    if manager.probe_server is not None:
        logger.info(
            "serving /healthz, /livez and /readyz over HTTP",
            extra={"address": manager.probe_server.address},
        )
    metrics = manager.metrics_server
    if metrics is None:
        logger.info("serving no metrics (--metrics-bind-address=0)")
    elif metrics.certificate is None:
        logger.warning(
            "serving /metrics over plain HTTP to anyone who can reach it (--metrics-secure=false)",
            extra={"address": metrics.address},
        )
    else:
        logger.info(
            "serving /metrics over HTTPS to authenticated and authorized requesters",
            extra={"address": metrics.address, "certificate": metrics.certificate.describe()},
        )
    return None


def fail(message: str) -> int:
    """One line on stderr for a problem that stops the operator from starting; exit code 2."""
    print(f"trainingjob-operator: {message}", file=sys.stderr, flush=True)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    command = parser()
    args = command.parse(argv)  # exits 2 with one line on a bad flag or value
    problem = follow_deprecated_flags(args) or check_relations(args)
    if problem:
        command.error(problem)
    setup_logging(resolve_level(args.log_level))
    if args.metrics_addr is not None:
        logger.warning(DEPRECATION_WARNING)
    metrics = Metrics()
    try:
        client = connect(args, metrics, pool_size(args))
    except StartupError as error:
        return fail(str(error))
    if not args.fast_http_client:
        logger.info("API requests go through urllib3 (--fast-http-client=false)")
    try:
        certificate, auth = metrics_security(args, metrics, client)
    except StartupError as error:
        return fail(str(error))
    try:
        manager = build(args, metrics, client, certificate, auth)
    except Exception as error:
        logger.error("cannot start: %s", error)
        return 1
    problem = start_servers(args, manager)  # here, not in run(), so a port in use is told in one line
    if problem:
        return fail(problem)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        logger.info("received %s", signal.Signals(signum).name)
        manager.shutdown()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return manager.run()


if __name__ == "__main__":
    sys.exit(main())
