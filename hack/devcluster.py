"""A real Kubernetes control plane on 127.0.0.1, for development, tests and the demo.

Why: the operator's behaviour is a conversation with an API server (admission, schema and CEL
validation, resourceVersion conflicts, watch expiry, RBAC, garbage collection). Mocks would let tests
pass while the operator breaks, and these machines have no container engine. So this script runs the
real etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from Go modules by
hack/kube-bins.sh, with kwok playing the kubelets of fake GPU nodes.

Standard library only: it runs before any project dependency is installed.

    python3 hack/devcluster.py up|down|status|env      (normally through hack/dev-cluster.sh)
    python3 hack/devcluster.py restart|stop|start <component>
    python3 hack/devcluster.py run <name> [--wait-http URL] -- <command...>
    python3 hack/devcluster.py stop <name>

`stop <component>` takes one component down on purpose (an API server outage for as long as a test
needs) and `start <component>` brings it back with the same flags and port. A component stopped on
purpose is not a crash: `status` still exits 0 and `up` leaves it stopped (another session's `up`
must not end a test's outage early) instead of rebuilding the whole cluster, unless the stop is older
than STOP_EXPIRY (whoever stopped it is gone): then `up` starts it again.

`run <name> -- <command...>` starts a long-lived development process that belongs with the cluster
(the demo's operator and local kubelet): recorded in state.json by pid and kernel start time, its
output in .dev/logs/<name>.log, stopped by `stop <name>` and, before the components, by `down`. A
second `run` of the same name and command while it runs is a no-op, so scripts can call it again.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEV = Path(os.environ.get("TJ_DEV_DIR", REPO / ".dev"))
RUN = DEV / "run"
LOGS = DEV / "logs"
STATE = RUN / "state.json"
KUBECONFIG = DEV / "kubeconfig"
KUBECTL_LINK = DEV / "bin" / "kubectl"
LOCK = DEV / "cluster.lock"
STAGES = REPO / "hack" / "kwok-stages.yaml"
KWOK_CONFIG = REPO / "hack" / "kwok-config.yaml"
# etcd keeps its data on tmpfs (in a fresh private directory) for speed; the cluster is disposable.
SHM = Path("/dev/shm")  # noqa: S108
CRD_DIR = REPO / "crd"
KWOK_NODE_LABEL = "kwok.x-k8s.io/managed"
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.0.0.1/16"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
START_TIMEOUT = 90.0
STOP_TIMEOUT = 15.0
# A component stopped on purpose longer ago than this was forgotten (its test was killed): `up` starts it.
STOP_EXPIRY = 300.0
# Extra processes get longer: the local kubelet stops its trainers and reports their pods first.
EXTRA_STOP_TIMEOUT = 30.0
EXTRA_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")

_started = time.monotonic()


def say(message: str) -> None:
    elapsed = time.monotonic() - _started
    print(
        f"[dev-cluster {int(elapsed) // 60:2d}m{int(elapsed) % 60:02d}s] {message}",
        file=sys.stderr,
        flush=True,
    )


class ClusterError(Exception):
    """A failure with a message meant for the person at the terminal."""


@dataclass(frozen=True)
class NodeShape:
    count: int
    gpus: int
    cpu: str
    memory: str
    gpu_product: str


# ---------------------------------------------------------------------------------------------- state


def read_state() -> dict[str, Any] | None:
    try:
        data = json.loads(STATE.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/<pid>/stat); None if it is gone or a zombie.

    Together with the pid it identifies the process we started even if the pid is later reused.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    if fields[0] == "Z":
        return None
    return fields[19]


def pid_alive(process: dict[str, Any]) -> bool:
    started = process_start_time(int(process["pid"]))
    return started is not None and started == process.get("start_time", started)


def dead_components(state: dict[str, Any]) -> list[str]:
    """Components that should run but do not (crashed or killed); those stopped on purpose are not dead."""
    return [
        name
        for name, proc in state.get("processes", {}).items()
        if not proc.get("stopped") and not pid_alive(proc)
    ]


def stopped_components(state: dict[str, Any]) -> list[str]:
    """Components taken down with `stop`, waiting for `start`."""
    return [name for name, proc in state.get("processes", {}).items() if proc.get("stopped")]


def abandoned_components(state: dict[str, Any]) -> list[str]:
    """Components stopped on purpose more than STOP_EXPIRY seconds ago."""
    now = time.time()
    return [
        name
        for name, proc in state.get("processes", {}).items()
        if proc.get("stopped") and now - float(proc.get("stopped_at", 0.0)) > STOP_EXPIRY
    ]


@contextlib.contextmanager
def cluster_lock() -> Iterator[None]:
    """Serialises `up` and `down`: a second `up` waits for the first, then finds the cluster running."""
    DEV.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another dev-cluster command is running; waiting for it to finish")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


# ----------------------------------------------------------------------------------------- binaries


def ensure_binaries() -> Path:
    script = REPO / "hack" / "kube-bins.sh"
    result = subprocess.run([str(script), "ensure"], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError("building the control plane binaries failed (see the messages above)")
    return Path(result.stdout.strip().splitlines()[-1])


def read_versions(bin_dir: Path) -> dict[str, str]:
    versions: dict[str, str] = {}
    for line in (bin_dir / "VERSIONS").read_text().splitlines():
        key, _, value = line.partition("=")
        versions[key] = value
    return versions


# ---------------------------------------------------------------------------------------------- PKI


def openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def make_pki(pki: Path) -> None:
    """A CA per cluster, a serving certificate for 127.0.0.1, an admin client certificate and the
    service-account token signing key pair."""
    pki.mkdir(parents=True)
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=trainingjob-dev-ca",
        cwd=pki,
    )
    sans = (
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    )
    issue(pki, "apiserver", "/CN=kube-apiserver", f"{sans}\nextendedKeyUsage=serverAuth,clientAuth")
    issue(pki, "admin", "/O=system:masters/CN=dev-admin", "extendedKeyUsage=clientAuth")
    openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def issue(pki: Path, name: str, subject: str, extensions: str) -> None:
    (pki / f"{name}.ext").write_text(extensions + "\n")
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
        cwd=pki,
    )
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "365",
        "-extfile",
        f"{name}.ext",
        cwd=pki,
    )


def kubeconfig_text(server: str, pki: Path) -> str:
    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "trainingjob-dev",
                "cluster": {"server": server, "certificate-authority-data": b64("ca.crt")},
            }
        ],
        "users": [
            {
                "name": "dev-admin",
                "user": {"client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")},
            }
        ],
        "contexts": [
            {"name": "trainingjob-dev", "context": {"cluster": "trainingjob-dev", "user": "dev-admin"}}
        ],
        "current-context": "trainingjob-dev",
    }
    return json.dumps(config, indent=2)


# -------------------------------------------------------------------------------------- processes


def free_ports(count: int) -> list[int]:
    """Ports the kernel just handed out on 127.0.0.1; held open together so they are distinct."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def spawn(name: str, binary: Path, args: list[str], processes: dict[str, Any]) -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"{name}.log"
    with log_path.open("ab") as log:
        log.write(f"\n===== {time.strftime('%Y-%m-%dT%H:%M:%S')} {binary.name} {' '.join(args)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [str(binary), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=RUN,
        )
    processes[name] = {
        "pid": proc.pid,
        "start_time": process_start_time(proc.pid),
        "binary": str(binary),
        "args": args,
        "log": str(log_path),
    }
    write_state_processes(processes)


def write_state_processes(processes: dict[str, Any]) -> None:
    state = read_state() or {}
    state["processes"] = processes
    STATE.write_text(json.dumps(state, indent=2))


def wait_until(
    what: str,
    check: Callable[[], bool],
    processes: dict[str, Any],
    timeout: float = START_TIMEOUT,
    interval: float = 0.2,
) -> None:
    """Polls `check` until it holds; fails fast, naming the component and its log, if one died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = dead_components({"processes": processes})
        if dead:
            name = dead[0]
            raise ClusterError(
                f"{name} exited while waiting for {what}; last lines of {processes[name]['log']}:\n"
                + tail(Path(processes[name]["log"]))
            )
        if check():
            return
        time.sleep(interval)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; logs in {LOGS}")


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def http_ok(url: str, context: ssl.SSLContext | None = None, expect: str = "ok") -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:  # noqa: S310
            return expect in response.read().decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def admin_ssl_context(pki: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return context


def self_signed_context() -> ssl.SSLContext:
    """For the health checks of components that serve a certificate they generated in memory."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def kubectl(bin_dir: Path, *args: str, stdin: str | None = None, check: bool = True) -> str:
    result = subprocess.run(
        [str(bin_dir / "kubectl"), "--kubeconfig", str(KUBECONFIG), *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if check and result.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def stop_processes(processes: dict[str, Any], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM every process we started (newest first), then SIGKILL what is left after a grace period."""
    alive = {name: proc for name, proc in processes.items() if pid_alive(proc)}
    for name in reversed(list(alive)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(alive[name]["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        alive = {name: proc for name, proc in alive.items() if pid_alive(proc)}
        time.sleep(0.1)
    for name, proc in alive.items():
        say(f"{name} (pid {proc['pid']}) ignored SIGTERM for {timeout:.0f}s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc["pid"], signal.SIGKILL)
    deadline = time.monotonic() + STOP_TIMEOUT
    while any(pid_alive(p) for p in alive.values()) and time.monotonic() < deadline:
        time.sleep(0.1)


# --------------------------------------------------------------------------------------------- up


def node_manifest(name: str, shape: NodeShape) -> dict[str, Any]:
    resources = {
        "cpu": shape.cpu,
        "memory": shape.memory,
        "pods": "110",
        "nvidia.com/gpu": str(shape.gpus),
        "ephemeral-storage": "1Ti",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                KWOK_NODE_LABEL: "true",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "node-type": "gpu",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": shape.gpu_product,
                "nvidia.com/gpu.count": str(shape.gpus),
                "nvidia.com/gpu.memory": "81920",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def up(shape: NodeShape) -> None:
    with cluster_lock():
        state = read_state()
        if state:
            dead = dead_components(state)
            if not dead:
                for component in abandoned_components(state):
                    say(f"{component} was stopped on purpose over {STOP_EXPIRY:.0f}s ago; starting it again")
                    start_component_locked(state, component)
                for component in stopped_components(state):
                    say(f"{component} is stopped on purpose; `hack/dev-cluster.sh start {component}`")
                say(
                    f"already running (API server {state['server']}); `hack/dev-cluster.sh status` tells more"
                )
                return
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
        bin_dir = ensure_binaries()
        start(bin_dir, shape)


def start(bin_dir: Path, shape: NodeShape) -> None:
    say(f"starting the control plane from {bin_dir}")
    RUN.mkdir(parents=True)
    etcd_data = Path(tempfile.mkdtemp(prefix="trainingjob-etcd-", dir=SHM if SHM.is_dir() else None))
    (etcd_client, etcd_peer, apiserver, kcm, scheduler, kwok_port) = free_ports(6)
    server = f"https://127.0.0.1:{apiserver}"
    STATE.write_text(
        json.dumps(
            {
                "server": server,
                "bin_dir": str(bin_dir),
                "etcd_data": str(etcd_data),
                "run_dir": str(RUN),
                "versions": read_versions(bin_dir),
                "nodes": shape.count,
                "started": time.time(),
                "processes": {},
                "ports": {
                    "etcd": etcd_client,
                    "etcd-peer": etcd_peer,
                    "kube-apiserver": apiserver,
                    "kube-controller-manager": kcm,
                    "kube-scheduler": scheduler,
                    "kwok": kwok_port,
                },
            },
            indent=2,
        )
    )
    processes: dict[str, Any] = {}
    try:
        pki = RUN / "pki"
        make_pki(pki)
        KUBECONFIG.write_text(kubeconfig_text(server, pki))
        KUBECONFIG.chmod(0o600)
        KUBECTL_LINK.parent.mkdir(parents=True, exist_ok=True)
        KUBECTL_LINK.unlink(missing_ok=True)
        KUBECTL_LINK.symlink_to(bin_dir / "kubectl")

        etcd_url = f"http://127.0.0.1:{etcd_client}"
        spawn(
            "etcd",
            bin_dir / "etcd",
            [
                "--name=dev",
                f"--data-dir={etcd_data}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=dev=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
            processes,
        )
        wait_until("etcd /health", lambda: http_ok(f"{etcd_url}/health", expect='"health":"true"'), processes)
        say("etcd is healthy")

        spawn(
            "kube-apiserver",
            bin_dir / "kube-apiserver",
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={apiserver}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--endpoint-reconciler-type=none",
                f"--cert-dir={RUN / 'apiserver-certs'}",
                "--allow-privileged=true",
                "--profiling=false",
                "--enable-priority-and-fairness=true",
                "--max-requests-inflight=2000",
                "--max-mutating-requests-inflight=1000",
                "--v=1",
            ],
            processes,
        )
        context = admin_ssl_context(pki)
        wait_until("kube-apiserver /readyz", lambda: http_ok(f"{server}/readyz", context), processes)
        say("kube-apiserver is ready")

        crds = sorted(CRD_DIR.glob("*.yaml")) if CRD_DIR.is_dir() else []
        crds = [path for path in crds if path.name != "kustomization.yaml"]
        for path in crds:
            kubectl(bin_dir, "apply", "--server-side", "--force-conflicts", "-f", str(path))
        if crds:
            say(f"installed {len(crds)} CRD file(s) from crd/ before the garbage collector starts")

        kubeconfig = str(KUBECONFIG)
        spawn(
            "kube-controller-manager",
            bin_dir / "kube-controller-manager",
            [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm}",
                "--leader-elect=false",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                "--use-service-account-credentials=false",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--controllers=*,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--concurrent-gc-syncs=40",
                # After an API server restart the controller manager's informers sit out client-go's
                # relist backoff (measured: about 40 s after it was back); with the default 50 s grace the
                # node lifecycle controller then marks every node NotReady for a moment, which gang-
                # restarts every running TrainingJob of everyone sharing the cluster.
                "--node-monitor-grace-period=2m",
                "--v=1",
            ],
            processes,
        )
        spawn(
            "kube-scheduler",
            bin_dir / "kube-scheduler",
            [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={scheduler}",
                "--leader-elect=false",
                # The default client QPS of 50 would make binding 2,000 pods take 40 s (make bench).
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--v=1",
            ],
            processes,
        )
        spawn(
            "kwok",
            bin_dir / "kwok",
            [
                f"--kubeconfig={kubeconfig}",
                f"--manage-nodes-with-label-selector={KWOK_NODE_LABEL}=true",
                f"--config={STAGES}",
                f"--config={KWOK_CONFIG}",
                f"--cidr={POD_CIDR}",
                "--node-ip=10.1.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{kwok_port}",
            ],
            processes,
        )

        nodes = [node_manifest(f"gpu-node-{index}", shape) for index in range(shape.count)]
        kubectl(
            bin_dir,
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}),
        )
        wait_until(f"{shape.count} Ready nodes", lambda: ready_nodes(bin_dir) >= shape.count, processes)
        wait_until(
            "the default ServiceAccount",
            lambda: bool(
                kubectl(
                    bin_dir, "get", "serviceaccount", "default", "-n", "default", "-o", "name", check=False
                )
            ),
            processes,
        )
        say(f'ready: {shape.count} nodes x {shape.gpus} nvidia.com/gpu; `eval "$(hack/dev-cluster.sh env)"`')
    except BaseException:
        say("start failed; stopping what was started")
        teardown(read_state() or {"processes": processes, "etcd_data": str(etcd_data)})
        raise


def ready_nodes(bin_dir: Path) -> int:
    out = kubectl(bin_dir, "get", "nodes", "-o", "json", check=False)
    try:
        items = json.loads(out).get("items", [])
    except ValueError:
        return 0
    ready = 0
    for node in items:
        conditions = node.get("status", {}).get("conditions", [])
        taints = node.get("spec", {}).get("taints", [])
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) and not any(
            t.get("key") == "node.kubernetes.io/not-ready" for t in taints
        ):
            ready += 1
    return ready


# ------------------------------------------------------------------------------------------- down


def teardown(state: dict[str, Any]) -> None:
    extras = state.get("extras", {})
    if extras:
        # Before the API server goes: they may still talk to it on their way out.
        say(f"stopping {', '.join(extras)}")
        stop_processes(extras, timeout=EXTRA_STOP_TIMEOUT)
    stop_processes(state.get("processes", {}))
    etcd_data = state.get("etcd_data")
    if etcd_data:
        shutil.rmtree(etcd_data, ignore_errors=True)
    shutil.rmtree(RUN, ignore_errors=True)


def down() -> None:
    with cluster_lock():
        state = read_state()
        if state is None and not RUN.exists():
            say("nothing running")
            return
        teardown(state or {})
        say("stopped; every process this cluster started has exited")


# ----------------------------------------------------------------------------------- status / env


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
            f"{k.removesuffix('_VERSION').lower()} {v}" for k, v in versions.items() if k.endswith("_VERSION")
        )
    )
    print(f"binaries:    {state['bin_dir']}")
    print(f"logs:        {LOGS}/<component>.log")
    for name, proc in state.get("processes", {}).items():
        alive = pid_alive(proc)
        port = state.get("ports", {}).get(name, "")
        condition = "running" if alive else "stopped" if proc.get("stopped") else "NOT RUNNING"
        print(f"  {name:<24} pid {proc['pid']:<8} {condition:<12} 127.0.0.1:{port}  {proc['log']}")
    extras = state.get("extras", {})
    if extras:
        print("dev processes (`hack/dev-cluster.sh stop <name>`; `down` stops them first):")
    for name, proc in extras.items():
        condition = "running" if pid_alive(proc) else "EXITED"
        print(f"  {name:<24} pid {proc['pid']:<8} {condition:<12} {proc['log']}")
    return 0 if not dead else 1


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
    """Restarts the controller manager and the scheduler once a (re)started API server serves. Their
    informers, cut off by the outage, otherwise sit out client-go's relist backoff, which grows with
    every restart less than two minutes after the last: measured up to a minute and a half in which no
    new pod got a node and no new namespace its default ServiceAccount, so one test of an API server
    outage stalled the tests after it. kwok needs no restart: it picks pods up at once."""
    if component != "kube-apiserver":
        return
    for dependent in ("kube-controller-manager", "kube-scheduler"):
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
        write_state_processes(processes)
        say(f"stopped {component}; `hack/dev-cluster.sh start {component}` brings it back")


def start_one(component: str) -> None:
    """Starts a component taken down by `stop` (or found dead) with its old command line and port."""
    with cluster_lock():
        state = running_state(component)
        process = state["processes"][component]
        if pid_alive(process) and not process.get("stopped"):
            say(f"{component} is already running (pid {process['pid']})")
            return
        start_component_locked(state, component)
        say(f"started {component} (pid {state['processes'][component]['pid']})")
        after_api_server_start(state, component)


def running_state(component: str) -> dict[str, Any]:
    state = read_state()
    if state is None:
        raise ClusterError("the dev cluster is not running")
    if component not in state["processes"]:
        raise ClusterError(f"unknown component {component}; one of {', '.join(state['processes'])}")
    return state


def stop_component_locked(state: dict[str, Any], component: str) -> None:
    # kube-apiserver stops listening at once but may linger on open watch connections.
    stop_processes({component: state["processes"][component]}, timeout=5.0)


def start_component_locked(state: dict[str, Any], component: str) -> None:
    """Spawns `component` with its recorded command line (clearing `stopped`) and waits until it serves."""
    processes: dict[str, Any] = state["processes"]
    process = processes[component]
    spawn(component, Path(process["binary"]), list(process["args"]), processes)
    if component == "kube-apiserver":
        context = admin_ssl_context(RUN / "pki")
        wait_until("kube-apiserver /readyz", lambda: http_ok(f"{state['server']}/readyz", context), processes)
    elif component == "etcd":
        url = f"http://127.0.0.1:{state['ports']['etcd']}/health"
        wait_until("etcd /health", lambda: http_ok(url, expect='"health":"true"'), processes)
    elif component in ("kube-controller-manager", "kube-scheduler"):
        # Serving means it got past reading its authentication settings from the API server, which it
        # does once at start (and exits if that fails): an outage right after a restart must not kill it.
        url = f"https://127.0.0.1:{state['ports'][component]}/healthz"
        wait_until(f"{component} /healthz", lambda: http_ok(url, self_signed_context()), processes)


# ------------------------------------------------------------------------------- extra processes


def run_extra(name: str, command: list[str], wait_http: str | None, timeout: float, replace: bool) -> None:
    """Starts `command` as the registered dev process `name` (a no-op when it already runs it), then
    optionally waits until `wait_http` answers 200."""
    if name in COMPONENTS or not EXTRA_NAME.match(name):
        raise ClusterError(
            f"{name!r} cannot name a dev process (lower-case letters, digits, dashes; no component)"
        )
    if not command:
        raise ClusterError("no command given: `run <name> -- <command...>`")
    with cluster_lock():
        state = read_state()
        if state is None:
            raise ClusterError("the dev cluster is not running; start it with `hack/dev-cluster.sh up`")
        extras: dict[str, Any] = state.setdefault("extras", {})
        current = extras.get(name)
        if current and pid_alive(current) and current.get("command") == command and not replace:
            say(f"{name} is already running (pid {current['pid']}); log {current['log']}")
        else:
            if current and pid_alive(current):
                if not replace:
                    raise ClusterError(
                        f"{name} already runs another command (pid {current['pid']}): "
                        f"`hack/dev-cluster.sh stop {name}` first, or `run --replace`"
                    )
                say(f"stopping {name} (pid {current['pid']}) to replace it")
                stop_processes({name: current}, timeout=EXTRA_STOP_TIMEOUT)
            extras[name] = spawn_extra(name, command)
            write_extras(extras)
            say(f"started {name} (pid {extras[name]['pid']}); log {extras[name]['log']}")
        process = extras[name]
    if wait_http:
        wait_until(f"{name} at {wait_http}", lambda: http_ok(wait_http, expect=""), {name: process}, timeout)
        say(f"{name} is ready ({wait_http})")


def spawn_extra(name: str, command: list[str]) -> dict[str, Any]:
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / f"{name}.log"
    with log_path.open("ab") as log:
        log.write(f"\n===== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(command)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as error:
            raise ClusterError(f"cannot start {name}: {error}") from error
    return {
        "pid": proc.pid,
        "start_time": process_start_time(proc.pid),
        "command": command,
        "cwd": os.getcwd(),
        "log": str(log_path),
        "started": time.time(),
    }


def write_extras(extras: dict[str, Any]) -> None:
    state = read_state() or {}
    state["extras"] = extras
    STATE.write_text(json.dumps(state, indent=2))


def stop_extra(name: str) -> None:
    """Stops the dev process `name` (SIGTERM, SIGKILL after a grace period); a no-op when none runs."""
    with cluster_lock():
        state = read_state()
        extras: dict[str, Any] = (state or {}).get("extras", {})
        process = extras.pop(name, None)
        if process is None:
            say(f"{name} is not running")
            return
        stop_processes({name: process}, timeout=EXTRA_STOP_TIMEOUT)
        write_extras(extras)
        say(f"stopped {name}")


def env() -> None:
    print(f"export KUBECONFIG={KUBECONFIG}")
    print(f'export PATH={KUBECTL_LINK.parent}:"$PATH"')


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hack/dev-cluster.sh", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up_parser = sub.add_parser("up", help="build (first time) and start the cluster; no-op when running")
    up_parser.add_argument("--nodes", type=int, default=int(os.environ.get("TJ_DEV_NODES", "4")))
    up_parser.add_argument("--gpus-per-node", type=int, default=int(os.environ.get("TJ_DEV_GPUS", "8")))
    up_parser.add_argument("--cpu-per-node", default=os.environ.get("TJ_DEV_CPU", "64"))
    up_parser.add_argument("--memory-per-node", default=os.environ.get("TJ_DEV_MEMORY", "512Gi"))
    up_parser.add_argument("--gpu-product", default=os.environ.get("TJ_DEV_GPU_PRODUCT", "A100-SXM4-80GB"))
    sub.add_parser("down", help="stop every process the cluster started and remove its run directory")
    sub.add_parser("status", help="what runs, versions, ports and logs")
    sub.add_parser("env", help="print export lines for eval")
    restart_parser = sub.add_parser("restart", help="restart one component with the same flags and port")
    restart_parser.add_argument("component", choices=COMPONENTS)
    stop_parser = sub.add_parser(
        "stop",
        help="stop one component on purpose until `start`, or a dev process started by `run`",
    )
    stop_parser.add_argument("component", metavar="component|name")
    start_parser = sub.add_parser("start", help="start a component stopped with `stop`, same flags and port")
    start_parser.add_argument("component", choices=COMPONENTS)
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
        up(
            NodeShape(
                args.nodes, args.gpus_per_node, args.cpu_per_node, args.memory_per_node, args.gpu_product
            )
        )
    elif args.command == "down":
        down()
    elif args.command == "restart":
        restart(args.component)
    elif args.command == "stop" and args.component in COMPONENTS:
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
    except ClusterError as error:
        say(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
