"""`make bench-recovery`: how long a gang restart makes the ranks wait, on the real node, and what it
costs the operator at scale on kwok; one JSON object on stdout (docs/bench.md, "Recovery").

Why: on a large job failures are routine, and what one costs is the time every rank waits. This
measures it as a user sees it, from the fault to (a) every rank's container running again and (b) the
first progress report of the next attempt, for a rank that exits 1 mid-epoch and for an eviction,
over several faults of one 2-rank job of the reference trainer (real torch) on the real node. The
gang part (testbed/harness/bench/recoverygang.py) restarts gangs of 256 and 1,024 kwok pods and counts
the operator's time and API requests. `--restart-strategy InPlace` runs both parts with jobs that
restart in place (spec.failurePolicy.restartStrategy): the pods stay, and a rank runs again when its
supervisor reports the next attempt's process Running on the pod's run annotation.

The real node is one per machine: the node part takes the machine-wide lock the test sessions take
(tests/sessions.py) and holds it until its cluster, node included, is down.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from controller.resources import PODS, TRAININGJOBS
from controller.runtime.client import KubeClient
from crd import contract
from testbed.cluster.kubectl import Kubectl, KubectlError
from testbed.common import JsonDict, Say, ToolError
from testbed.harness.base import HarnessCluster, HarnessParser, run_to_end
from testbed.harness.bench.operator import Operator
from testbed.harness.bench.podtimeline import PodTimeline, all_running_again, new_run_reported
from testbed.harness.bench.recoverygang import RECREATE, RESTART_STRATEGIES, gang_restarts, load_average
from testbed.harness.bench.restartphases import RestartLog, compared, medians
from testbed.node import nodehost
from testbed.node.placement import REAL_NODE

NAMESPACE: Final = "recovery"
JOB: Final = "recovery"
RANKS: Final = (f"{JOB}-worker-0", f"{JOB}-worker-1")
REPORTER: Final = RANKS[0]  # rank 0 reports progress
# TRAIN_FAIL_FILE, a path inside the container: the rank that finds it exits 1 after its step.
FAIL_FILE: Final = "/tmp/fail-now"  # noqa: S108
REAL_NODE_LOCK: Final = Path(tempfile.gettempdir()) / "trainingjob-operator-real-node.lock"
# Short steps of real torch, a report per epoch at once: faults land mid-epoch, reports come often.
PACE: Final = {
    "TRAIN_STEPS_PER_EPOCH": "10",
    "TRAIN_STEP_SECONDS": "0.2",
    "TRAIN_PROGRESS_INTERVAL": "0",
    "TRAIN_DIST_TIMEOUT": "300",
    "TRAIN_FAIL_FILE": FAIL_FILE,
}

# The downward-API probe: a pod printing the wall time each time its annotation's value changes in
# its volume (the kubelet writes the file; the pod and the bench share the machine's clock).
PROBE_POD: Final = "downward-api-probe"
PROBE_ANNOTATION: Final = "bench.ml.example.com/value"
PROBE: Final = f"""
import time
seen = None
while True:
    try:
        lines = open("/etc/podinfo/annotations").read().splitlines()
    except OSError:
        lines = []
    value = next((l.split("=", 1)[1].strip('"') for l in lines if l.startswith("{PROBE_ANNOTATION}=")), None)
    if value != seen:
        print(f"{{time.time():.3f}} {{value}}", flush=True)
        seen = value
    time.sleep(0.02)
"""

say: Final = Say("bench-recovery")


@dataclass(frozen=True)
class Options:
    failures: int
    evictions: int
    sizes: tuple[int, ...]
    gang: int
    parts: tuple[str, ...]
    timeout: float
    refreshes: int
    dev_dir: Path
    restart_strategies: tuple[str, ...] = (RECREATE,)


def parse_options(argv: Sequence[str] | None) -> Options:
    parser = HarnessParser(
        "bench.recovery",
        "RECOVERY",
        "Time gang restarts on the real node and count their cost on kwok; prints one JSON object.",
        dev_dir="recovery",
    )
    setting = parser.setting
    setting("--failures", int, 5, "ranks failing with exit 1 mid-epoch, one after another")
    setting("--evictions", int, 5, "ranks evicted through the Eviction API, one after another")
    setting("--sizes", str, "256,1024", "pods restarted at once in the gang part, comma-separated")
    setting("--gang", int, 64, "pods per gang in the gang part (a gang has at most 100 workers)")
    setting("--parts", str, "node,gang", "what to run: node, gang or both")
    setting("--refreshes", int, 3, "annotation updates timed into a pod's downward-API volume")
    setting("--timeout", float, 300.0, "seconds before one recovery or bring-up is given up")
    setting(
        "--restart-strategy",
        str,
        RECREATE,
        "the jobs' spec.failurePolicy.restartStrategy: Recreate (new pods) or InPlace (the pods stay); "
        "InPlace,Recreate runs each part with both, one after the other, and compares them",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    parts = tuple(part for part in args.parts.split(",") if part)
    if not parts or set(parts) - {"node", "gang"}:
        parser.error(f"--parts: {args.parts!r} is not a list of node and gang")
    try:
        sizes = tuple(int(size) for size in args.sizes.split(",") if size)
    except ValueError:
        parser.error(f"--sizes: {args.sizes!r} is not a list of pod counts")
    if not 1 <= args.gang <= contract.MAX_WORKERS or any(size < 1 for size in sizes):
        parser.error(f"--gang must be within 1-{contract.MAX_WORKERS} and --sizes positive")
    if args.failures < 0 or args.evictions < 0:
        parser.error("--failures and --evictions must be at least 0")
    strategies = tuple(strategy for strategy in args.restart_strategy.split(",") if strategy)
    if not strategies or set(strategies) - set(RESTART_STRATEGIES) or len(set(strategies)) < len(strategies):
        parser.error(
            f"--restart-strategy: {args.restart_strategy!r} is not a list of {', '.join(RESTART_STRATEGIES)}"
        )
    return Options(
        failures=args.failures,
        evictions=args.evictions,
        sizes=sizes,
        gang=args.gang,
        parts=parts,
        timeout=args.timeout,
        refreshes=args.refreshes,
        dev_dir=args.dev_dir.resolve(),
        restart_strategies=strategies,
    )


def summary(seconds: Sequence[float]) -> JsonDict:
    """Median and max (and every value) of a series of durations, rounded to milliseconds."""
    if not seconds:
        return {"count": 0}
    return {
        "count": len(seconds),
        "median": round(statistics.median(seconds), 3),
        "max": round(max(seconds), 3),
        "values": [round(value, 3) for value in seconds],
    }


@contextlib.contextmanager
def real_node_lock() -> Iterator[None]:
    """The machine-wide lock of the real node, held until the block ends (the node is gone by then)."""
    with REAL_NODE_LOCK.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for the real node ({REAL_NODE_LOCK} is held)")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}: make bench-recovery\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def training_job(restart_strategy: str = RECREATE) -> JsonDict:
    """Two ranks of the reference trainer with real torch on the real node, checkpoints every epoch on
    a claim, many epochs (the bench deletes it), no restart delay: the time measured is the restart's.
    InPlace: `restartStrategy: InPlace` (the supervisor runs the default command, as for any job)."""
    job: JsonDict = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": JOB, "namespace": NAMESPACE},
        "spec": {
            "model": "cnn",
            "dataset": "mnist",
            "numWorkers": len(RANKS),
            "gpusPerWorker": 0,
            "hyperparameters": {"epochs": 100000, "batchSize": 16, "learningRate": 0.05},
            "env": [{"name": key, "value": value} for key, value in PACE.items()],
            "checkpoint": {
                "enabled": True,
                "storage": {"type": "pvc", "pvc": {"create": {"whenDeleted": "Delete"}}},
            },
            "failurePolicy": {
                "backoffLimit": contract.MAX_WORKERS,
                "restartBackoff": {"initialDelaySeconds": 0, "maxDelaySeconds": 0},
            },
            "scheduling": {"nodeSelector": dict(REAL_NODE.selector), "tolerations": [REAL_NODE.toleration]},
            "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
        },
    }
    if restart_strategy != RECREATE:
        job["spec"]["failurePolicy"]["restartStrategy"] = restart_strategy
    return job


class NodeBusy(Exception):
    """Another checkout's real node runs: this machine has room for one."""


class NodeRecovery:
    """The node part: one job on the real node, failed and evicted again and again, each recovery timed."""

    def __init__(self, options: Options, strategy: str) -> None:
        self.options = options
        self.strategy = strategy
        self.harness = HarnessCluster("recovery", options.dev_dir, say)
        self.operator: Operator | None = None
        self.timeline: PodTimeline | None = None
        self.restart_log: RestartLog | None = None

    def guard(self) -> None:
        if self.operator is not None:
            self.operator.check_alive()

    def run(self) -> JsonDict:
        deadline = time.monotonic() + 10 * self.options.timeout
        while True:
            with real_node_lock():
                try:
                    return self._measure()
                except NodeBusy as busy:
                    if time.monotonic() > deadline:
                        raise ToolError(f"the real node stayed busy: {busy}") from None
                finally:
                    self.stop()
            # Outside the lock: the session that owns that node may need it to finish.
            say("a real node of another checkout runs: trying again in 30 s, the lock released")
            time.sleep(30)

    def stop(self) -> None:
        if self.timeline is not None:
            self.timeline.stop()
        if self.restart_log is not None:
            self.restart_log.stop()
        if self.operator is not None:
            self.operator.stop()
        self.harness.stop()

    def add_real_node(self) -> None:
        """The node with the trainer image alone (the job runs nothing else). NodeBusy when another
        checkout's node runs (left outside the lock): its session may be waiting for the lock."""
        up = ("up", "--with", "real-node", "--images", "trainer-torch")
        result = self.harness.cluster.script(*up, check=False, quiet=True)
        if result.returncode == 0:
            return
        output = (result.stdout or "") + (result.stderr or "")
        if "a real node runs on this machine already" in output:
            raise NodeBusy(output.strip().splitlines()[-1])
        raise ToolError(f"hack/dev-cluster.sh {' '.join(up)} failed: {output.strip()[-1500:]}")

    def _measure(self) -> JsonDict:
        node_pids = nodehost.running_pids()
        if node_pids:  # before starting a cluster for nothing
            raise NodeBusy(f"processes {', '.join(str(pid) for pid in sorted(node_pids)[:5])}")
        client = self.harness.start(NAMESPACE)
        self.add_real_node()
        logs = self.options.dev_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.operator = Operator(
            self.harness.kubeconfig,
            logs / "operator.log",
            ("--progress-interval=0", f"--namespace={NAMESPACE}"),
        )
        self.operator.start()
        wait(
            lambda: self.operator is not None and self.operator.ready(),
            "the operator leading",
            120,
            self.guard,
        )
        strategy = self.strategy
        if strategy != RECREATE:
            self.restart_log = RestartLog(client, NAMESPACE, JOB)
            self.restart_log.start()
        on_pod = self.restart_log.pod_seen if self.restart_log is not None else None
        self.timeline = PodTimeline(client, NAMESPACE, f"{contract.JOB_NAME_LABEL}={JOB}", on_pod)
        self.timeline.start()
        client.create(TRAININGJOBS, NAMESPACE, training_job(strategy))
        say(
            f"{JOB}: 2 ranks of the reference trainer on the real node ({strategy}); "
            "waiting for its first reports"
        )
        before_load = load_average()
        results: dict[str, Any] = {"restart_strategy": strategy, "load_average_before": before_load}
        for kind, count in (("failure", self.options.failures), ("eviction", self.options.evictions)):
            running, reported, in_place = [], [], []
            for index in range(count):
                ran, first, fault = self.recover(client, kind)
                if self.restart_log is not None and kind == "failure":
                    in_place.append(self.restart_log.steps(fault, RANKS, RANKS[1]))
                say(
                    f"{kind} {index + 1}/{count}: ranks running again after {ran:.2f}s, "
                    f"the first report after {first:.2f}s"
                )
                running.append(ran)
                reported.append(first)
            results[kind] = {"to_every_rank_running": summary(running), "to_first_report": summary(reported)}
            if in_place:
                results[kind]["in_place_steps"] = {"median": medians(in_place), "each": in_place}
        status = client.get(TRAININGJOBS, NAMESPACE, JOB).get("status") or {}
        results["restarts"] = status.get("restarts") or {}
        results["last_restart_kind"] = status.get("lastRestartKind")
        keep_logs(self.harness.cluster.kubectl, logs, strategy)
        client.delete(TRAININGJOBS, NAMESPACE, JOB)
        results["downward_api_refresh"] = summary(
            annotation_refreshes(
                client, self.harness.cluster.kubectl, self.options.refreshes, self.options.timeout, self.guard
            )
        )
        results["load_average_after"] = load_average()
        return results

    def recover(self, client: KubeClient, kind: str) -> tuple[float, float, float]:
        """One fault once the current run has trained a whole epoch: (seconds to every rank running
        again, seconds to the new run's first progress report, the fault's wall-clock time)."""
        timeline = self.timeline
        assert timeline is not None
        timeout = self.options.timeout

        # Mid-training: the current run has reported, then trained another epoch.
        def steady(runs: Any) -> bool:
            return all_running_again(runs, RANKS, {}) and new_run_reported(runs, REPORTER, {})

        timeline.wait("the ranks running and reporting", steady, timeout, self.guard)
        epoch = current_epoch(client)
        wait(lambda: current_epoch(client) > epoch, "an epoch past the last report", timeout, self.guard)
        before = {name: run.identity for name, run in timeline.runs().items()}
        if kind == "failure":
            self.harness.cluster.kubectl.run(
                "exec", RANKS[1], "-n", NAMESPACE, "-c", contract.CONTAINER_NAME, "--", "touch", FAIL_FILE
            )
        else:
            evict(client, RANKS[1])
        fault, fault_wall = time.monotonic(), time.time()
        ran = timeline.wait(
            "every rank running again",
            lambda runs: all_running_again(runs, RANKS, before),
            timeout,
            self.guard,
        )
        first = timeline.wait(
            "the new run's first report",
            lambda runs: new_run_reported(runs, REPORTER, before),
            timeout,
            self.guard,
        )
        return ran - fault, first - fault, fault_wall


def annotation_refreshes(
    client: KubeClient, kubectl: Kubectl, samples: int, timeout: float, guard: Callable[[], None]
) -> list[float]:
    """Seconds from a pod annotation's update to the new value in the pod's downward-API volume, as a
    process of the pod reads it: how fast the operator could reach every rank through its pod."""
    if samples < 1:
        return []
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": PROBE_POD, "namespace": NAMESPACE, "annotations": {PROBE_ANNOTATION: "0"}},
        "spec": {
            "nodeSelector": dict(REAL_NODE.selector),
            "tolerations": [REAL_NODE.toleration],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "probe",
                    "image": contract.DEFAULT_IMAGES["pytorch"],
                    "command": ["python3", "-c", PROBE],
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
                    "volumeMounts": [{"name": "podinfo", "mountPath": "/etc/podinfo"}],
                }
            ],
            "volumes": [
                {
                    "name": "podinfo",
                    "downwardAPI": {
                        "items": [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
                    },
                }
            ],
        },
    }
    client.create(PODS, NAMESPACE, pod)
    wait(lambda: "0" in probe_log(kubectl), "the probe pod reading its annotations", timeout, guard)
    seconds = []
    for sample in range(1, samples + 1):
        patch = {"metadata": {"annotations": {PROBE_ANNOTATION: str(sample)}}}
        written = time.time()
        client.patch(PODS, NAMESPACE, PROBE_POD, patch)
        wait(lambda: str(sample) in probe_log(kubectl), f"annotation {sample} in the volume", timeout, guard)  # noqa: B023
        seen = probe_log(kubectl)[str(sample)]
        seconds.append(max(seen - written, 0.0))
        say(f"downward API: annotation {sample} seen in the pod after {seen - written:.2f}s")
    client.delete(PODS, NAMESPACE, PROBE_POD, grace_period_seconds=0)
    return seconds


def keep_logs(kubectl: Kubectl, directory: Path, strategy: str) -> None:
    """The ranks' trainer logs beside the operator's (a kept pod's log holds every in-place attempt)."""
    for rank in RANKS:
        with contextlib.suppress(KubectlError):
            text = kubectl.run("logs", rank, "-n", NAMESPACE, "-c", contract.CONTAINER_NAME)
            (directory / f"{rank}-{strategy}.log").write_text(text)


def probe_log(kubectl: Kubectl) -> dict[str, float]:
    """The probe's log: value -> the wall time the pod first read it."""
    seen: dict[str, float] = {}
    for line in kubectl.run("logs", PROBE_POD, "-n", NAMESPACE, check=False).splitlines():
        when, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            seen.setdefault(value, float(when))
    return seen


def current_epoch(client: KubeClient) -> int:
    status = client.get(TRAININGJOBS, NAMESPACE, JOB).get("status") or {}
    return int(status.get("currentEpoch") or 0)


def evict(client: KubeClient, pod: str) -> None:
    """The Eviction API, as `kubectl drain` calls it."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": NAMESPACE}}
    client.request("POST", PODS.path(NAMESPACE, pod, "eviction"), body=body)


def wait(check: Any, what: str, timeout: float, guard: Any) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        guard()
        if time.monotonic() > deadline:
            raise ToolError(f"{what}: not after {timeout:.0f}s")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv)
    result: JsonDict = {
        "options": {
            "failures": options.failures,
            "evictions": options.evictions,
            "restart_strategy": ",".join(options.restart_strategies),
        }
    }

    def run() -> int:
        strategies = options.restart_strategies
        if "node" in options.parts:
            nodes = {strategy: NodeRecovery(options, strategy).run() for strategy in strategies}
            result["node"] = compared(nodes) if len(nodes) > 1 else nodes[strategies[0]]
        if "gang" in options.parts:
            gangs = {
                strategy: gang_restarts(
                    options.dev_dir, options.sizes, options.gang, options.timeout, say, strategy
                )
                for strategy in strategies
            }
            result["gang"] = gangs if len(gangs) > 1 else gangs[strategies[0]]
        print(json.dumps(result, indent=2), flush=True)
        return 0

    return run_to_end(run, lambda: None, say)


if __name__ == "__main__":
    sys.exit(main())
