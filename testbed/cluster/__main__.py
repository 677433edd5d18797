"""`hack/dev-cluster.sh`: the command line of the dev cluster (see the package's docstring).

python3 -m testbed.cluster up [--with kueue,coscheduling,multikueue,real-node,network-policies,registry]
                              [--images ...]
python3 -m testbed.cluster down|status|env
python3 -m testbed.cluster remove|build real-node|kueue|coscheduling|network-policies|registry [--images ...]
python3 -m testbed.cluster restart|stop|start <component>
python3 -m testbed.cluster run <name> [--wait-http URL] -- <command...>
python3 -m testbed.cluster stop <name>
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from testbed.addons.optional import build, parse_with
from testbed.cluster import __doc__ as package_doc
from testbed.cluster.extras import run_extra, stop_extra
from testbed.cluster.lifecycle import down, remove_optional, restart, start_one, stop_one, up
from testbed.cluster.nodes import NodeShape
from testbed.cluster.processes import START_TIMEOUT
from testbed.cluster.state import (
    COMPONENTS,
    KUBECONFIG,
    KUBECTL_LINK,
    LOGS,
    NETWORK_POLICY_COMPONENTS,
    NODE_COMPONENTS,
    OPTIONAL_PROCESSES,
    REAL_NODE,
    REGISTRY,
    WITH_CHOICES,
    dead_components,
    read_state,
    say,
    stopped_components,
    write_plugin,
)
from testbed.common import DEV, ToolError, reader_gone, still_running
from testbed.node import netpolicies, nodeimages, realnode, registry

ALL_COMPONENTS = (*COMPONENTS, *OPTIONAL_PROCESSES, *NODE_COMPONENTS, *NETWORK_POLICY_COMPONENTS, REGISTRY)


def status() -> int:
    state = read_state()
    if state is None:
        print("dev cluster: not running")
        return 1
    dead = dead_components(state)
    stopped = stopped_components(state)
    health = "DEGRADED" if dead else "running"
    if stopped and not dead:
        health += f" (stopped on purpose: {', '.join(stopped)}; `hack/dev-cluster.sh start <component>`)"
    print(f"dev cluster: {health}  API server {state['server']}")
    print(f"kubeconfig:  {KUBECONFIG}")
    versions = state.get("versions", {})
    print(
        "versions:    "
        + ", ".join(
            f"{k.removesuffix('_VERSION').lower().replace('_', '-')} {v}"
            for k, v in versions.items()
            if k.endswith("_VERSION")
        )
    )
    print(f"binaries:    {state['bin_dir']}")
    added = state.get("optional", [])
    print(f"optional:    {', '.join(added) if added else 'none'} (`up --with {','.join(WITH_CHOICES)}`)")
    print(f"logs:        {LOGS}/<component>.log")
    for name, proc in state.get("processes", {}).items():
        alive = still_running(proc)
        port = state.get("ports", {}).get(name, "")
        condition = "running" if alive else "stopped" if proc.get("stopped") else "NOT RUNNING"
        where = realnode.endpoint(name) if name in NODE_COMPONENTS else f"127.0.0.1:{port}"
        if name in NETWORK_POLICY_COMPONENTS:
            where = netpolicies.endpoint(name)
        if name == REGISTRY:
            where = registry.endpoint()
        print(f"  {name:<24} pid {proc['pid']:<8} {condition:<12} {where}  {proc['log']}")
    extras = state.get("extras", {})
    if extras:
        print("dev processes (`hack/dev-cluster.sh stop <name>`; `down` stops them first):")
    for name, proc in extras.items():
        condition = "running" if still_running(proc) else "EXITED"
        print(f"  {name:<24} pid {proc['pid']:<8} {condition:<12} {proc['log']}")
    return 0 if not dead else 1


def env() -> None:
    state = read_state()
    if state is not None:
        write_plugin()  # for a cluster started before the plugin was put beside kubectl
    if "TJ_DEV_DIR" in os.environ:  # so that hack/dev-cluster.sh and make find this cluster too
        print(f"export TJ_DEV_DIR={shlex.quote(str(DEV))}")
    print(f"export KUBECONFIG={shlex.quote(str(KUBECONFIG))}")
    print(f'export PATH={shlex.quote(str(KUBECTL_LINK.parent))}:"$PATH"')
    if state is not None and state.get("registry"):  # `make docker-push deploy IMG=$REGISTRY/...`
        print(f"export REGISTRY={registry.HOST}")
        print(f"export REGISTRY_AUTH_FILE={shlex.quote(str(registry.files().auth_file))}")


def add_images_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--images",
        default=os.environ.get("TJ_NODE_IMAGES", nodeimages.ALL_IMAGES),
        metavar="all|first|NAME,...",
        help=(
            "the real node's images to build and import besides its own (pause, busybox): "
            f"{', '.join(nodeimages.IMAGES)}; {nodeimages.FIRST} is "
            f"{','.join(nodeimages.FIRST_IMAGES)} (a test session's); default TJ_NODE_IMAGES, else all"
        ),
    )


def node_images(names: list[str], text: str) -> tuple[str, ...]:
    """The real node's images for `--images`, when the real node is among `names` or the cluster
    has it (a stale cluster started again brings it back)."""
    recorded = (read_state() or {}).get("optional") or []
    return nodeimages.selected_images(text) if REAL_NODE in [*names, *recorded] else nodeimages.IMAGES


def build_parser() -> argparse.ArgumentParser:
    description = (package_doc or "").splitlines()[0]
    parser = argparse.ArgumentParser(prog="hack/dev-cluster.sh", description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    up_parser = sub.add_parser("up", help="build (first time) and start the cluster; no-op when running")
    up_parser.add_argument("--nodes", type=int, default=int(os.environ.get("TJ_DEV_NODES", "4")))
    up_parser.add_argument("--gpus-per-node", type=int, default=int(os.environ.get("TJ_DEV_GPUS", "8")))
    up_parser.add_argument("--cpu-per-node", default=os.environ.get("TJ_DEV_CPU", "64"))
    up_parser.add_argument("--memory-per-node", default=os.environ.get("TJ_DEV_MEMORY", "512Gi"))
    up_parser.add_argument("--gpu-product", default=os.environ.get("TJ_DEV_GPU_PRODUCT", "A100-SXM4-80GB"))
    up_parser.add_argument(
        "--with",
        dest="with_optional",
        metavar=",".join(WITH_CHOICES),
        default="",
        help="optional components to run too (built the first time); also adds them to a running cluster",
    )
    add_images_option(up_parser)
    sub.add_parser("down", help="stop every process the cluster started and remove its run directory")
    remove_parser = sub.add_parser(
        "remove", help="take an optional part added with `up --with` off the cluster"
    )
    remove_parser.add_argument("part", choices=WITH_CHOICES)
    build_parser_ = sub.add_parser(
        "build",
        help="build the control plane and optional parts (binaries, the real node's images), start nothing",
    )
    build_parser_.add_argument("parts", metavar=",".join(WITH_CHOICES))
    add_images_option(build_parser_)
    sub.add_parser("status", help="what runs, versions, ports and logs")
    sub.add_parser("env", help="print export lines for eval")
    restart_parser = sub.add_parser("restart", help="restart one component with the same flags and port")
    restart_parser.add_argument("component", choices=ALL_COMPONENTS)
    stop_parser = sub.add_parser(
        "stop",
        help="stop one component on purpose until `start`, or a dev process started by `run`",
    )
    stop_parser.add_argument("component", metavar="component|name")
    start_parser = sub.add_parser("start", help="start a component stopped with `stop`, same flags and port")
    start_parser.add_argument("component", choices=ALL_COMPONENTS)
    run_parser = sub.add_parser(
        "run",
        help="start a dev process stopped with the cluster: run <name> [--wait-http URL] -- <command...>",
    )
    run_parser.add_argument("name")
    run_parser.add_argument("--wait-http", metavar="URL", help="wait until this URL answers 200")
    run_parser.add_argument("--timeout", type=float, default=START_TIMEOUT, help="seconds --wait-http waits")
    run_parser.add_argument("--replace", action="store_true", help="restart it if it already runs")
    return parser


def dispatch(args: argparse.Namespace, command: list[str]) -> int:
    if args.command == "up":
        with_optional = parse_with(args.with_optional)
        up(
            NodeShape(
                args.nodes, args.gpus_per_node, args.cpu_per_node, args.memory_per_node, args.gpu_product
            ),
            tuple(with_optional),
            node_images(with_optional, args.images),
        )
    elif args.command == "down":
        down()
    elif args.command == "remove":
        remove_optional(args.part)
    elif args.command == "build":
        parts = parse_with(args.parts)
        for name in build(parts, node_images(parts, args.images)):
            say(f"{name}: built and cached, nothing started")
    elif args.command == "restart":
        restart(args.component)
    elif args.command == "stop" and args.component in ALL_COMPONENTS:
        stop_one(args.component)
    elif args.command == "stop":
        stop_extra(args.component)
    elif args.command == "start":
        start_one(args.component)
    elif args.command == "run":
        run_extra(args.name, command, args.wait_http, args.timeout, args.replace)
    elif args.command == "status":
        return status()
    else:
        env()
    return 0


def main(argv: list[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` is the command of `run`, its own options included.
    command: list[str] = []
    if "--" in arguments:
        split = arguments.index("--")
        arguments, command = arguments[:split], arguments[split + 1 :]
    args = build_parser().parse_args(arguments)
    try:
        return dispatch(args, command)
    except ToolError as error:
        say(f"error: {error}")
        return getattr(error, "exit_code", 1)  # 2: refused, as the machine's real node is held
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except BrokenPipeError:
        return reader_gone()


if __name__ == "__main__":
    sys.exit(main())
