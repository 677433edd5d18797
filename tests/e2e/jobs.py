"""Helpers for end-to-end tests of TrainingJobs: manifests, reading a job back, its Events, extra nodes.

Why: the reconcile, bad-input and example tests all apply a job, wait for a state, read its status,
Events and owned objects, and some need capacity the shared dev cluster does not have (nodes of a
given shape, a PriorityClass). Those cluster-scoped additions are made here so that they never
disturb other tests sharing the cluster: extra nodes are tainted, so only pods that tolerate the
taint land on them, and everything is removed afterwards.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from crd import contract
from testbed import Kubectl, KubectlError, fake_node, wait_for
from tests.cluster import SESSION
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]

COMBINED_PREFIX = "(combined from similar events): "
# kubectl errors that mean "the API server is briefly away" (other tests restart the shared one).
TRANSIENT_ERRORS = (
    "connection refused",
    "was refused",
    "connection reset",
    "EOF",
    "i/o timeout",
    "TLS handshake timeout",
    "the server is currently unable to handle the request",
    "the server was unable to return a response",
)

T = TypeVar("T")


def patient(probe: Callable[[], T | None]) -> Callable[[], T | None]:
    """`probe` for wait_for, answering None (not yet) while the API server is unreachable."""

    def wrapped() -> T | None:
        try:
            return probe()
        except KubectlError as error:
            if any(fragment in error.stderr for fragment in TRANSIENT_ERRORS):
                return None
            raise

    return wrapped


def wait(description: str, probe: Callable[[], T | None], timeout: float = 60) -> T:
    """wait_for, riding out brief API server outages."""
    return wait_for(description, patient(probe), timeout=timeout)


@dataclass(frozen=True)
class PatientKubectl(Kubectl):
    """A Kubectl that repeats a command while the API server is unreachable (other tests restart
    the shared one), up to `patience` seconds; any other failure is returned or raised at once."""

    patience: float = 60.0

    @classmethod
    def of(cls, kubectl: Kubectl) -> PatientKubectl:
        return cls(kubectl.binary, kubectl.kubeconfig, kubectl.extra)

    def attempt(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        def probe() -> subprocess.CompletedProcess[str] | None:
            result = Kubectl.attempt(self, *args, stdin=stdin)
            if result.returncode != 0 and any(fragment in result.stderr for fragment in TRANSIENT_ERRORS):
                return None
            return result

        return wait_for(f"kubectl {' '.join(args)} to reach the API server", probe, timeout=self.patience)

    def run(self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
        result = self.attempt(*args, stdin=stdin)
        if check and result.returncode != 0:
            raise KubectlError(tuple(args), result.returncode, result.stderr)
        return result.stdout


def kubeconfig_to_nowhere(path: Path) -> int:
    """Writes the dev cluster's admin kubeconfig with its server moved to a closed port on 127.0.0.1
    (a cluster that is down, without stopping the shared one); returns the port."""
    config = yaml.safe_load(SESSION.kubeconfig.read_text())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return port


def job_manifest(name: str, **spec: Any) -> JsonDict:
    """A TrainingJob with the required fields (CPU-only, two workers) and `spec` on top."""
    body: JsonDict = {"model": "cnn", "dataset": "mnist", "numWorkers": 2, "gpusPerWorker": 0}
    body.update(spec)
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": body,
    }


def get_job(kubectl: Kubectl, namespace: str, name: str) -> JsonDict:
    return kubectl.get_json("trainingjob", name, "-n", namespace)


def status_of(kubectl: Kubectl, namespace: str, name: str) -> JsonDict:
    status = get_job(kubectl, namespace, name).get("status") or {}
    assert isinstance(status, dict)
    return status


def condition(status: JsonDict, type_: str) -> JsonDict | None:
    for entry in status.get("conditions") or []:
        if entry.get("type") == type_:
            assert isinstance(entry, dict)
            return entry
    return None


def wait_for_state(kubectl: Kubectl, namespace: str, name: str, state: str, timeout: float = 60) -> JsonDict:
    """Waits until the job's status.state is `state`, and returns the whole job."""

    def probe() -> JsonDict | None:
        job = get_job(kubectl, namespace, name)
        return job if (job.get("status") or {}).get("state") == state else None

    try:
        return wait(f"TrainingJob {name} {state}", probe, timeout=timeout)
    except AssertionError as error:
        status = (kubectl.get_or_none("trainingjob", name, "-n", namespace) or {}).get("status")
        raise AssertionError(f"{error}\nstatus: {json.dumps(status, indent=1)}") from None


def pods_of(kubectl: Kubectl, namespace: str, job: str) -> list[JsonDict]:
    pods = kubectl.items("pods", "-n", namespace, "-l", f"{contract.JOB_NAME_LABEL}={job}")
    return sorted(pods, key=lambda pod: str(pod["metadata"]["name"]))


def events_of(kubectl: Kubectl, namespace: str, name: str, kind: str = contract.KIND) -> list[JsonDict]:
    """The Events about one object, as `kubectl get events --field-selector involvedObject.name=...`."""
    selector = f"involvedObject.name={name},involvedObject.kind={kind}"
    return kubectl.items("events", "-n", namespace, "--field-selector", selector)


def event_messages(events: Sequence[JsonDict], reason: str) -> set[str]:
    """Messages of the events with `reason`; client-go style aggregation prefixes are stripped."""
    return {
        str(event.get("message", "")).removeprefix(COMBINED_PREFIX)
        for event in events
        if event.get("reason") == reason
    }


def wait_for_events(
    kubectl: Kubectl, namespace: str, name: str, wanted: dict[str, Sequence[str]], timeout: float = 30
) -> list[JsonDict]:
    """Waits until the job has an Event for every (reason, message fragment) in `wanted`."""

    def probe() -> list[JsonDict] | None:
        events = events_of(kubectl, namespace, name)
        for reason, fragments in wanted.items():
            messages = event_messages(events, reason)
            if not all(any(fragment in message for message in messages) for fragment in fragments):
                return None
        return events

    try:
        return wait(f"events of {name}: {wanted}", probe, timeout=timeout)
    except AssertionError as error:
        seen = [(e.get("reason"), e.get("message")) for e in events_of(kubectl, namespace, name)]
        raise AssertionError(f"{error}\nevents: {seen}") from None


def reconciled_versions(operator: OperatorProcess, namespace: str, name: str) -> list[str]:
    """resourceVersions of the job that the operator finished reconciling, in order (its debug log)."""
    return [
        str(entry.get("resourceVersion"))
        for entry in operator.logs()
        if entry.get("action") == "reconciled"
        and entry.get("namespace") == namespace
        and entry.get("name") == name
    ]


def wait_until_quiet(
    kubectl: Kubectl, operator: OperatorProcess, namespace: str, name: str, reconciles: int = 2
) -> JsonDict:
    """Waits until the operator has reconciled the job's current version `reconciles` times (retries,
    requeues) without writing it, and returns the job. A status write would have made a new version."""

    def probe() -> JsonDict | None:
        job = get_job(kubectl, namespace, name)
        version = str(job["metadata"]["resourceVersion"])
        return job if reconciled_versions(operator, namespace, name).count(version) >= reconciles else None

    return wait(f"{reconciles} reconciles of {name} without a write", probe)


def write_requests(operator: OperatorProcess) -> dict[str, float]:
    """rest_client_requests_total summed per method that writes for jobs (POST, PATCH, DELETE). PUT is
    left out: the operator's only PUTs renew its leader election Lease, every few seconds whatever
    the jobs do, so a count of them says nothing of a write loop."""
    totals = dict.fromkeys(("POST", "PATCH", "DELETE"), 0.0)
    for line in operator.metrics().splitlines():
        if not line.startswith("rest_client_requests_total{"):
            continue
        series, _, value = line.rpartition(" ")
        labels = dict(
            part.split("=", 1) for part in series.partition("{")[2].rstrip("}").split(",") if "=" in part
        )
        method = labels.get("method", "").strip('"')
        if method in totals:
            totals[method] += float(value)
    return totals


def assert_healthy(operator: OperatorProcess) -> None:
    assert operator.alive(), f"the operator exited:\n{operator.tail()}"
    code, body = operator.get("/healthz")
    assert code == 200, body


# ------------------------------------------------------------------------------ cluster-scoped helpers


def node_manifest(
    name: str, *, gpus: int, labels: dict[str, str], taints: Sequence[JsonDict], cpu: str = "64"
) -> JsonDict:
    """A fake GPU node that kwok manages (it turns Ready and runs pods bound to it): one of
    the testbed's fake nodes with extra labels and taints."""
    node = fake_node(name, gpus=gpus, cpu=cpu)
    node["metadata"]["labels"].update(labels)
    node["spec"] = {"taints": list(taints)}
    return node


def _node_ready(kubectl: Kubectl, name: str) -> bool:
    node = kubectl.get_or_none("node", name)
    if node is None:
        return False
    conditions = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@contextlib.contextmanager
def extra_nodes(
    kubectl: Kubectl,
    count: int,
    *,
    gpus: int,
    labels: dict[str, str],
    taint: JsonDict,
    prefix: str = "tj-e2e",
) -> Iterator[list[str]]:
    """`count` more Ready kwok nodes with `labels` and `taint`, deleted afterwards.

    The taint keeps every other test's pods off them; names start with `prefix` and a random suffix
    so concurrent runs never collide (and sort after the dev cluster's gpu-node-*).
    """
    suffix = uuid.uuid4().hex[:6]
    names = [f"{prefix}-{suffix}-{index}" for index in range(count)]
    try:
        for name in names:
            manifest = node_manifest(name, gpus=gpus, labels=labels, taints=[taint])
            kubectl.run("create", "-f", "-", stdin=json.dumps(manifest))
        wait(
            f"nodes {', '.join(names)} Ready",
            lambda: all(_node_ready(kubectl, name) for name in names),
            timeout=60,
        )
        yield names
    finally:
        for name in names:
            kubectl.run("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


@contextlib.contextmanager
def priority_class(kubectl: Kubectl, name: str, value: int = 1000) -> Iterator[None]:
    """Makes sure PriorityClass `name` exists; one created here is deleted afterwards.

    preemptionPolicy Never: pods of this class never evict other tests' pods from the shared cluster.
    """
    created = False
    if kubectl.get_or_none("priorityclass", name) is None:
        manifest = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/created-by": "trainingjob-e2e"}},
            "value": value,
            "preemptionPolicy": "Never",
            "description": "created by the trainingjob-operator end-to-end tests",
        }
        result = kubectl.attempt("create", "-f", "-", stdin=json.dumps(manifest))
        if result.returncode != 0 and "AlreadyExists" not in result.stderr:
            raise AssertionError(f"cannot create PriorityClass {name}: {result.stderr}")
        created = result.returncode == 0
    try:
        yield
    finally:
        if created:
            kubectl.run("delete", "priorityclass", name, "--ignore-not-found", "--wait=false", check=False)


@contextlib.contextmanager
def persistent_volume(
    kubectl: Kubectl,
    namespace: str,
    claim: str,
    *,
    size: str = "1Gi",
    modes: Sequence[str] = ("ReadWriteMany",),
) -> Iterator[str]:
    """A PersistentVolume bound ahead to the claim `claim` of `namespace` (made by an example or the
    operator), for pods on kwok's nodes (the provisioner serves the real node only). Deleted
    afterwards; yields its name. Its hostPath is never touched: kwok's nodes mount nothing."""
    name = f"{namespace}-{claim}"[:253]
    manifest = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": list(modes),
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": f"/nonexistent/{name}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    kubectl.run("create", "-f", "-", stdin=json.dumps(manifest))
    try:
        yield name
    finally:
        kubectl.run("delete", "pv", name, "--ignore-not-found", "--wait=false", check=False)


def wait_for_bound_claim(kubectl: Kubectl, namespace: str, claim: str, timeout: float = 60) -> JsonDict:
    def probe() -> JsonDict | None:
        found = kubectl.get_or_none("pvc", claim, "-n", namespace)
        return found if found is not None and found.get("status", {}).get("phase") == "Bound" else None

    return wait(f"claim {claim} bound", probe, timeout=timeout)


class PodWatch:
    """`kubectl get pods --watch` for one job's pods (or, without `job`, every pod of the namespace),
    recording every watch event (type, pod) in order.

    kubectl prints one JSON object per line; a reader thread collects them. The watch lists the
    existing pods first (as ADDED events), so `started()` tells when it is in place.
    """

    def __init__(self, kubectl: Kubectl, namespace: str, job: str | None = None) -> None:
        selector = ["-l", f"{contract.JOB_NAME_LABEL}={job}"] if job is not None else []
        command = [
            str(kubectl.binary),
            f"--kubeconfig={kubectl.kubeconfig}",
            *kubectl.extra,
            "get",
            "pods",
            "-n",
            namespace,
            *selector,
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ]
        self._lock = threading.Lock()
        self._events: list[tuple[str, JsonDict]] = []
        self._process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        self._reader = threading.Thread(target=self._read, name="pod-watch", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        buffer = ""
        for line in self._process.stdout:
            buffer += line
            try:
                value = json.loads(buffer)
            except ValueError:
                continue
            buffer = ""
            with self._lock:
                self._events.append((str(value["type"]), value["object"]))

    def events(self) -> list[tuple[str, JsonDict]]:
        with self._lock:
            return list(self._events)

    def stop(self) -> list[tuple[str, JsonDict]]:
        """Ends the watch and returns all its events."""
        if self._process.poll() is None:
            self._process.terminate()
        self._process.wait(timeout=30)
        self._reader.join(timeout=30)
        return self.events()
