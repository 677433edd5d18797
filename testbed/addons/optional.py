"""Optional components on the dev cluster, added only when asked for: `up --with kueue,coscheduling`.

Why: only some tests and demos need Kueue (testbed/addons/kueue.py), the coscheduling scheduler
(testbed/addons/coscheduling.py) or Volcano (testbed/addons/volcano.py: two processes); building them
costs minutes the first time and running them costs memory, so a cluster has them only when someone
asks, on `up` or later on a running cluster (the test session asks for what its tests need). Each
is built (or taken from the cache) by hack/kube-bins.sh before the cluster lock is taken, its CRDs
come from the same module, and its process (each of Volcano's two) is one more component in
state.json: `status` lists it, `restart|stop|start <name>` work on it, `down` stops it,
and a restarted API server restarts it too (lifecycle.after_api_server_start). `state.json`'s
`optional` remembers what was added, so a cluster rebuilt after a crash gets it back. MultiKueue's
worker cluster (testbed/addons/multikueue.py) is a control plane of its own rather than a process:
`down` takes it down with the cluster.

On a fresh `up`, their CRDs are installed with the project's, before the garbage collector starts.
Added to a running cluster, the garbage collector picks the new kinds up at its next discovery
refresh (within 30 s); until then, deleting an owner does not cascade to those kinds.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from testbed.addons import coscheduling, kueue, mlflow, multikueue, volcano
from testbed.cluster import kube_bins
from testbed.cluster.pki import issue, self_signed_context
from testbed.cluster.processes import kubectl, spawn, stop_processes, wait_for
from testbed.cluster.state import (
    LOGS,
    MLFLOW,
    MULTIKUEUE,
    NETWORK_POLICIES,
    REAL_NODE,
    REGISTRY,
    RUN,
    WITH_CHOICES,
    read_versions,
    record_started,
    say,
    write_state,
)
from testbed.common import ToolError, free_ports, http_ok, wait_until
from testbed.node import netpolicies, nodeimages, realnode, registry

OPTIONAL: Final = WITH_CHOICES
BUILDS: Final = {
    coscheduling.NAME: coscheduling.BUILD,
    kueue.NAME: kueue.BUILD,
    netpolicies.NAME: netpolicies.BUILD,
    registry.NAME: registry.BUILD,
    volcano.NAME: volcano.BUILD,
}
# Kubeflow's training-operator: built for the bench's side-by-side runs (testbed/harness/bench), never
# added to the dev cluster.
KUBEFLOW_TRAINING_OPERATOR: Final = "training-operator"
# What each optional part needs hack/kube-bins.sh to build, by the name tests and the harness know it by.
BUILDS_BY_NAME: Final = {**BUILDS, KUBEFLOW_TRAINING_OPERATOR: KUBEFLOW_TRAINING_OPERATOR}


def parse_with(text: str) -> list[str]:
    """`--with a,b`: known names, in the order given, without repeats; network-policies, the
    registry and mlflow bring the real node, which they run on, before them, and multikueue brings
    Kueue (the manager's, which its worker cluster is connected to)."""
    names: list[str] = []
    for name in (part.strip() for part in text.split(",")):
        if not name or name in names:
            continue
        if name not in OPTIONAL:
            raise ToolError(f"unknown optional component {name!r}; one of: {', '.join(OPTIONAL)}")
        if name in (NETWORK_POLICIES, REGISTRY, MLFLOW) and REAL_NODE not in names:
            names.append(REAL_NODE)
        if name == MULTIKUEUE and kueue.NAME not in names:
            names.append(kueue.NAME)
        names.append(name)
    return names


def build(names: list[str], node_images: tuple[str, ...] = nodeimages.IMAGES) -> dict[str, Path]:
    """Each component's cache directory (hack/kube-bins.sh ensure): built the first time, then cached,
    the control plane's first (each runs on it). The real node's several binaries and images are built
    here too (its entry is the kubelet's directory; `add` finds the others in the cache again); its
    images meanwhile, in a thread: their cold build is mostly disk and network, the Go builds' CPU,
    and together they take the time of the longer instead of the sum (`make test` and `make demo` on
    a fresh machine). The real node's images are `node_images` (realnode.selected_images)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        images = pool.submit(realnode.build_images, node_images) if REAL_NODE in names else None
        kube_bins.ensure()
        built = {
            name: realnode.build_binaries()["kubelet"]
            if name == REAL_NODE
            else mlflow.build()
            if name == MLFLOW
            else kube_bins.ensure(kueue.BUILD)  # the worker cluster's Kueue is the same build
            if name == MULTIKUEUE
            else kube_bins.ensure(BUILDS[name])
            for name in names
        }
        if images is not None:
            images.result()
    return built


def crd_files(name: str, build_dir: Path) -> list[Path]:
    if name in (REAL_NODE, NETWORK_POLICIES, REGISTRY, MLFLOW, MULTIKUEUE):
        return []
    if name == kueue.NAME:
        return sorted((build_dir / kueue.CRD_DIR).glob("*.yaml"))
    if name == volcano.NAME:
        return sorted((build_dir / volcano.CRD_DIR).glob("*.yaml"))
    return [build_dir / path for path in coscheduling.CRD_FILES]


def install_crds(bin_dir: Path, name: str, build_dir: Path) -> None:
    """Applies the component's CRDs (server-side: Kueue's Workload CRD is larger than a client-side
    apply's annotation may be; unchanged ones are left as they are) and waits until they are Established."""
    files = [argument for path in crd_files(name, build_dir) for argument in ("-f", str(path))]
    if not files:
        return
    crds = kubectl(bin_dir, "apply", "--server-side", "--force-conflicts", *files, "-o", "name").split()
    wait_until(f"{name}'s CRDs Established", lambda: established(bin_dir, crds), timeout=60)
    say(f"{name}: {len(crds)} CRD(s) applied and Established")


def established(bin_dir: Path, crds: list[str]) -> bool:
    """`kubectl wait --for=condition=Established` fails instead of waiting while a new CRD has no
    conditions yet, so this polls."""
    found = json.loads(kubectl(bin_dir, "get", *crds, "-o", "json", check=False) or "{}")
    items = found.get("items", []) if found.get("kind") == "List" else [found]  # one name: the object
    return len(items) == len(crds) and all(
        any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (item.get("status") or {}).get("conditions") or []
        )
        for item in items
    )


def add(
    state: dict[str, Any],
    build_dirs: dict[str, Path],
    *,
    crds_installed: bool = False,
    node_images: tuple[str, ...] = nodeimages.IMAGES,
) -> None:
    """Makes every component in `build_dirs` run on the cluster of `state`: its CRDs applied (unless
    `crds_installed`), its process started and serving (the real node with `node_images`). One that
    already runs is left alone, but its CRDs are applied again (a test may have taken one away)."""
    bin_dir = Path(state["bin_dir"])
    processes: dict[str, Any] = state["processes"]
    for name, build_dir in build_dirs.items():
        if name == REAL_NODE:
            add_real_node(state, node_images)
            continue
        if name == NETWORK_POLICIES:
            netpolicies.add(state, build_dir)
            continue
        if name == REGISTRY:
            registry.add(state, build_dir)
            continue
        if name == MLFLOW:
            mlflow.add(state)
            continue
        if name == MULTIKUEUE:
            multikueue.add(state)
            continue
        if not crds_installed:
            install_crds(bin_dir, name, build_dir)
        if name in processes:
            say(f"{name} is already running (pid {processes[name]['pid']})")
            continue
        try:
            if name == kueue.NAME:
                start_kueue(state, build_dir)
            elif name == volcano.NAME:
                start_volcano(state, build_dir)
            else:
                start_coscheduling(state, build_dir)
        except BaseException:
            # Not left behind as a dead component, which would make the next `up` rebuild the cluster.
            say(f"{name} did not start; stopping it (log {LOGS / name}.log)")
            started = (name, volcano.CONTROLLERS) if name == volcano.NAME else (name,)
            stop_processes({n: processes.pop(n) for n in started if n in processes})
            write_state("processes", processes)
            raise
        record_started(state, name, {version_key(name): read_versions(build_dir)["VERSION"]})


def add_real_node(state: dict[str, Any], images: tuple[str, ...] = nodeimages.IMAGES) -> None:
    """Starts the real node with `images`; on a node that runs already, imports those of them not
    there yet or whose build changed since (the operator's image follows the operator's code), so
    the node runs what the tree builds."""
    if state.get("real_node"):
        say(f"{REAL_NODE} is already running")
        realnode.import_images(realnode.build(images), images)
        return
    realnode.add(state, realnode.build(images), images)
    state.setdefault("versions", {}).update(realnode.versions())
    write_state("versions", state["versions"])


def version_key(name: str) -> str:
    return f"{BUILDS[name].upper().replace('-', '_')}_VERSION"


def record_ports(state: dict[str, Any], ports: dict[str, int]) -> None:
    state["ports"].update(ports)
    write_state("ports", state["ports"])


def start_coscheduling(state: dict[str, Any], build_dir: Path) -> None:
    (port,) = free_ports(1)
    record_ports(state, {coscheduling.NAME: port})
    directory = RUN / coscheduling.NAME
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "scheduler-config.json"
    config.write_text(json.dumps(coscheduling.scheduler_configuration(), indent=2))
    args = coscheduling.scheduler_args(port, config)
    spawn(coscheduling.NAME, build_dir / coscheduling.BUILD, args, state["processes"])
    wait_ready(state, coscheduling.NAME)
    say(f"coscheduling: scheduler-plugins runs as scheduler {coscheduling.SCHEDULER_NAME!r}")


def start_volcano(state: dict[str, Any], build_dir: Path) -> None:
    """Volcano's scheduler, then its queue controller (testbed/addons/volcano.py)."""
    scheduler_health, scheduler_metrics, controllers_health = free_ports(3)
    record_ports(
        state,
        {
            volcano.NAME: scheduler_health,
            f"{volcano.NAME}-metrics": scheduler_metrics,
            volcano.CONTROLLERS: controllers_health,
        },
    )
    directory = RUN / volcano.NAME
    directory.mkdir(parents=True, exist_ok=True)
    conf = directory / "scheduler.conf"
    conf.write_text(volcano.SCHEDULER_CONF)
    args = volcano.scheduler_args(healthz_port=scheduler_health, metrics_port=scheduler_metrics, conf=conf)
    spawn(volcano.NAME, build_dir / volcano.SCHEDULER_BINARY, args, state["processes"])
    wait_ready(state, volcano.NAME)
    args = volcano.controllers_args(healthz_port=controllers_health)
    spawn(volcano.CONTROLLERS, build_dir / volcano.CONTROLLERS_BINARY, args, state["processes"])
    wait_ready(state, volcano.CONTROLLERS)
    say(f"volcano: its scheduler runs as {volcano.SCHEDULER_NAME!r}, with its queue controller")


def start_kueue(state: dict[str, Any], build_dir: Path) -> None:
    bin_dir = Path(state["bin_dir"])
    webhook_port, health_port, metrics_port = free_ports(3)
    record_ports(
        state, {kueue.NAME: webhook_port, "kueue-health": health_port, "kueue-metrics": metrics_port}
    )
    pki = RUN / "pki"
    issue(
        pki,
        "kueue",
        "/CN=kueue-webhook",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
    )
    directory = RUN / kueue.NAME
    layer = directory / "etc"  # shown over /etc to the manager: its metrics certificate's fixed path
    certs = layer / kueue.METRICS_CERT_DIR
    certs.mkdir(parents=True, exist_ok=True)
    (certs / "tls.crt").write_bytes((pki / "kueue.crt").read_bytes())
    (certs / "tls.key").write_bytes((pki / "kueue.key").read_bytes())
    config = directory / "configuration.json"
    settings = kueue.configuration(
        webhook_port=webhook_port, health_port=health_port, metrics_port=metrics_port, cert_dir=certs
    )
    config.write_text(json.dumps(settings, indent=2))
    kubectl(bin_dir, "create", "namespace", kueue.NAMESPACE, check=False)
    binary, args = kueue.private_etc_command(layer, build_dir / kueue.BUILD, kueue.manager_args(config))
    spawn(kueue.NAME, binary, args, state["processes"])
    wait_ready(state, kueue.NAME)
    ca_bundle = (pki / "ca.crt").read_bytes()
    install_conversion(bin_dir, webhook_port, ca_bundle)
    install_webhooks(bin_dir, build_dir, webhook_port, ca_bundle)


def install_conversion(bin_dir: Path, webhook_port: int, ca_bundle: bytes) -> None:
    """Points the CRDs whose versions Kueue converts at its webhook (a new port at every start)."""
    patch = json.dumps(kueue.conversion_patch(webhook_port=webhook_port, ca_bundle=ca_bundle))
    for crd in kueue.CONVERTED_CRDS:
        kubectl(bin_dir, "patch", "crd", crd, "--type=merge", "-p", patch)
    say(f"kueue: {len(kueue.CONVERTED_CRDS)} CRDs convert through https://127.0.0.1:{webhook_port}")


def install_webhooks(bin_dir: Path, build_dir: Path, webhook_port: int, ca_bundle: bytes) -> None:
    """Kueue's webhook configurations, generated from the module's manifests (kubectl reads the YAML)."""
    manifests = kubectl(
        bin_dir, "create", "--dry-run=client", "-o", "json", "-f", str(build_dir / kueue.WEBHOOK_MANIFESTS)
    )
    configurations, skipped = kueue.webhook_configurations(
        json_documents(manifests), webhook_port=webhook_port, ca_bundle=ca_bundle
    )
    listing = {"apiVersion": "v1", "kind": "List", "items": configurations}
    kubectl(bin_dir, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(listing))
    count = sum(len(configuration["webhooks"]) for configuration in configurations)
    say(
        f"kueue: {count} webhooks at https://127.0.0.1:{webhook_port}; "
        f"left out (integrations off): {len(skipped)}"
    )


def json_documents(text: str) -> list[dict[str, Any]]:
    """The objects of kubectl's `-o json` output for several inputs: JSON documents one after another."""
    decoder = json.JSONDecoder()
    documents: list[dict[str, Any]] = []
    position = 0
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        document, position = decoder.raw_decode(text, position)
        documents.append(document)
    return documents


def wait_ready(state: dict[str, Any], name: str) -> None:
    """Waits until the component serves: the scheduler's /healthz, Kueue's /readyz (which waits for
    its webhook server)."""
    processes: dict[str, Any] = state["processes"]
    if name == kueue.NAME:
        url = f"http://127.0.0.1:{state['ports']['kueue-health']}/readyz"
        wait_for(f"{name} {url}", lambda: http_ok(url), processes)
    elif name in (volcano.NAME, volcano.CONTROLLERS):
        url = volcano.health_url(state, name)
        wait_for(f"{name} /healthz", lambda: http_ok(url), processes)
    else:
        url = f"https://127.0.0.1:{state['ports'][name]}/healthz"
        wait_for(f"{name} /healthz", lambda: http_ok(url, self_signed_context()), processes)
