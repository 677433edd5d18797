"""Test helpers for the local control plane: the project's kubectl, waits with deadlines, playing kubelet.

Why: no kubelet runs on the local cluster (kwok stands in for it and only moves pods to Running and
removes deleted ones), so how a training container ends is the test's decision. `end_pod` writes what
a kubelet would write when a container exits: the phase, the container's terminated state with exit code
and reason (e.g. OOMKilled), and optionally a DisruptionTarget condition (preemption, eviction, node
drain). `lose_node` makes a node behave like one whose kubelet died. Everything goes through the
project's built kubectl, the client users use.

Usage::

    from tests.cluster import Kubectl, end_pod, wait_for
    kubectl = Kubectl.from_dev_cluster()
    end_pod(kubectl, "ns", "job-worker-1", exit_code=137, reason="OOMKilled")
    wait_for("job failed",
             lambda: kubectl.get_json("trainingjob", "job", "-n", "ns")["status"].get("state") == "Failed")
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from testbed.cluster.podstatus import disruption_condition, now_rfc3339, terminated_status_patch

REPO = Path(__file__).resolve().parent.parent
DEV = Path(os.environ.get("TJ_DEV_DIR", REPO / ".dev"))
KWOK_NODE_LABEL = "kwok.x-k8s.io/managed"

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold before its deadline; the message says what was awaited and the last value."""


def wait_for(
    description: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.25
) -> T:
    """Polls `probe` until it returns something truthy, and returns it; fails after `timeout` seconds.

    Tests wait for conditions with deadlines like this, never with fixed sleeps.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {description} (last: {last!r})")
        time.sleep(interval)


class KubectlError(Exception):
    def __init__(self, args: tuple[str, ...], returncode: int, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip()}")
        self.command = args
        self.returncode = returncode
        self.stderr = stderr


@dataclass(frozen=True)
class Kubectl:
    """The project's built kubectl bound to one kubeconfig (admin, or an impersonating one)."""

    binary: Path
    kubeconfig: Path
    extra: tuple[str, ...] = ()

    @classmethod
    def from_dev_cluster(cls) -> Kubectl:
        return cls(DEV / "bin" / "kubectl", DEV / "kubeconfig")

    def as_user(self, user: str, groups: tuple[str, ...] = ()) -> Kubectl:
        extra = (*self.extra, f"--as={user}", *(f"--as-group={group}" for group in groups))
        return Kubectl(self.binary, self.kubeconfig, extra)

    def command(self) -> list[str]:
        """kubectl with this kubeconfig, for a process the test starts itself (`logs -f`, `port-forward`)."""
        return [str(self.binary), f"--kubeconfig={self.kubeconfig}", *self.extra]

    def run(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        command = [*self.command(), *args]
        result = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(tuple(args), result.returncode, result.stderr)
        return result.stdout

    def attempt(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Runs kubectl and returns the whole result, for tests that expect a refusal."""
        command = [*self.command(), *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120, check=False)

    def get_json(self, *args: str) -> dict[str, Any]:
        out = self.run("get", *args, "-o", "json")
        value = json.loads(out)
        assert isinstance(value, dict)
        return value

    def get_or_none(self, *args: str) -> dict[str, Any] | None:
        result = self.attempt("get", *args, "-o", "json")
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise KubectlError(tuple(args), result.returncode, result.stderr)
        value = json.loads(result.stdout)
        assert isinstance(value, dict)
        return value

    def apply(self, manifest: dict[str, Any] | str, *extra: str) -> str:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.run("apply", "-f", "-", *extra, stdin=text)

    def items(self, *args: str) -> list[dict[str, Any]]:
        items = self.get_json(*args).get("items", [])
        assert isinstance(items, list)
        return items


@contextmanager
def throwaway_cluster(dev_dir: Path, *, nodes: int = 1) -> Iterator[Kubectl]:
    """A control plane of its own, in `dev_dir` (TJ_DEV_DIR), stopped when the block ends.

    For tests that install and remove cluster-wide objects (the operator's ClusterRole, the CRD) which
    the other tests of the session share on the session's cluster.
    """
    env = dict(os.environ, TJ_DEV_DIR=str(dev_dir))
    script = REPO / "hack" / "dev-cluster.sh"
    subprocess.run(
        [str(script), "up", "--nodes", str(nodes)], env=env, check=True, capture_output=True, timeout=600
    )
    try:
        yield Kubectl(dev_dir / "bin" / "kubectl", dev_dir / "kubeconfig")
    finally:
        subprocess.run([str(script), "down"], env=env, check=False, capture_output=True, timeout=120)


def dev_cluster(*args: str) -> None:
    """hack/dev-cluster.sh with these arguments (its progress lines go to the test's output)."""
    subprocess.run([str(REPO / "hack" / "dev-cluster.sh"), *args], check=True, timeout=1800)


def require_optional(name: str) -> None:
    """Makes an optional component (kueue, coscheduling) run on the dev cluster: `up --with <name>`
    adds it (built the first time) or, when it runs, puts back any of its CRDs a test took away."""
    dev_cluster("up", "--with", name)


def api_served(kubectl: Kubectl, group_version: str, plurals: set[str]) -> bool:
    """Whether the API server's discovery lists every resource of `plurals` in `group_version`."""
    result = kubectl.attempt("get", "--raw", f"/apis/{group_version}")
    if result.returncode != 0:
        return False
    names = {entry.get("name") for entry in json.loads(result.stdout).get("resources", [])}
    return plurals <= names


@contextmanager
def optional_api_withdrawn(
    kubectl: Kubectl, component: str, crd: str, group_version: str, plurals: set[str], *, restart: bool
) -> Iterator[None]:
    """An optional component's API (`plurals` in `group_version`) not served in the block, as on a
    cluster without the component. When the session's cluster runs it, its CRD `crd` is deleted for
    the block and `up --with component` puts it back afterwards (`restart`: the component restarted
    too, so that its informers start afresh instead of sitting out their relist backoff)."""
    present = kubectl.get_or_none("crd", crd) is not None
    if present:
        kubectl.run("delete", "crd", crd, "--wait=true", "--timeout=60s")
    try:
        wait_for(f"{crd} not in discovery", lambda: not api_served(kubectl, group_version, plurals))
        yield
    finally:
        if present:
            require_optional(component)
            if restart:
                dev_cluster("restart", component)


def end_pod(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    *,
    exit_code: int = 0,
    reason: str | None = None,
    message: str | None = None,
    disruption: str | None = None,
    container: str | None = None,
) -> dict[str, Any]:
    """Ends a pod's containers the way a kubelet reports it, and returns the patched pod.

    exit_code 0 ends the pod Succeeded, anything else Failed. `reason` is the container's terminated
    reason (default Completed or Error; e.g. OOMKilled). `disruption` adds the DisruptionTarget
    condition with that reason (PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager,
    TerminationByKubelet). `container` ends only that container's state (the others keep theirs); by
    default every container ends with the same code. The patch is testbed/cluster/podstatus.py's, which the
    chaos run and the soak send too.
    """
    pod = kubectl.get_json("pod", name, "-n", namespace)
    patch = terminated_status_patch(
        pod,
        exit_code=exit_code,
        reason=reason,
        message=message,
        disruption=disruption,
        container=container,
    )
    return patch_pod_status(kubectl, namespace, name, patch)


def add_disruption_condition(kubectl: Kubectl, namespace: str, name: str, reason: str) -> None:
    """Adds DisruptionTarget=True without ending the pod (what the scheduler or eviction API does first)."""
    patch_pod_status(kubectl, namespace, name, {"status": {"conditions": [disruption_condition(reason)]}})


def patch_pod_status(kubectl: Kubectl, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    """Strategic-merge patches the pod's status subresource (as a kubelet would); returns the pod."""
    out = kubectl.run(
        "patch",
        "pod",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=strategic",
        "-p",
        json.dumps(patch),
        "-o",
        "json",
    )
    patched = json.loads(out)
    assert isinstance(patched, dict)
    return patched


def lose_node(kubectl: Kubectl, node: str) -> None:
    """Makes `node` behave like one whose kubelet died: kwok stops managing it (no lease renewals, pods
    deleted on it stay Terminating), and its Ready condition turns Unknown as the node lifecycle
    controller would report after the grace period."""
    kubectl.run("label", "node", node, f"{KWOK_NODE_LABEL}=false", "--overwrite")
    now = now_rfc3339()
    patch = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ]
        }
    }
    kubectl.run("patch", "node", node, "--subresource=status", "--type=strategic", "-p", json.dumps(patch))


def restore_node(kubectl: Kubectl, node: str) -> None:
    """Gives a lost node back to kwok, which marks it Ready again."""
    kubectl.run("label", "node", node, f"{KWOK_NODE_LABEL}=true", "--overwrite")
    kubectl.run(
        "taint", "node", node, "node.kubernetes.io/unreachable-", "node.kubernetes.io/not-ready-", check=False
    )
