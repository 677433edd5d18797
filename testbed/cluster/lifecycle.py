"""Bringing the dev cluster up and down, and one component at a time (restart, stop, start).

Why: `up` must cope with whatever an earlier session left (a healthy cluster, a crashed component, a
run directory without state, a component stopped on purpose by a test) and, when it starts anew, do
it in the order the components need: etcd, the API server, the project's CRDs (before the garbage
collector starts, so it knows them from the beginning), the controller manager and scheduler, kwok,
then the nodes. A component stopped on purpose is not a crash: `up` leaves it stopped unless the
stop is older than STOP_EXPIRY (whoever stopped it is gone).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from testbed.addons import mlflow, multikueue, optional
from testbed.cluster import components, kube_bins
from testbed.cluster.components import Ports
from testbed.cluster.handle import Cluster
from testbed.cluster.nodes import NodeShape, create_nodes, ready_nodes
from testbed.cluster.pki import (
    KUBELET_CLIENT_BINDING,
    admin_ssl_context,
    kubeconfig_text,
    make_pki,
    self_signed_context,
)
from testbed.cluster.processes import kubectl, spawn, stop_processes, wait_for
from testbed.cluster.state import (
    KUBECONFIG,
    KUBECTL_LINK,
    MLFLOW,
    MULTIKUEUE,
    NETWORK_POLICIES,
    NETWORK_POLICY_COMPONENTS,
    NODE_COMPONENTS,
    OPTIONAL_PROCESSES,
    OPTIONAL_SIDE_PROCESSES,
    REAL_NODE,
    REGISTRY,
    RUN,
    STATE,
    STOP_EXPIRY,
    abandoned_components,
    cluster_lock,
    dead_components,
    read_state,
    read_versions,
    say,
    stopped_components,
    write_plugin,
    write_state,
)
from testbed.common import DEV, REPO, ToolError, free_ports, http_ok, still_running
from testbed.node import netpolicies, nodeimages, realnode, registry

# etcd keeps its data on tmpfs (in a fresh private directory) for speed; the cluster is disposable.
SHM: Final = Path("/dev/shm")  # noqa: S108
CRD_DIR: Final = REPO / "crd"
# Extra processes (the demo's operator) get longer than the components to finish their work on SIGTERM.
EXTRA_STOP_TIMEOUT: Final = 30.0


def up(
    shape: NodeShape, with_optional: tuple[str, ...] = (), node_images: tuple[str, ...] = nodeimages.IMAGES
) -> None:
    """Starts the cluster unless it runs, then makes the optional components in `with_optional` run on
    it (testbed/addons/optional.py), the real node with `node_images`; a cluster rebuilt after a crash
    gets back the ones it had."""
    if REAL_NODE in with_optional and not (read_state() or {}).get("real_node"):
        realnode.claim_machine(hold=False)  # refused before anything is built or started
    # A cold build takes minutes: done before the lock, so that other commands are not held up.
    requested = optional.build(list(with_optional), node_images)
    recorded: list[str] = []
    with cluster_lock():
        state = read_state()
        if state:
            dead = dead_components(state)
            if not dead:
                for component in abandoned_components(state):
                    say(f"{component} was stopped on purpose over {STOP_EXPIRY:.0f}s ago; starting it again")
                    start_component_locked(state, component)
                stopped = stopped_components(state)
                for component in stopped:
                    say(f"{component} is stopped on purpose; `hack/dev-cluster.sh start {component}`")
                say(
                    f"already running (API server {state['server']}); `hack/dev-cluster.sh status` tells more"
                )
                if requested and stopped:
                    raise ToolError(
                        f"cannot add {', '.join(requested)} while {', '.join(stopped)} is stopped"
                    )
                optional.add(state, requested, node_images=node_images)
                return
            recorded = list(state.get("optional", []))
            running = sorted(set(state.get("processes", {})) - set(dead))
            say(
                f"found a stale cluster: {', '.join(dead)} not running"
                + (f" ({', '.join(running)} still up)" if running else "")
                + "; restarting it cleanly"
            )
            teardown(state)
        elif RUN.exists():
            say(f"removing a run directory without state ({RUN})")
            teardown({})
        wanted = optional.build(
            recorded + [name for name in with_optional if name not in recorded], node_images
        )
        start(kube_bins.ensure(), shape, wanted, node_images)


def start(
    bin_dir: Path,
    shape: NodeShape,
    optional_builds: dict[str, Path] | None = None,
    node_images: tuple[str, ...] = nodeimages.IMAGES,
) -> None:
    say(f"starting the control plane from {bin_dir}")
    RUN.mkdir(parents=True)
    etcd_data = Path(tempfile.mkdtemp(prefix="trainingjob-etcd-", dir=SHM if SHM.is_dir() else None))
    ports = Ports(*free_ports(6))
    server = f"https://127.0.0.1:{ports.apiserver}"
    state = {
        "server": server,
        "bin_dir": str(bin_dir),
        "etcd_data": str(etcd_data),
        "run_dir": str(RUN),
        "versions": read_versions(bin_dir),
        "nodes": shape.count,
        "started": time.time(),
        "processes": {},
        "ports": ports.by_component(),
    }
    STATE.write_text(json.dumps(state, indent=2))
    processes: dict[str, Any] = {}
    try:
        pki = RUN / "pki"
        make_pki(pki)
        KUBECONFIG.write_text(kubeconfig_text(server, pki))
        KUBECONFIG.chmod(0o600)
        KUBECTL_LINK.parent.mkdir(parents=True, exist_ok=True)
        KUBECTL_LINK.unlink(missing_ok=True)
        KUBECTL_LINK.symlink_to(bin_dir / "kubectl")
        write_plugin()

        spawn("etcd", bin_dir / "etcd", components.etcd_args(ports, etcd_data), processes)
        etcd_health = f"{components.etcd_url(ports)}/health"
        wait_for("etcd /health", lambda: http_ok(etcd_health, expect='"health":"true"'), processes)
        say("etcd is healthy")

        spawn("kube-apiserver", bin_dir / "kube-apiserver", components.apiserver_args(ports, pki), processes)
        context = admin_ssl_context(pki)
        wait_for("kube-apiserver /readyz", lambda: http_ok(f"{server}/readyz", context), processes)
        say("kube-apiserver is ready")

        install_crds(bin_dir)
        for name, build_dir in (optional_builds or {}).items():
            optional.install_crds(bin_dir, name, build_dir)
        kubectl(bin_dir, "apply", "-f", "-", stdin=json.dumps(KUBELET_CLIENT_BINDING))
        spawn(
            "kube-controller-manager",
            bin_dir / "kube-controller-manager",
            components.controller_manager_args(ports, pki),
            processes,
        )
        spawn("kube-scheduler", bin_dir / "kube-scheduler", components.scheduler_args(ports), processes)
        spawn("kwok", bin_dir / "kwok", components.kwok_args(ports), processes)

        create_nodes(bin_dir, shape)
        wait_for(f"{shape.count} Ready nodes", lambda: ready_nodes(bin_dir) >= shape.count, processes)
        wait_for(
            "the default ServiceAccount",
            lambda: bool(
                kubectl(
                    bin_dir, "get", "serviceaccount", "default", "-n", "default", "-o", "name", check=False
                )
            ),
            processes,
        )
        if optional_builds:
            optional.add(read_state() or {}, optional_builds, crds_installed=True, node_images=node_images)
        say(f'ready: {shape.count} nodes x {shape.gpus} nvidia.com/gpu; `eval "$(hack/dev-cluster.sh env)"`')
    except BaseException:
        say("start failed; stopping what was started")
        teardown(read_state() or {"processes": processes, "etcd_data": str(etcd_data)})
        raise


def install_crds(bin_dir: Path) -> None:
    """The project's CRDs from crd/ (and the trainers' admission policy beside them), before the controller
    manager's garbage collector starts."""
    crds = sorted(CRD_DIR.glob("*.yaml")) if CRD_DIR.is_dir() else []
    crds = [path for path in crds if path.name != "kustomization.yaml"]
    for path in crds:
        kubectl(bin_dir, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    if crds:
        say(f"installed {len(crds)} file(s) from crd/ (CRDs first) before the garbage collector starts")


def teardown(state: dict[str, Any]) -> None:
    for worker in multikueue.worker_dirs(DEV):
        # MultiKueue's worker clusters (testbed/addons/multikueue.py) belong with their manager.
        say(f"taking down the worker cluster in {worker.name}")
        Cluster(worker).down()
    extras = state.get("extras", {})
    if extras:
        # Before the API server goes: they may still talk to it on their way out.
        say(f"stopping {', '.join(extras)}")
        stop_processes(extras, timeout=EXTRA_STOP_TIMEOUT)
    if state.get("network_policies"):
        # Before the node, whose namespace holds one end of its link and its nftables table.
        say("taking down the network policies' enforcer")
        netpolicies.remove(state)
    if state.get("registry"):
        # A process of the node's network namespace; its storage goes with the run directory.
        registry.remove(state)
    if state.get("real_node"):
        # Drained while the API server still runs, and everything it changed on the machine undone.
        say("taking down the real node")
        realnode.remove(state)
    stop_processes(state.get("processes", {}))
    etcd_data = state.get("etcd_data")
    if etcd_data:
        shutil.rmtree(etcd_data, ignore_errors=True)
    shutil.rmtree(RUN, ignore_errors=True)


def remove_optional(name: str) -> None:
    """Takes an optional part off the running cluster (`remove real-node|kueue|coscheduling|
    network-policies|registry|multikueue`): its processes (or MultiKueue's worker cluster) stopped
    and, for the real node and the enforcer on it,
    every change on the machine undone (the node drained first; the enforcer and the registry go with
    the node)."""
    with cluster_lock():
        state = read_state()
        if state is None:
            raise ToolError("the dev cluster is not running")
        if name not in state.get("optional", []):
            say(f"{name} is not running")
            return
        if name in (REAL_NODE, NETWORK_POLICIES) and state.get("network_policies"):
            netpolicies.remove(state)
        if name in (REAL_NODE, REGISTRY) and state.get("registry"):
            registry.remove(state)
        if name in (REAL_NODE, MLFLOW) and MLFLOW in state.get("optional", []):
            mlflow.remove(state)  # its pod runs on the node
        if name == REAL_NODE:
            realnode.remove(state)
        elif name == MULTIKUEUE:
            multikueue.remove(state)
        elif name not in (NETWORK_POLICIES, REGISTRY, MLFLOW):
            names = (name, *OPTIONAL_SIDE_PROCESSES.get(name, ()))
            stop_processes({n: state["processes"].pop(n) for n in names if n in state["processes"]})
            state["optional"].remove(name)
            write_state("processes", state["processes"])
            write_state("optional", state["optional"])
        say(f"removed {name}")


def down() -> None:
    with cluster_lock():
        state = read_state()
        if state is None and not RUN.exists():
            say("nothing running")
            return
        teardown(state or {})
        say("stopped; every process this cluster started has exited")


# ------------------------------------------------------------------------------- one component


def restart(component: str) -> None:
    """Stops one component and starts it again with the same command line (and so the same port),
    then waits until it serves again: how tests exercise an API server restart."""
    with cluster_lock():
        state = running_state(component)
        stop_component_locked(state, component)
        start_component_locked(state, component)
        say(f"restarted {component} (pid {state['processes'][component]['pid']})")
        after_api_server_start(state, component)


def after_api_server_start(state: dict[str, Any], component: str) -> None:
    """Restarts the controller manager, the scheduler and the optional components (Kueue, the second
    scheduler) once a (re)started API server serves. Their
    informers, cut off by the outage, otherwise sit out client-go's relist backoff, which grows with
    every restart less than two minutes after the last: measured up to a minute and a half in which no
    new pod got a node and no new namespace its default ServiceAccount, so one test of an API server
    outage stalled the tests after it. kwok needs no restart: it picks pods up at once."""
    if component != "kube-apiserver":
        return
    for dependent in ("kube-controller-manager", "kube-scheduler", *OPTIONAL_PROCESSES, NETWORK_POLICIES):
        process = state["processes"].get(dependent)
        if not process or process.get("stopped"):
            continue
        stop_component_locked(state, dependent)
        start_component_locked(state, dependent)
        say(f"restarted {dependent} after the API server (pid {state['processes'][dependent]['pid']})")


def stop_one(component: str) -> None:
    """Takes one component down on purpose until `start`: an outage as long as a test needs."""
    with cluster_lock():
        state = running_state(component)
        stop_component_locked(state, component)
        processes: dict[str, Any] = state["processes"]
        processes[component]["stopped"] = True
        processes[component]["stopped_at"] = time.time()
        write_state("processes", processes)
        say(f"stopped {component}; `hack/dev-cluster.sh start {component}` brings it back")


def start_one(component: str) -> None:
    """Starts a component taken down by `stop` (or found dead) with its old command line and port."""
    with cluster_lock():
        state = running_state(component)
        process = state["processes"][component]
        if still_running(process) and not process.get("stopped"):
            say(f"{component} is already running (pid {process['pid']})")
            return
        start_component_locked(state, component)
        say(f"started {component} (pid {state['processes'][component]['pid']})")
        after_api_server_start(state, component)


def running_state(component: str) -> dict[str, Any]:
    state = read_state()
    if state is None:
        raise ToolError("the dev cluster is not running")
    if component not in state["processes"]:
        raise ToolError(f"unknown component {component}; one of {', '.join(state['processes'])}")
    return state


def stop_component_locked(state: dict[str, Any], component: str) -> None:
    # kube-apiserver stops listening at once but may linger on open watch connections.
    stop_processes({component: state["processes"][component]}, timeout=5.0)


def start_component_locked(state: dict[str, Any], component: str) -> None:
    """Spawns `component` with its recorded command line (clearing `stopped`) and waits until it serves."""
    processes: dict[str, Any] = state["processes"]
    process = processes[component]
    cwd = Path(process["cwd"]) if process.get("cwd") else None
    spawn(component, Path(process["binary"]), list(process["args"]), processes, cwd=cwd)
    if component == "kube-apiserver":
        context = admin_ssl_context(RUN / "pki")
        wait_for("kube-apiserver /readyz", lambda: http_ok(f"{state['server']}/readyz", context), processes)
    elif component == "etcd":
        url = f"http://127.0.0.1:{state['ports']['etcd']}/health"
        wait_for("etcd /health", lambda: http_ok(url, expect='"health":"true"'), processes)
    elif component in ("kube-controller-manager", "kube-scheduler"):
        # Serving means it got past reading its authentication settings from the API server, which it
        # does once at start (and exits if that fails): an outage right after a restart must not kill it.
        url = f"https://127.0.0.1:{state['ports'][component]}/healthz"
        wait_for(f"{component} /healthz", lambda: http_ok(url, self_signed_context()), processes)
    elif component in OPTIONAL_PROCESSES:
        optional.wait_ready(state, component)
    elif component in NODE_COMPONENTS:
        realnode.wait_ready(state, component)
    elif component in NETWORK_POLICY_COMPONENTS:
        netpolicies.wait_ready(state, component)
    elif component == REGISTRY:
        registry.wait_ready(state)
