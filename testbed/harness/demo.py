"""`make demo` after the set-up: the operator, and one TrainingJob trained in containers to Completed.

Why: the first command of the README has to show the product working, not a wall of YAML. The
Makefile has already checked the machine (hack/preflight.sh), made the virtualenv, started the local
cluster with its real node (`hack/dev-cluster.sh up --with real-node`: a kubelet and containerd on
this machine, testbed/node/realnode.py) and installed the CRD; this script then

1. creates the namespace (DEMO_NAMESPACE, default `demo`);
2. starts the operator (watching that namespace only; /metrics in plain HTTP on
   127.0.0.1:DEMO_METRICS_PORT, --metrics-secure=false as on the local cluster only, the probes on
   127.0.0.1:DEMO_HEALTH_PORT) as a registered dev process (`hack/dev-cluster.sh run`), so
   `hack/dev-cluster.sh down` stops it too; it is reused when it already runs. When the operator was
   installed into the cluster with `make deploy` (which, on the local cluster, puts it on the real
   node and stops this process), that one runs the job instead;
3. applies examples/trainingjob-simple.yaml, placed on the real node (a toleration of its taint and a
   node selector: the cluster's other nodes are kwok's, which run nothing). Its pods run the reference
   trainer with real torch in the trainer image (testbed/images). If the job exists from an earlier run it
   is deleted first and created again, so every `make demo` shows a whole run. Two settings of the
   reference trainer are added to its spec.env so the run can be watched: TRAIN_STEP_SECONDS
   (DEMO_STEP_SECONDS, default 0.1: about 2 s per epoch) and TRAIN_PROGRESS_INTERVAL=1 (a report per
   epoch at most every second). The operator runs with --progress-interval 0: the trainer's reports
   are rate-limited already, and every one of them should show;
4. prints a line whenever the job's state, epoch, progress or metrics change, until it is Completed
   (DEMO_TIMEOUT seconds at most), then how to look around and how to stop. The changes come from a
   watch through the project's Python client (trainingjob_client), as a notebook would follow a job;
   a watchdog thread ends it early if the operator or a component of the cluster dies.

Run with the operator's virtualenv from the repository: `.venv/bin/python -m testbed.harness.demo` (the
Makefile does).
"""

from __future__ import annotations

import copy
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Final

import yaml

from controller.resources import NAMESPACES, SERVICEACCOUNTS
from controller.runtime.client import KubeClient
from controller.runtime.errors import AlreadyExists, KubeError, NotFound
from controller.runtime.resource import Resource
from testbed.cluster.state import KUBECONFIG, LOGS, dead_components, read_state
from testbed.common import REPO, Say, ToolError, still_running, tail, wait_until
from testbed.node import nodeconfig
from trainingjob_client import (
    JobDeleted,
    JobNotFound,
    JobWatch,
    TrainingJob,
    TrainingJobClient,
    TrainingJobError,
    WaitTimeout,
)

NAMESPACE: Final = os.environ.get("DEMO_NAMESPACE", "demo")
METRICS_PORT: Final = int(os.environ.get("DEMO_METRICS_PORT", "8080"))
HEALTH_PORT: Final = int(os.environ.get("DEMO_HEALTH_PORT", "8081"))
TIMEOUT: Final = float(os.environ.get("DEMO_TIMEOUT", "300"))
STEP_SECONDS: Final = os.environ.get("DEMO_STEP_SECONDS", "0.1")
EXAMPLE: Final = REPO / "examples" / "trainingjob-simple.yaml"
DEV_SCRIPT: Final = REPO / "hack" / "dev-cluster.sh"
OPERATOR: Final = "operator"
POLL_SECONDS: Final = 0.5
# The operator as `make deploy` installs it (deploy/base).
DEPLOYMENTS: Final = Resource("apps", "v1", "deployments", "Deployment")
DEPLOYED: Final = ("trainingjob-system", "trainingjob-operator")
DELETE_TIMEOUT: Final = 120.0

say: Final = Say("demo", stdout=True)


def shown(path: Path) -> str:
    """A path as the user can type it from the repository."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------------
# Processes


def ensure_process(name: str, command: list[str], wait_http: str | None = None) -> None:
    """Registers and starts `command` as dev process `name`, reusing it when it already runs it."""
    state = read_state() or {}
    current = (state.get("extras") or {}).get(name)
    if current and still_running(current) and current.get("command") == command:
        say(f"{name} already runs (pid {current['pid']}): reusing it")
        return
    arguments = [str(DEV_SCRIPT), "run", name, "--replace"]
    if wait_http:
        arguments += ["--wait-http", wait_http]
    result = subprocess.run([*arguments, "--", *command], check=False)
    if result.returncode != 0:
        raise ToolError(f"could not start {name}; its log: {shown(LOGS / f'{name}.log')}")


def deployed_operator(client: KubeClient) -> bool:
    """Whether the operator runs in the cluster as `make deploy` installed it."""
    try:
        client.get(DEPLOYMENTS, *DEPLOYED)
    except NotFound:
        return False
    return True


def check_processes(own_operator: bool = True) -> None:
    """The operator (when the demo runs its own) and every component of the cluster (the real
    node's kubelet and containerd among them) still run."""
    state = read_state() or {}
    operator = (state.get("extras") or {}).get(OPERATOR)
    dead = [] if not own_operator or (operator is not None and still_running(operator)) else [OPERATOR]
    dead += dead_components(state)
    if dead:
        log = LOGS / f"{dead[0]}.log"
        raise ToolError(f"{dead[0]} is not running any more; last lines of {shown(log)}:\n{tail(log)}")


# ---------------------------------------------------------------------------------------------------
# The job


def ensure_namespace(client: KubeClient) -> None:
    try:
        client.create(
            NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        say(f"created namespace {NAMESPACE}")
    except AlreadyExists:
        pass
    # The API server refuses pods until the namespace's default ServiceAccount exists.
    wait_until(
        f"the default ServiceAccount of {NAMESPACE}",
        lambda: exists(client, NAMESPACE, "default"),
        timeout=60,
        interval=POLL_SECONDS,
    )


def exists(client: KubeClient, namespace: str, name: str) -> bool:
    try:
        client.get(SERVICEACCOUNTS, namespace, name)
    except NotFound:
        return False
    return True


def demo_job() -> dict[str, Any]:
    """The example, placed on the real node, with the two settings that make it watchable."""
    manifest = yaml.safe_load(EXAMPLE.read_text())
    job: dict[str, Any] = copy.deepcopy(manifest)
    job["metadata"]["namespace"] = NAMESPACE
    scheduling = job["spec"].setdefault("scheduling", {})
    scheduling.setdefault("nodeSelector", {})[nodeconfig.REAL_NODE_LABEL] = "true"
    scheduling.setdefault("tolerations", []).append(
        {"key": nodeconfig.REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}
    )
    env = job["spec"].setdefault("env", [])
    present = {entry.get("name") for entry in env}
    for name, value in (("TRAIN_STEP_SECONDS", STEP_SECONDS), ("TRAIN_PROGRESS_INTERVAL", "1")):
        if name not in present:
            env.append({"name": name, "value": value})
    return job


def recreate(jobs: TrainingJobClient, job: dict[str, Any]) -> TrainingJob:
    name = job["metadata"]["name"]
    try:
        jobs.get(name)
    except JobNotFound:
        pass
    else:
        say(f"{NAMESPACE}/{name} is there from an earlier run: deleting it (and its pods) to show a new run")
        try:
            jobs.delete(name, wait=True, timeout=DELETE_TIMEOUT)
        except JobNotFound:
            pass
        except WaitTimeout:
            raise ToolError(
                f"timed out after {DELETE_TIMEOUT:.0f}s waiting for {NAMESPACE}/{name} to be deleted"
            ) from None
    env = " ".join(f"{e['name']}={e['value']}" for e in job["spec"]["env"])
    say(
        f"applying {shown(EXAMPLE)} as {NAMESPACE}/{name} on node {nodeconfig.NODE_NAME}, with spec.env {env}"
    )
    return jobs.create(job)


def guard(watch: JobWatch, problems: list[ToolError], finished: threading.Event, own_operator: bool) -> None:
    """Ends `watch` when the operator or a component of the cluster dies (the job would never change
    again)."""
    while not finished.wait(POLL_SECONDS):
        try:
            check_processes(own_operator)
        except ToolError as error:
            problems.append(error)
            watch.close()
            return


def follow(jobs: TrainingJobClient, name: str, own_operator: bool = True) -> TrainingJob:
    """Prints a line per change until the job finishes; returns it Completed, raises otherwise."""
    began = time.monotonic()
    watch = jobs.watch(name, timeout=TIMEOUT)
    problems: list[ToolError] = []
    finished = threading.Event()
    watchdog = threading.Thread(
        target=guard, args=(watch, problems, finished, own_operator), name="watchdog", daemon=True
    )
    watchdog.start()
    last_line = last_message = ""
    try:
        for job in watch:
            line = job.summary()
            if line != last_line:
                elapsed = time.monotonic() - began
                print(f"  {elapsed:6.1f}s  {NAMESPACE}/{name}  {line}", flush=True)
                last_line = line
            message = job.status.message
            if message and message != last_message:
                print(f"           {message}", flush=True)
                last_message = message
    except WaitTimeout:
        raise ToolError(
            f"{NAMESPACE}/{name} did not complete within {TIMEOUT:.0f}s (DEMO_TIMEOUT); it is {last_line}"
        ) from None
    except JobDeleted:
        raise ToolError(f"{NAMESPACE}/{name} was deleted while the demo watched it") from None
    finally:
        finished.set()
        watch.close()
        watchdog.join()
    if problems:
        raise problems[0]
    status = watch.last.status
    if status.state != "Completed":
        raise ToolError(f"{NAMESPACE}/{name} failed: {status.failure_reason or status.message}")
    return watch.last


def look_around(name: str, own_operator: bool = True) -> None:
    env = "hack/dev-cluster.sh env"
    if "TJ_DEV_DIR" in os.environ:
        env = f"TJ_DEV_DIR={shlex.quote(os.environ['TJ_DEV_DIR'])} {env}"
    logs = LOGS
    ns = NAMESPACE
    if own_operator:
        operator = f"""  operator log:       {shown(logs / f"{OPERATOR}.log")}
  operator metrics:   curl -s http://127.0.0.1:{METRICS_PORT}/metrics | grep '^trainingjob_'
  make deploy                             # as a platform team installs it: here on the real node"""
    else:
        operator = "  operator log:       kubectl logs -n trainingjob-system deploy/trainingjob-operator"
    print(
        f"""
The job is Completed. Look around (it stays until you delete it or stop the demo):
  eval "$({env})"      # KUBECONFIG and the built kubectl on PATH
  kubectl get tj,pods -n {ns} -o wide     # the pods ran on node {nodeconfig.NODE_NAME}, in containers
  kubectl get events -n {ns} --sort-by=.lastTimestamp
  kubectl describe tj {name} -n {ns}
  kubectl trainingjob describe {name} -n {ns}   # the kubectl plugin: a row per rank, pod, node, exit code
  kubectl get tj {name} -n {ns} -o jsonpath='{{.status}}' | python3 -m json.tool
  kubectl logs {name}-worker-0 -n {ns}   # rank 0's trainer output, served by the node's kubelet
  hack/dev-cluster.sh status              # the control plane and the real node's processes
  kubelet log:        {shown(logs / "kubelet.log")}
{operator}
Run it again: make demo (creates the job anew; the cluster, its node and the operator are reused).
Stop everything: make demo-down (or make dev-cluster-down): the node is drained and the machine restored.""",
        flush=True,
    )


def main() -> int:
    kubeconfig = KUBECONFIG
    try:
        state = read_state()
        if state is None or not state.get("real_node"):
            raise ToolError(
                "the local cluster with its real node is not running: `make demo` starts it "
                "(hack/dev-cluster.sh up --with real-node)"
            )
        jobs = TrainingJobClient(NAMESPACE, kubeconfig=kubeconfig)
        ensure_namespace(jobs.kube)
        own_operator = not deployed_operator(jobs.kube)
        if not own_operator:
            say(
                "the operator installed by `make deploy` runs the job (`make undeploy`: the demo's own again)"
            )
        python = sys.executable
        if own_operator:
            ensure_process(
                OPERATOR,
                [
                    python,
                    "-m",
                    "controller",
                    f"--kubeconfig={kubeconfig}",
                    f"--metrics-bind-address=127.0.0.1:{METRICS_PORT}",
                    "--metrics-secure=false",
                    f"--health-probe-bind-address=127.0.0.1:{HEALTH_PORT}",
                    f"--namespace={NAMESPACE}",
                    f"--lease-namespace={NAMESPACE}",
                    "--progress-interval=0",
                ],
                wait_http=f"http://127.0.0.1:{HEALTH_PORT}/readyz",
            )
        job = recreate(jobs, demo_job())
        say(f"watching {NAMESPACE}/{job.name} (times since it was created):")
        follow(jobs, job.name, own_operator)
        look_around(job.name, own_operator)
    except ToolError as error:
        say(f"error: {error}")
        say(f"logs: {shown(LOGS)}; stop everything with `make demo-down`")
        return 1
    except KubeError as error:
        say(f"error: the API server answered: {error}")
        return 1
    except TrainingJobError as error:
        say(f"error: {error}")
        return 1
    except KeyboardInterrupt:
        say("interrupted; the cluster, its node and the operator keep running (`make demo-down` stops them)")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
