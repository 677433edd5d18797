"""`make bench`: how fast the operator brings up many TrainingJobs, and what it costs at rest.

Not a test: speed and memory targets live here, never in timed test assertions. One run:

1. starts a throwaway control plane in its own dev directory (`TJ_DEV_DIR`, default `.dev/bench`) with
   enough kwok nodes for every pod, and makes sure the CRD is installed and Established;
2. starts the operator as a process (`python -m controller`, default flags except `--metrics-addr
   127.0.0.1:<free port>` and `--lease-namespace default`, plus any extra flags given);
3. creates N TrainingJobs x R replicas from several threads and times, from the first create, when
   every pod exists, is bound, is Running, and when every job is Running;
4. counts the operator's API requests by verb (its `rest_client_requests_total`), its CPU seconds
   (`/proc/<pid>/stat`) and peak RSS (`VmHWM`) over that burst;
5. waits for steady state and watches the operator over a window: API writes per minute (POST, PUT,
   PATCH, DELETE; the leader-election Lease renewals are counted apart) and CPU as % of one core;
6. scales to BENCH_MEMORY_JOBS jobs (default 1,000, so 4,000 pods in the caches) and reads the RSS.

It prints one JSON object on stdout (targets included, each marked met or not) and progress lines
with the elapsed time on stderr. The operator and the bench cluster are stopped at the end, also on
failure and on Ctrl-C. See docs/bench.md.

    hack/bench.py [--jobs N] [--replicas R] [...] [-- extra operator flags]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from controller.clock import RealClock  # noqa: E402
from controller.errors import AlreadyExists, KubeError  # noqa: E402
from controller.informer import Informer  # noqa: E402
from controller.kube import (  # noqa: E402
    CRDS,
    EVENTS,
    LEASES,
    NAMESPACES,
    PODS,
    TRAININGJOBS,
    KubeClient,
    from_kubeconfig,
)
from controller.store import Store  # noqa: E402
from crd import contract  # noqa: E402

JsonDict = dict[str, Any]

NAMESPACE = "bench"
LEASE_NAMESPACE = "default"
PODS_PER_NODE = 100  # of the 110 a node allows (hack/devcluster.py node_manifest), leaving slack
GPUS_PER_NODE = 8
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# The targets (docs/bench.md).
TARGET_BRING_UP_SECONDS = 60.0
TARGET_WRITES_PER_MINUTE = 0.0
TARGET_IDLE_CPU_PERCENT = 2.0
TARGET_RSS_MB = 150.0

_started = time.monotonic()


def say(message: str) -> None:
    elapsed = time.monotonic() - _started
    print(f"[bench {int(elapsed) // 60:2d}m{int(elapsed) % 60:02d}s] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A failure with a message meant for the person at the terminal."""


# ------------------------------------------------------------------------------------------ options


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


@dataclass(frozen=True)
class Options:
    jobs: int
    replicas: int
    memory_jobs: int
    gpus_per_worker: int
    nodes: int
    window: float
    settle: float
    create_threads: int
    timeout: float
    dev_dir: Path
    operator_args: tuple[str, ...]

    @property
    def pods(self) -> int:
        return self.jobs * self.replicas


def parse_options(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="hack/bench.py",
        description="Benchmark the operator on a throwaway local cluster; prints one JSON object.",
        epilog="Arguments after `--` (and $BENCH_OPERATOR_ARGS) are passed to the operator.",
    )
    add = parser.add_argument
    add("--jobs", type=int, default=env_int("BENCH_JOBS", 500), help="TrainingJobs to create ($BENCH_JOBS)")
    add("--replicas", type=int, default=env_int("BENCH_REPLICAS", 4), help="numWorkers ($BENCH_REPLICAS)")
    add(
        "--memory-jobs",
        type=int,
        default=env_int("BENCH_MEMORY_JOBS", 1000),
        help="jobs in the memory phase, 0 to skip it ($BENCH_MEMORY_JOBS, default 1000)",
    )
    add("--gpus-per-worker", type=int, default=env_int("BENCH_GPUS_PER_WORKER", 0))
    add("--nodes", type=int, default=env_int("BENCH_NODES", 0), help="kwok nodes (default: enough)")
    add(
        "--window",
        type=float,
        default=env_float("BENCH_WINDOW", 60.0),
        help="steady-state window in seconds ($BENCH_WINDOW, default 60)",
    )
    add(
        "--settle",
        type=float,
        default=env_float("BENCH_SETTLE", 10.0),
        help="seconds to wait after all jobs are Running before the window ($BENCH_SETTLE, default 10)",
    )
    add("--create-threads", type=int, default=env_int("BENCH_CREATE_THREADS", 8))
    add(
        "--timeout",
        type=float,
        default=env_float("BENCH_TIMEOUT", 900.0),
        help="give up on a phase after this many seconds (default 900)",
    )
    add("--dev-dir", type=Path, default=Path(os.environ.get("BENCH_DEV_DIR", REPO / ".dev" / "bench")))
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, extra = argv[:split], argv[split + 1 :]
    args = parser.parse_args(argv)
    operator_args = tuple(shlex.split(os.environ.get("BENCH_OPERATOR_ARGS", ""))) + tuple(extra)
    if args.jobs < 1 or args.replicas < 1:
        parser.error("--jobs and --replicas must be at least 1")
    most_pods = max(args.jobs, args.memory_jobs) * args.replicas
    # Enough nodes for every pod (and GPU), plus a spare.
    nodes = args.nodes or 1 + max(
        math.ceil(most_pods / PODS_PER_NODE),
        math.ceil(most_pods * args.gpus_per_worker / GPUS_PER_NODE),
        1,
    )
    return Options(
        jobs=args.jobs,
        replicas=args.replicas,
        memory_jobs=args.memory_jobs,
        gpus_per_worker=args.gpus_per_worker,
        nodes=nodes,
        window=args.window,
        settle=args.settle,
        create_threads=max(1, args.create_threads),
        timeout=args.timeout,
        dev_dir=args.dev_dir.resolve(),
        operator_args=operator_args,
    )


# ------------------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ProcSample:
    """CPU seconds (user + system) and memory of one process, read from /proc."""

    cpu_seconds: float
    rss_mb: float
    peak_rss_mb: float


def proc_sample(pid: int) -> ProcSample:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    memory: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            memory[key] = int(value.split()[0]) / 1024  # kB -> MiB
    return ProcSample(cpu, memory.get("VmRSS", 0.0), memory.get("VmHWM", 0.0))


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return float(total - idle), float(total)


def cpu_pressure() -> float | None:
    """Share of the last 60 s in which some runnable task waited for a CPU (/proc/pressure/cpu), in %."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    fields = dict(part.split("=", 1) for part in first.split()[1:])
    return float(fields["avg60"]) if "avg60" in fields else None


def busy_cores(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Average number of busy cores between two `machine_busy` samples."""
    busy, total = after[0] - before[0], after[1] - before[1]
    return round((os.cpu_count() or 1) * busy / total, 2) if total > 0 else 0.0


def run_devcluster(dev_dir: Path, *args: str, check: bool = True) -> None:
    env = dict(os.environ, TJ_DEV_DIR=str(dev_dir))
    result = subprocess.run(
        [sys.executable, str(REPO / "hack" / "devcluster.py"), *args], env=env, check=False
    )
    if check and result.returncode != 0:
        raise BenchError(f"hack/devcluster.py {' '.join(args)} failed (exit {result.returncode})")


def component_pids(dev_dir: Path) -> dict[str, int]:
    try:
        state = json.loads((dev_dir / "run" / "state.json").read_text())
    except (OSError, ValueError):
        return {}
    return {name: int(proc["pid"]) for name, proc in state.get("processes", {}).items()}


def component_cpu(pids: dict[str, int]) -> dict[str, float]:
    cpu: dict[str, float] = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError, IndexError, ValueError):
            cpu[name] = proc_sample(pid).cpu_seconds
    return cpu


class Operator:
    """The operator under test, as a process with its own session; its log goes to a file."""

    def __init__(self, kubeconfig: Path, log_path: Path, extra: tuple[str, ...]) -> None:
        self.port = free_port()
        self.command = [
            sys.executable,
            "-m",
            "controller",
            f"--kubeconfig={kubeconfig}",
            f"--metrics-addr=127.0.0.1:{self.port}",
            f"--lease-namespace={LEASE_NAMESPACE}",
            *extra,
        ]
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        # The operator's default log level, whatever the caller's $LOG_LEVEL says ($BENCH_LOG_LEVEL wins).
        env = dict(os.environ, PYTHONPATH=str(REPO), LOG_LEVEL=os.environ.get("BENCH_LOG_LEVEL", "INFO"))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            log.write(f"\n===== {stamp} {' '.join(self.command[1:])}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO,
                env=env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        if self.process is None:
            raise BenchError("the operator was not started")
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.process.returncode if self.process is not None else None
            raise BenchError(f"the operator exited ({code}); last lines of {self.log_path}:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as error:
            return int(error.code), error.read().decode()
        except (urllib.error.URLError, OSError) as error:
            return 0, str(error)

    def metrics(self, *names: str) -> Metrics:
        query = "?" + "&".join(f"name[]={name}" for name in names) if names else ""
        status, body = self.get("/metrics" + query)
        if status != 200:
            raise BenchError(f"/metrics answered {status}: {body[:200]}")
        return Metrics.parse(body)

    def sample(self) -> ProcSample:
        return proc_sample(self.pid)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            say(f"the operator (pid {self.process.pid}) ignored SIGTERM for 40s; killing it")
            self.process.kill()
            self.process.wait(timeout=10)


@dataclass
class Metrics:
    """The few series of the operator's /metrics the bench reads."""

    requests: dict[str, float] = field(default_factory=dict)  # by method, every code
    requests_by_code: dict[str, float] = field(default_factory=dict)
    cpu_seconds: float | None = None
    leader: bool = False
    queue_depth: float = 0.0
    reconciles: float = 0.0
    events_dropped: float = 0.0
    events_pending: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Metrics:
        metrics = cls()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if sample.name == "rest_client_requests_total":
                    method = labels.get("method", "")
                    metrics.requests[method] = metrics.requests.get(method, 0.0) + sample.value
                    code = labels.get("code", "")
                    metrics.requests_by_code[code] = metrics.requests_by_code.get(code, 0.0) + sample.value
                elif sample.name == "process_cpu_seconds_total":
                    metrics.cpu_seconds = sample.value
                elif sample.name == "leader_election_master_status" and sample.value == 1.0:
                    metrics.leader = True
                elif sample.name == "workqueue_depth":
                    metrics.queue_depth += sample.value
                elif sample.name == "controller_runtime_reconcile_total":
                    metrics.reconciles += sample.value
                elif sample.name == "trainingjob_events_dropped_total":
                    metrics.events_dropped += sample.value
                elif sample.name == "trainingjob_events_pending":
                    metrics.events_pending += sample.value
        return metrics

    def minus(self, earlier: Metrics) -> dict[str, int]:
        methods = sorted(set(self.requests) | set(earlier.requests))
        return {m: round(self.requests.get(m, 0.0) - earlier.requests.get(m, 0.0)) for m in methods}

    def codes_minus(self, earlier: Metrics) -> dict[str, int]:
        codes = sorted(set(self.requests_by_code) | set(earlier.requests_by_code))
        return {
            c: round(self.requests_by_code.get(c, 0.0) - earlier.requests_by_code.get(c, 0.0)) for c in codes
        }


# ------------------------------------------------------------------------------------------ watching


def _slim_pod(pod: JsonDict) -> JsonDict:
    metadata = pod["metadata"]
    return {
        "metadata": {k: metadata.get(k) for k in ("name", "namespace", "uid", "resourceVersion")},
        "spec": {"nodeName": (pod.get("spec") or {}).get("nodeName")},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def _slim_job(job: JsonDict) -> JsonDict:
    metadata = job["metadata"]
    return {
        "metadata": {k: metadata.get(k) for k in ("name", "namespace", "uid", "resourceVersion")},
        "status": {"state": (job.get("status") or {}).get("state")},
    }


def _slim_lease(lease: JsonDict) -> JsonDict:
    metadata = lease["metadata"]
    spec = lease.get("spec") or {}
    return {
        "metadata": {k: metadata.get(k) for k in ("name", "namespace", "uid", "resourceVersion")},
        "spec": {"renewTime": spec.get("renewTime"), "holderIdentity": spec.get("holderIdentity")},
    }


class Tracker:
    """When each pod was first seen, bound and Running, and each job Running, from the bench's own
    watches (list + watch, so the bench adds no polling load to the API server)."""

    def __init__(self, client: KubeClient, lease_name: str) -> None:
        self._lock = threading.Lock()
        self.pod_created: dict[str, float] = {}
        self.pod_bound: dict[str, float] = {}
        self.pod_running: dict[str, float] = {}
        self.job_running: dict[str, float] = {}
        self.lease_renewals = 0
        self._lease_name = lease_name
        self._stop = threading.Event()
        clock = RealClock()
        self.informers = [
            Informer(client, PODS, Store(), namespace=NAMESPACE, clock=clock, transform=_slim_pod),
            Informer(client, TRAININGJOBS, Store(), namespace=NAMESPACE, clock=clock, transform=_slim_job),
            Informer(client, LEASES, Store(), namespace=LEASE_NAMESPACE, clock=clock, transform=_slim_lease),
        ]
        pods, jobs, leases = self.informers
        pods.add_handler(on_add=self._pod, on_update=lambda _old, new: self._pod(new))
        jobs.add_handler(on_add=self._job, on_update=lambda _old, new: self._job(new))
        leases.add_handler(on_update=self._lease)
        self._threads = [
            threading.Thread(target=inf.run, args=(self._stop,), name=f"bench-{inf.name}", daemon=True)
            for inf in self.informers
        ]

    def start(self, timeout: float = 60.0) -> None:
        for thread in self._threads:
            thread.start()
        for informer in self.informers:
            if not informer.wait_for_sync(timeout):
                raise BenchError(f"the bench's watch of {informer.name} did not sync in {timeout:.0f}s")

    def stop(self) -> None:
        self._stop.set()
        for informer in self.informers:
            informer.stop()

    def _pod(self, pod: JsonDict) -> None:
        now = time.monotonic()
        name = pod["metadata"]["name"]
        with self._lock:
            self.pod_created.setdefault(name, now)
            if pod["spec"].get("nodeName"):
                self.pod_bound.setdefault(name, now)
            if pod["status"].get("phase") == "Running":
                self.pod_running.setdefault(name, now)

    def _job(self, job: JsonDict) -> None:
        if job["status"].get("state") == "Running":
            with self._lock:
                self.job_running.setdefault(job["metadata"]["name"], time.monotonic())

    def _lease(self, old: JsonDict, new: JsonDict) -> None:
        if new["metadata"]["name"] == self._lease_name and old["spec"] != new["spec"]:
            with self._lock:
                self.lease_renewals += 1

    def counts(self) -> tuple[int, int, int, int]:
        with self._lock:
            return len(self.pod_created), len(self.pod_bound), len(self.pod_running), len(self.job_running)

    def renewals(self) -> int:
        with self._lock:
            return self.lease_renewals

    def reached(self, times: dict[str, float], count: int) -> float | None:
        """When the `count`-th item arrived, or None if fewer did."""
        with self._lock:
            values = sorted(times.values())
        return values[count - 1] if len(values) >= count else None


# ------------------------------------------------------------------------------------------- the run


def job_manifest(name: str, replicas: int, gpus: int) -> JsonDict:
    return {
        "apiVersion": f"{contract.GROUP}/{contract.VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench": "true"}},
        "spec": {
            "model": "bench",
            "dataset": "synthetic",
            "numWorkers": replicas,
            "gpusPerWorker": gpus,
        },
    }


def install_crd(client: KubeClient, timeout: float = 60.0) -> None:
    """Server-side applies the CRD (hack/devcluster.py installed it already; this is idempotent) and
    waits until it is Established."""
    for path in sorted((REPO / "crd").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                client.patch(
                    CRDS, None, doc["metadata"]["name"], doc, patch_type="apply", field_manager="bench"
                )
    name = f"{contract.PLURAL}.{contract.GROUP}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = client.get(CRDS, None, name)
        conditions = (crd.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
            return
        time.sleep(0.5)
    raise BenchError(f"CRD {name} not Established after {timeout:.0f}s")


def apiserver_requests(client: KubeClient) -> dict[str, float]:
    """The API server's own request counters (apiserver_request_total), by verb and resource: what the
    whole cluster (operator, scheduler, kwok, controller manager, the bench) asked of it."""
    pool = client.api_client.rest_client.pool_manager
    host = str(client.api_client.configuration.host).rstrip("/")
    try:
        # The admin kubeconfig authenticates with a client certificate, which the pool already carries.
        response = pool.request("GET", host + "/metrics", headers={"Accept": "text/plain"}, timeout=30.0)
    except Exception:  # diagnostics only: a failed scrape leaves the breakdown out
        return {}
    if response.status != 200:
        return {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(response.data.decode()):
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            resource = labels.get("resource", "") + (
                f"/{labels['subresource']}" if labels.get("subresource") else ""
            )
            key = f"{labels.get('verb', '')} {resource}"
            counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def counter_delta(after: dict[str, float], before: dict[str, float], top: int = 15) -> dict[str, int]:
    delta = {key: round(value - before.get(key, 0.0)) for key, value in after.items()}
    ranked = sorted(((v, k) for k, v in delta.items() if v > 0), reverse=True)
    return {key: value for value, key in ranked[:top]}


def create_namespace(client: KubeClient) -> None:
    with contextlib.suppress(AlreadyExists):
        client.create(
            NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )


def create_jobs(client: KubeClient, names: list[str], options: Options) -> float:
    """Creates the jobs from `options.create_threads` threads; returns when the last create answered."""

    def create(name: str) -> None:
        with contextlib.suppress(AlreadyExists):
            client.create(
                TRAININGJOBS, NAMESPACE, job_manifest(name, options.replicas, options.gpus_per_worker)
            )

    with ThreadPoolExecutor(max_workers=options.create_threads, thread_name_prefix="bench-create") as pool:
        list(pool.map(create, names))
    return time.monotonic()


def wait_until(
    what: str,
    done: Callable[[], bool],
    operator: Operator,
    *,
    timeout: float,
    progress: Callable[[], str],
    every: float = 5.0,
) -> None:
    deadline = time.monotonic() + timeout
    next_report = time.monotonic() + every
    while not done():
        operator.check_alive()
        now = time.monotonic()
        if now > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}: {progress()}")
        if now >= next_report:
            say(progress())
            next_report = now + every
        time.sleep(0.2)


class Bench:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.dev_dir = options.dev_dir
        self.kubeconfig = self.dev_dir / "kubeconfig"
        self.operator = Operator(
            self.kubeconfig, self.dev_dir / "logs" / "operator.log", options.operator_args
        )
        self.tracker: Tracker | None = None
        self.client: KubeClient | None = None
        self.cluster_started = False

    # ---- set-up and tear-down -------------------------------------------------------------------------

    def up(self) -> None:
        options = self.options
        say(f"stopping any earlier bench cluster in {self.dev_dir}")
        run_devcluster(self.dev_dir, "down", check=False)
        say(f"starting the bench cluster: {options.nodes} kwok nodes")
        self.cluster_started = True
        run_devcluster(
            self.dev_dir, "up", "--nodes", str(options.nodes), "--gpus-per-node", str(GPUS_PER_NODE)
        )
        self.client = from_kubeconfig(
            str(self.kubeconfig), None, qps=0, burst=0, pool_size=options.create_threads + 8
        )
        install_crd(self.client)
        create_namespace(self.client)
        self.tracker = Tracker(self.client, contract.OPERATOR_NAME)
        self.tracker.start()

    def down(self) -> None:
        if self.operator.process is not None:
            say("stopping the operator")
            self.operator.stop()
        if self.tracker is not None:
            self.tracker.stop()
        if self.client is not None:
            self.client.close()
        if self.cluster_started:
            say("stopping the bench cluster")
            run_devcluster(self.dev_dir, "down", check=False)

    # ---- phases ------------------------------------------------------------------------------------

    def start_operator(self) -> None:
        say(f"starting the operator: {' '.join(self.operator.command[1:])}")
        self.operator.start()
        deadline = time.monotonic() + 120
        while True:
            self.operator.check_alive()
            if (
                self.operator.get("/readyz")[0] == 200
                and self.operator.metrics("leader_election_master_status").leader
            ):
                break
            if time.monotonic() > deadline:
                raise BenchError(
                    f"the operator was not ready and leading after 120s:\n{self.operator.tail()}"
                )
            time.sleep(0.2)
        pid, port = self.operator.pid, self.operator.port
        say(f"the operator is ready and leading (pid {pid}, metrics on port {port})")

    def progress(self, total_jobs: int, t0: float) -> Callable[[], str]:
        assert self.tracker is not None
        tracker = self.tracker
        last: list[tuple[float, float]] = []

        def line() -> str:
            created, bound, running, jobs_running = tracker.counts()
            sample = self.operator.sample()
            now = time.monotonic()
            cpu = ""
            if last:
                share = (sample.cpu_seconds - last[0][1]) / max(1e-9, now - last[0][0])
                cpu = f" ({100 * share:.0f}% of a core)"
                last.clear()
            last.append((now, sample.cpu_seconds))
            try:
                depth = f", queue depth {self.operator.metrics('workqueue_depth').queue_depth:.0f}"
            except BenchError:
                depth = ""
            pods = total_jobs * self.options.replicas
            return (
                f"t={now - t0:5.1f}s pods {created}/{pods} created, {bound} bound, {running} running; "
                f"jobs Running {jobs_running}/{total_jobs}; operator cpu {sample.cpu_seconds:.1f}s{cpu}, "
                f"rss {sample.rss_mb:.0f} MB{depth}"
            )

        return line

    def bring_up(self, first: int, total_jobs: int) -> JsonDict:
        """Creates jobs [first, total_jobs) and waits until all pods exist and every job is Running."""
        assert self.client is not None
        assert self.tracker is not None
        options, tracker = self.options, self.tracker
        names = [f"bench-{index:05d}" for index in range(first, total_jobs)]
        pods = total_jobs * options.replicas
        pids = component_pids(self.dev_dir)
        before_metrics = self.operator.metrics()
        before = self.operator.sample()
        before_components = component_cpu(pids)
        before_machine = machine_busy()
        before_apiserver = apiserver_requests(self.client)
        before_bench = time.process_time()
        threads = options.create_threads
        say(f"creating {len(names)} TrainingJobs x {options.replicas} replicas ({threads} threads)")
        t0 = time.monotonic()
        created_at = create_jobs(self.client, names, options)
        say(f"{len(names)} creates answered in {created_at - t0:.1f}s")
        progress = self.progress(total_jobs, t0)
        wait_until(
            f"{pods} pods and {total_jobs} Running jobs",
            lambda: tracker.counts()[0] >= pods and tracker.counts()[3] >= total_jobs,
            self.operator,
            timeout=options.timeout,
            progress=progress,
        )
        done_at = time.monotonic()
        after = self.operator.sample()
        after_machine = machine_busy()
        after_components = component_cpu(pids)
        after_metrics = self.operator.metrics()
        after_apiserver = apiserver_requests(self.client)
        bench_cpu = time.process_time() - before_bench
        say(progress())

        def since(times: dict[str, float], count: int) -> float | None:
            reached = tracker.reached(times, count)
            return round(reached - t0, 2) if reached is not None else None

        requests = after_metrics.minus(before_metrics)
        return {
            "jobs_created": len(names),
            "seconds_to_all_creates_answered": round(created_at - t0, 2),
            "seconds_to_all_pods_created": since(tracker.pod_created, pods),
            "seconds_to_all_pods_bound": since(tracker.pod_bound, pods),
            "seconds_to_all_pods_running": since(tracker.pod_running, pods),
            "seconds_to_all_jobs_running": since(tracker.job_running, total_jobs),
            "operator_requests_by_method": requests,
            "operator_requests_by_code": after_metrics.codes_minus(before_metrics),
            "operator_requests_per_job": round(sum(requests.values()) / max(1, len(names)), 1),
            "operator_events_dropped": round(after_metrics.events_dropped - before_metrics.events_dropped),
            "operator_reconciles": round(after_metrics.reconciles - before_metrics.reconciles),
            "operator_cpu_seconds": round(after.cpu_seconds - before.cpu_seconds, 2),
            "operator_cpu_cores_average": round(
                (after.cpu_seconds - before.cpu_seconds) / max(1e-9, done_at - t0), 2
            ),
            "operator_peak_rss_mb": round(after.peak_rss_mb, 1),
            "operator_rss_mb": round(after.rss_mb, 1),
            "component_cpu_seconds": {
                name: round(after_components[name] - before_components[name], 2)
                for name in after_components
                if name in before_components
            },
            "machine_busy_cores_average": busy_cores(before_machine, after_machine),
            "bench_cpu_seconds": round(bench_cpu, 2),
            "apiserver_requests_total": round(sum(after_apiserver.values()) - sum(before_apiserver.values())),
            "apiserver_requests_top": counter_delta(after_apiserver, before_apiserver),
        }

    def steady_state(self) -> JsonDict:
        assert self.tracker is not None
        options = self.options
        # Steady state begins when the operator has nothing left to do: no queued reconcile and no
        # Event still waiting to be written (the bring-up leaves a backlog behind its Event rate limit).
        idle_since = time.monotonic()
        deadline = idle_since + options.timeout
        while time.monotonic() < deadline:
            now_metrics = self.operator.metrics()
            if now_metrics.queue_depth == 0 and now_metrics.events_pending == 0:
                break
            time.sleep(1)
        say(f"operator idle after {time.monotonic() - idle_since:.0f}s (work queue and Events drained)")
        if options.settle > 0:
            say(f"all Running; letting it settle for {options.settle:.0f}s")
            settle_start = self.operator.metrics()
            time.sleep(options.settle)
            settle_writes = self.operator.metrics().minus(settle_start)
        else:
            settle_writes = {}
        say(f"measuring the steady state over {options.window:.0f}s")
        # The window starts and ends just after a Lease renewal the bench saw, so it holds a known
        # number of them (renewals come every --retry-period seconds; without leader election there
        # are none and the window is not aligned). Scrape first and read /proc second at the start,
        # the other way round at the end, so the scrapes' own CPU falls outside the window.
        renewals_before = self.align_to_renewal()
        start_metrics = self.operator.metrics()
        start = self.operator.sample()
        start_machine = machine_busy()
        t_start = time.monotonic()
        deadline = t_start + options.window
        while time.monotonic() < deadline:
            self.operator.check_alive()
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        renewals = self.align_to_renewal() - renewals_before
        end = self.operator.sample()
        end_machine = machine_busy()
        elapsed = time.monotonic() - t_start
        end_metrics = self.operator.metrics()
        requests = end_metrics.minus(start_metrics)
        writes = {method: requests.get(method, 0) for method in WRITE_METHODS}
        all_writes = sum(writes.values())
        per_minute = 60.0 / elapsed
        return {
            "window_seconds": round(elapsed, 1),
            "writes_during_settle": {m: settle_writes.get(m, 0) for m in WRITE_METHODS},
            "requests_by_method": requests,
            "writes_by_method": writes,
            "lease_renewals": renewals,
            "writes_per_minute": round(max(0, all_writes - renewals) * per_minute, 2),
            "writes_per_minute_including_lease_renewals": round(all_writes * per_minute, 2),
            "cpu_percent_of_one_core": round(100 * (end.cpu_seconds - start.cpu_seconds) / elapsed, 2),
            "rss_mb": round(end.rss_mb, 1),
            "peak_rss_mb": round(end.peak_rss_mb, 1),
            "machine_busy_cores_average": busy_cores(start_machine, end_machine),
            "operator_events_in_namespace": self.count_events(),
        }

    def align_to_renewal(self, timeout: float = 5.0, grace: float = 0.3) -> int:
        """Waits for the next Lease renewal the bench's watch delivers, then `grace` seconds more so the
        operator has counted that PUT; returns how many renewals the bench has seen."""
        assert self.tracker is not None
        seen = self.tracker.renewals()
        deadline = time.monotonic() + timeout
        while self.tracker.renewals() == seen and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(grace)
        return self.tracker.renewals()

    def count_events(self) -> dict[str, int]:
        """The Events the operator wrote in the bench namespace: objects, and occurrences (counts)."""
        assert self.client is not None
        items: list[JsonDict] = []
        token: str | None = None
        while True:
            page = self.client.list(
                EVENTS,
                NAMESPACE,
                field_selector=f"source={contract.OPERATOR_NAME}",
                limit=500,
                continue_=token,
            )
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                break
        by_reason: dict[str, int] = {}
        for event in items:
            reason = str(event.get("reason"))
            by_reason[reason] = by_reason.get(reason, 0) + int(event.get("count") or 1)
        return {
            "objects": len(items),
            "occurrences": sum(by_reason.values()),
            **dict(sorted(by_reason.items())),
        }

    def memory_phase(self) -> JsonDict | None:
        options = self.options
        if options.memory_jobs <= 0:
            return None
        total = max(options.memory_jobs, options.jobs)
        if total > options.jobs:
            say(f"memory phase: scaling to {total} jobs ({total * options.replicas} pods)")
            scale = self.bring_up(options.jobs, total)
        else:
            scale = {}
        if options.settle > 0:
            time.sleep(options.settle)
        sample = self.operator.sample()
        return {
            "jobs": total,
            "pods": total * options.replicas,
            "rss_mb": round(sample.rss_mb, 1),
            "peak_rss_mb": round(sample.peak_rss_mb, 1),
            "seconds_to_all_jobs_running": scale.get("seconds_to_all_jobs_running"),
            "operator_requests_by_method": scale.get("operator_requests_by_method"),
            "operator_cpu_seconds": scale.get("operator_cpu_seconds"),
        }

    def run(self) -> JsonDict:
        options = self.options
        load_before = os.getloadavg()
        pressure_before = cpu_pressure()
        self.up()
        self.start_operator()
        bring_up = self.bring_up(0, options.jobs)
        steady = self.steady_state()
        memory = self.memory_phase()
        load_after = os.getloadavg()
        return {
            "config": {
                "jobs": options.jobs,
                "replicas": options.replicas,
                "pods": options.pods,
                "gpus_per_worker": options.gpus_per_worker,
                "nodes": options.nodes,
                "create_threads": options.create_threads,
                "window_seconds": options.window,
                "memory_jobs": options.memory_jobs,
                "operator_args": self.operator.command[4:],
            },
            "machine": {
                "cpus": os.cpu_count(),
                "loadavg_before": [round(v, 2) for v in load_before],
                "loadavg_after": [round(v, 2) for v in load_after],
                "cpu_pressure_avg60_before": pressure_before,
                "cpu_pressure_avg60_after": cpu_pressure(),
            },
            "bring_up": bring_up,
            "steady_state": steady,
            "memory": memory,
            "targets": targets(options, bring_up, steady, memory),
        }


def targets(
    options: Options, bring_up: JsonDict, steady: JsonDict, memory: JsonDict | None
) -> list[JsonDict]:
    def check(name: str, value: float | None, target: float, unit: str, strict: bool = True) -> JsonDict:
        met = value is not None and (value < target if strict else value <= target)
        return {
            "name": name,
            "value": value,
            "target": f"{'<' if strict else '<='} {target:g} {unit}",
            "met": met,
        }

    pods = bring_up["seconds_to_all_pods_created"]
    jobs = bring_up["seconds_to_all_jobs_running"]
    result = [
        check(f"all {options.pods} pods created", pods, TARGET_BRING_UP_SECONDS, "s"),
        check(f"all {options.jobs} jobs Running", jobs, TARGET_BRING_UP_SECONDS, "s"),
        check(
            "API writes per minute at steady state",
            steady["writes_per_minute"],
            TARGET_WRITES_PER_MINUTE,
            "/min",
            False,
        ),
        check("idle CPU, % of one core", steady["cpu_percent_of_one_core"], TARGET_IDLE_CPU_PERCENT, "%"),
    ]
    if memory is not None:
        result.append(
            check(
                f"RSS with {memory['jobs']} jobs and {memory['pods']} pods cached",
                memory["rss_mb"],
                TARGET_RSS_MB,
                "MB",
            )
        )
    return result


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run like Ctrl-C does, so the clean-up runs."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    bench = Bench(options)
    code = 0
    with signals_as_interrupts():
        try:
            result = bench.run()
            result["all_targets_met"] = all(t["met"] for t in result["targets"])
            print(json.dumps(result, indent=2), flush=True)
        except BenchError as error:
            say(f"error: {error}")
            code = 1
        except KubeError as error:
            say(f"error: API request failed: {error}")
            code = 1
        except KeyboardInterrupt:
            say("interrupted")
            code = 130
        finally:
            # A second Ctrl-C must not cut the clean-up short; children inherit the ignore.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            bench.down()
    return code


if __name__ == "__main__":
    sys.exit(main())
