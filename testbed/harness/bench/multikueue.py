"""What MultiKueue's dispatch adds to a job's start: submission to Running through a manager cluster,
against the same job submitted directly to the worker.

Why: with `spec.managedBy: kueue.x-k8s.io/multikueue` a job goes through the manager's Kueue (quota,
then MultiKueue's admission check), is copied to a worker as a Workload, admitted there by the
worker's Kueue, copied again as a TrainingJob, run by the worker's operator, and its Running status
copied back: several more hops than a job submitted to the worker's own queue. This measures both
on the same two clusters in one run: a manager and a worker (testbed/addons/multikueue.py), each
with Kueue and the operator, set up by docs/shared-clusters.md's MultiKueue blocks. `--rounds` jobs
go each way, taking turns, one at a time; each is timed from just before `kubectl create` until the
cluster it was submitted to shows it Running (polled), then deleted. `make bench-multikueue` runs it
(`python -m testbed.harness.bench.multikueue`): progress on stderr, one JSON object on stdout (the
medians, their ratio and the load average beside them), both clusters torn down at the end, also on
Ctrl-C. Results in docs/bench.md, "MultiKueue".
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import yaml

from testbed.addons import multikueue
from testbed.cluster.handle import Cluster
from testbed.cluster.kubectl import Kubectl
from testbed.common import REPO, Say, ToolError, free_port, http_ok, wait_until
from testbed.harness.base import HarnessParser, run_to_end
from testbed.harness.bench import quiet

NAMESPACE: Final = "bench"
SECTION: Final = "## MultiKueue"
JsonDict = dict[str, Any]
say = Say("bench-multikueue")


def section_blocks() -> list[str]:
    """docs/shared-clusters.md's MultiKueue blocks: the manager's set-up, the worker's, the job."""
    text = (REPO / "docs" / "shared-clusters.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    return [block + "\n" for block in re.findall(r"```yaml\n(.*?)\n```", section, re.S)]


class Operator:
    """The operator as a process for one cluster's bench namespace, stopped at the end."""

    def __init__(self, kubeconfig: Path, log: Path) -> None:
        self.health = free_port()
        command = [
            sys.executable,
            "-m",
            "controller",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={NAMESPACE}",
            f"--lease-namespace={NAMESPACE}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{self.health}",
            "--metrics-secure=false",
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO), "LOG_LEVEL": "INFO"}
        with log.open("ab") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        wait_until(
            "the operator ready", lambda: http_ok(f"http://127.0.0.1:{self.health}/readyz"), timeout=60
        )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def timed_start(submit_to: Kubectl, job: JsonDict) -> float:
    """Seconds from just before the job's create until the cluster it went to shows it Running."""
    name = job["metadata"]["name"]
    started = time.monotonic()
    submit_to.run("create", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(job))
    deadline = started + 120
    while time.monotonic() < deadline:
        state = submit_to.run("get", "trainingjob", name, "-n", NAMESPACE, "-o", "jsonpath={.status.state}")
        if state == "Running":
            return time.monotonic() - started
        time.sleep(0.05)
    raise ToolError(f"TrainingJob {name} not Running after 120 s")


def has_service_account(kubectl: Kubectl) -> Callable[[], bool]:
    return lambda: kubectl.get_or_none("serviceaccount", "default", "-n", NAMESPACE) is not None


def gone(kubectl: Kubectl, name: str) -> Callable[[], bool]:
    return lambda: kubectl.get_or_none("trainingjob", name, "-n", NAMESPACE) is None


def deleted(kubectl: Kubectl, name: str) -> None:
    kubectl.run("delete", "trainingjob", name, "-n", NAMESPACE, "--ignore-not-found", "--wait=true")


def main(argv: list[str] | None = None) -> int:
    parser = HarnessParser("bench.multikueue", "BENCH_MULTIKUEUE", __doc__ or "", dev_dir="bench-multikueue")
    parser.setting("--rounds", int, 5, "jobs submitted each way, taking turns")
    args = parser.parse_args(argv)
    manager = Cluster(Path(args.dev_dir).resolve())
    operators: list[Operator] = []
    result: JsonDict = {}

    def run() -> int:
        manager_setup, worker_setup, job_text = section_blocks()
        (job,) = [doc for doc in yaml.safe_load_all(job_text) if doc]
        manager.down()
        say(f"starting the manager cluster in {manager.dev_dir}, with Kueue")
        manager.up("kueue", nodes=2)
        say("starting the worker cluster, with Kueue")
        worker = multikueue.start_worker(manager)
        clusters = {"manager": manager.kubectl, "worker": worker.kubectl}
        for kubectl, setup in ((manager.kubectl, manager_setup), (worker.kubectl, worker_setup)):
            kubectl.run("create", "namespace", NAMESPACE)
            wait_until("the namespace's default ServiceAccount", has_service_account(kubectl), timeout=60)
            kubectl.run("apply", "-n", NAMESPACE, "-f", "-", stdin=setup)
        for name, cluster in (("manager", manager), ("worker", worker)):
            operators.append(Operator(cluster.kubeconfig, manager.dev_dir / "logs" / f"operator-{name}.log"))
        wait_until(
            "the manager's Kueue connected to the worker",
            lambda: (
                '"True"' in manager.kubectl.run("get", "multikueuecluster", multikueue.WORKER, "-o", "json")
            ),
            timeout=60,
        )
        times: dict[str, list[float]] = {"multikueue": [], "direct": []}
        result["load_average_before"] = quiet.load_average()
        for number in range(args.rounds):
            order = ("multikueue", "direct") if number % 2 == 0 else ("direct", "multikueue")
            for way in order:
                name = f"{way}-{number}"
                submitted = {**job, "metadata": {**job["metadata"], "name": name}}
                if way == "direct":
                    submitted["spec"] = {k: v for k, v in job["spec"].items() if k != "managedBy"}
                target = clusters["manager" if way == "multikueue" else "worker"]
                seconds = timed_start(target, submitted)
                times[way].append(round(seconds, 2))
                say(f"{name}: Running after {seconds:.2f} s")
                deleted(target, name)
                wait_until(f"{name} gone from the worker", gone(worker.kubectl, name), timeout=60)
        result["load_average_after"] = quiet.load_average()
        medians = {way: statistics.median(values) for way, values in times.items()}
        result.update(
            rounds=args.rounds,
            seconds=times,
            median_seconds=medians,
            ratio=round(medians["multikueue"] / medians["direct"], 2),
        )
        print(json.dumps(result, indent=1))
        return 0

    def down() -> None:
        for operator in operators:
            operator.stop()
        manager.down()  # its worker too (testbed/cluster/lifecycle.py)

    return run_to_end(run, down, say)


if __name__ == "__main__":
    sys.exit(main())
