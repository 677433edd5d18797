"""Helpers for the lifecycle end-to-end tests: waiting on status, playing the trainer, private nodes.

Why: the lifecycle tests (gang restarts, failure classification, deadlines, suspend/resume, TTL,
clean-up, scheduling timeout, progress, success policy, node loss, gang scheduling) all wait for a
status to satisfy a predicate, replay pod watches to prove a gang was replaced as a whole, report
progress the way the trainer does (with the per-job ServiceAccount's token, never as admin), and some
need nodes of their own so that losing one, or filling its GPUs, never disturbs other tests sharing
the dev cluster.

A token given with `kubectl --token` next to the dev cluster's admin kubeconfig is not what the API
server authenticates: the admin client certificate is presented too and wins. `token_kubectl` writes a
kubeconfig that carries nothing but the server, its CA and the token.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from controller.runtime.clock import parse_time
from crd import contract
from testbed import Kubectl, KubectlError, lose_node, restore_node, wait_for
from tests.e2e.jobs import extra_nodes, get_job, pods_of, wait_for_state

JsonDict = dict[str, Any]
NO_WORKERS = {"pending": 0, "active": 0, "succeeded": 0, "failed": 0}
POOL_KEY = "tj-e2e/pool"
# Pod events from tests.e2e.jobs.PodWatch: (watch event type, pod).
WatchEvents = Sequence[tuple[str, JsonDict]]


# Generous: when another test restarts the shared API server, the scheduler and kwok can take a minute
# to catch up. A healthy cluster never gets near these.
TIMEOUT = 120.0


def wait_state(
    kubectl: Kubectl, namespace: str, name: str, state: str, *, timeout: float = TIMEOUT
) -> JsonDict:
    """tests.e2e.jobs.wait_for_state with the lifecycle tests' deadline; returns the job."""
    return wait_for_state(kubectl, namespace, name, state, timeout=timeout)


def wait_status(
    kubectl: Kubectl,
    namespace: str,
    name: str,
    description: str,
    predicate: Callable[[JsonDict], bool],
    *,
    timeout: float = TIMEOUT,
) -> JsonDict:
    """Waits until the job's status satisfies `predicate`; returns that status. A timeout shows it."""

    def probe() -> JsonDict | None:
        try:
            job = get_job(kubectl, namespace, name)
        except KubectlError as error:
            # Other tests on the shared cluster restart the API server now and then: wait it out.
            if "refused" in error.stderr or "connection reset" in error.stderr:
                return None
            raise
        status = job.get("status") or {}
        return status if predicate(status) else None

    try:
        return wait_for(f"{name}: {description}", probe, timeout=timeout)
    except AssertionError as error:
        job = kubectl.get_or_none("trainingjob", name, "-n", namespace) or {}
        raise AssertionError(f"{error}\nstatus: {json.dumps(job.get('status'), indent=1)}") from None


def workers(*, active: int = 0, succeeded: int = 0, failed: int = 0, pending: int = 0) -> dict[str, int]:
    """A status.workers value."""
    return {"pending": pending, "active": active, "succeeded": succeeded, "failed": failed}


def wait_workers(kubectl: Kubectl, namespace: str, name: str, expected: dict[str, int]) -> JsonDict:
    """Waits until status.workers is `expected`; returns the status."""
    return wait_status(
        kubectl, namespace, name, f"workers {expected}", lambda s: s.get("workers") == expected
    )


def when(moment: str) -> datetime:
    return parse_time(moment)


def pod_names(kubectl: Kubectl, namespace: str, job: str) -> list[str]:
    return [str(pod["metadata"]["name"]) for pod in pods_of(kubectl, namespace, job)]


def wait_pod_names(
    kubectl: Kubectl, namespace: str, job: str, expected: list[str], *, timeout: float = 60
) -> None:
    """Waits until the job's pods (terminating ones included) are exactly `expected`, by name."""
    wait_for(
        f"pods of {job}: {expected}",
        lambda: pod_names(kubectl, namespace, job) == expected,
        timeout=timeout,
    )


def uids(pods: Sequence[JsonDict]) -> set[str]:
    return {str(pod["metadata"]["uid"]) for pod in pods}


def env_value(pod: JsonDict, name: str) -> str | None:
    for entry in pod["spec"]["containers"][0].get("env", []):
        if entry["name"] == name:
            return str(entry["value"]) if "value" in entry else None
    return None


def attempt_of(pod: JsonDict) -> str:
    return str(pod["metadata"]["labels"][contract.ATTEMPT_LABEL])


def running_pods(kubectl: Kubectl, namespace: str, job: str, attempt: int, count: int) -> list[JsonDict]:
    """Waits until the job has exactly `count` pods, all of attempt `attempt` and Running."""

    def probe() -> list[JsonDict] | None:
        pods = pods_of(kubectl, namespace, job)
        ready = len(pods) == count and all(
            attempt_of(pod) == str(attempt)
            and pod.get("status", {}).get("phase") == "Running"
            and not pod["metadata"].get("deletionTimestamp")
            for pod in pods
        )
        return pods if ready else None

    return wait_for(f"{count} running pods of {job} attempt {attempt}", probe, timeout=TIMEOUT)


def assert_replaced_as_a_gang(events: WatchEvents, old: set[str]) -> list[datetime]:
    """Replays a pod watch: no pod outside `old` was added before every pod in `old` was deleted.

    Returns the creation times of the pods added afterwards.
    """
    remaining = set(old)
    created: list[datetime] = []
    for kind, pod in events:
        uid = str(pod["metadata"]["uid"])
        if kind == "DELETED":
            remaining.discard(uid)
        elif kind == "ADDED" and uid not in old:
            name = pod["metadata"]["name"]
            assert not remaining, f"{name} ({uid}) was added while {sorted(remaining)} still existed"
            created.append(parse_time(pod["metadata"]["creationTimestamp"]))
    assert not remaining, f"pods of the old gang never deleted: {sorted(remaining)}"
    return created


# ----------------------------------------------------------------------------------- the trainer


def progress_patch(report: JsonDict) -> str:
    return json.dumps({"metadata": {"annotations": {contract.PROGRESS_ANNOTATION: json.dumps(report)}}})


@dataclass(frozen=True)
class Trainer:
    """A worker's identity: its pod-bound token of the namespace's trainer account, as `kubectl` (for
    `auth can-i` and `auth whoami`) and as the raw PATCH the progress reporter sends (kubectl's patch
    reads the pod first, which a trainer may not)."""

    kubectl: Kubectl
    token: str
    server: str
    ca_file: Path

    def patch_pod(self, namespace: str, pod: str, body: str) -> tuple[int, str]:
        """(HTTP status, the answer's message) of a merge patch of `pod`."""
        request = urllib.request.Request(  # noqa: S310 - the test cluster's https URL
            f"{self.server}/api/v1/namespaces/{namespace}/pods/{pod}",
            data=body.encode(),
            method="PATCH",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/merge-patch+json"},
        )
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(request, context=context, timeout=30) as answer:  # noqa: S310
                return int(answer.status), "ok"
        except urllib.error.HTTPError as error:
            return int(error.code), str(json.loads(error.read() or b"{}").get("message", ""))


def report_progress(trainer: Trainer, namespace: str, pod: str, report: JsonDict) -> None:
    """Patches the progress annotation on `pod` with the trainer's token, as its reporter does on rank 0."""
    status, message = trainer.patch_pod(namespace, pod, progress_patch(report))
    assert status == 200, message


def _cluster_fields(kubeconfig: Path) -> JsonDict:
    config = yaml.safe_load(kubeconfig.read_text(encoding="utf-8"))
    contexts = {entry["name"]: entry["context"] for entry in config.get("contexts", [])}
    clusters = {entry["name"]: entry["cluster"] for entry in config["clusters"]}
    current = contexts.get(config.get("current-context"))
    entry = clusters[current["cluster"]] if current else next(iter(clusters.values()))
    keys = ("server", "certificate-authority-data", "certificate-authority", "tls-server-name")
    return {key: entry[key] for key in keys if key in entry}


def token_kubectl(cluster: Kubectl, token: str, path: Path) -> Kubectl:
    """A kubectl that authenticates with `token` alone (no client certificate), via `path` (mode 0600)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": _cluster_fields(cluster.kubeconfig)}],
        "users": [{"name": "token", "user": {"token": token}}],
        "contexts": [{"name": "token", "context": {"cluster": "dev", "user": "token"}}],
        "current-context": "token",
    }
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    return Kubectl(cluster.binary, path)


def trainer_kubectl(cluster: Kubectl, namespace: str, job: str, directory: Path, rank: int = 0) -> Trainer:
    """The identity of worker `rank` of `job`: a token of the namespace's trainer ServiceAccount bound to
    that pod, as the kubelet mounts it."""
    account = contract.TRAINER_ACCOUNT
    pod = f"{job}-worker-{rank}"
    wait_for(
        f"ServiceAccount {account}",
        lambda: cluster.get_or_none("serviceaccount", account, "-n", namespace),
        timeout=60,
    )
    token = cluster.run(
        *("create", "token", account, "-n", namespace, "--duration=1h"),
        *("--bound-object-kind=Pod", f"--bound-object-name={pod}"),
    ).strip()
    assert token, "kubectl create token printed no token"
    path = directory / f"{pod}.kubeconfig"
    fields = _cluster_fields(cluster.kubeconfig)
    ca_file = directory / f"{pod}-ca.crt"
    if "certificate-authority-data" in fields:
        ca_file.write_bytes(base64.b64decode(fields["certificate-authority-data"]))
    else:
        ca_file.write_bytes(Path(fields["certificate-authority"]).read_bytes())
    return Trainer(token_kubectl(cluster, token, path), token, str(fields["server"]), ca_file)


# ------------------------------------------------------------------------------- private nodes


def retried(description: str, action: Callable[[], object], timeout: float = 120) -> None:
    """Runs a clean-up `action` until it succeeds: the shared API server may be briefly down (other
    tests restart it), and a node left behind would disturb everyone."""

    def attempt() -> bool:
        try:
            action()
        except KubectlError:
            return False
        return True

    wait_for(description, attempt, timeout=timeout, interval=1)


@contextlib.contextmanager
def node_pool(kubectl: Kubectl, namespace: str, count: int, gpus: int = 8) -> Iterator[list[str]]:
    """`count` kwok nodes only this test's jobs can use (see `pool_scheduling`), deleted afterwards."""
    taint = {"key": POOL_KEY, "value": namespace, "effect": "NoSchedule"}
    names: list[str] = []
    try:
        with extra_nodes(kubectl, count, gpus=gpus, labels={POOL_KEY: namespace}, taint=taint) as created:
            names.extend(created)
            try:
                yield created
            finally:
                # The namespace's pods go first, while kwok still completes their deletion: a pod left
                # on a deleted node stays Terminating (and keeps its namespace) until the pod garbage
                # collector's quarantine is over.
                for kind in ("trainingjobs", "pods"):
                    retried(
                        f"{kind} in {namespace} deleted",
                        functools.partial(
                            kubectl.run,
                            "delete",
                            kind,
                            "--all",
                            "-n",
                            namespace,
                            "--wait=true",
                            "--timeout=60s",
                        ),
                    )
    finally:
        for name in names:
            retried(
                f"node {name} deleted",
                functools.partial(kubectl.run, "delete", "node", name, "--ignore-not-found", "--wait=false"),
            )


@contextlib.contextmanager
def lost_node(kubectl: Kubectl, node: str) -> Iterator[None]:
    """`node` lost (tests.cluster.lose_node) for the block, and given back to kwok in any case."""
    lose_node(kubectl, node)
    try:
        yield
    finally:
        retried(f"node {node} restored", lambda: restore_node(kubectl, node))


def pool_scheduling(namespace: str, **extra: Any) -> JsonDict:
    """spec.scheduling that puts a job's pods on the test's `node_pool` and nowhere else."""
    toleration = {"key": POOL_KEY, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}
    return {"nodeSelector": {POOL_KEY: namespace}, "tolerations": [toleration], **extra}


def backoff(initial: int, maximum: int | None = None) -> JsonDict:
    """A restart backoff of `initial` seconds growing to `maximum` (four times `initial`)."""
    return {"initialDelaySeconds": initial, "maxDelaySeconds": maximum or initial * 4}


def running_attempt(attempt: int) -> Callable[[JsonDict], bool]:
    """A status check: Running in attempt `attempt`."""
    return lambda status: status.get("state") == "Running" and status.get("attempt") == attempt
