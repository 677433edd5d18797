"""Kubeflow's training-operator v1 as the bench's peer: its CRD, what it needs to start out of a
cluster, its process, and the PyTorchJob that matches the bench's TrainingJob.

Why apart: `make bench-peer` (testbed/harness/bench/peer.py) runs this operator and ours on one cluster, so
everything specific to the peer sits in one module. It is built like the other optional components
(`hack/kube-bins.sh ensure training-operator`, cached), and it runs as a process on 127.0.0.1:

- its webhook server's certificate must be at the hard-coded /tmp/k8s-webhook-server/serving-certs:
  the process runs in a private mount namespace whose /tmp is a directory of the bench's own
  (`unshare --mount`), so the machine's /tmp is not touched;
- its certificate rotator wants the Secret `training-operator-webhook-cert` in the namespace named by
  MY_POD_NAMESPACE; an empty one is enough (the rotator fills it in), and no webhook configuration is
  installed, so the API server never calls the webhooks;
- it gives every worker an init container that waits for the master's DNS name (an alpine image);
  `--pytorch-init-container-template-file` points at an empty list instead, as kwok runs no
  containers and this operator's pods have none either;
- what it reads (a copy of the kubeconfig, the init-container list) is put into that private /tmp
  too, so it is found wherever the bench's dev directory is (under the machine's /tmp, which the
  private one hides, as in the tests);
- it exits 2 after SIGTERM (a panic on shutdown, upstream), which the bench accepts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Final

import yaml

from controller.resources import CRDS, NAMESPACES, SECRETS, Resource
from controller.runtime.client import KubeClient
from controller.runtime.errors import AlreadyExists
from testbed.addons.optional import KUBEFLOW_TRAINING_OPERATOR
from testbed.cluster.kube_bins import ensure
from testbed.cluster.pki import openssl
from testbed.common import JsonDict, free_port, in_private_mounts
from testbed.harness.base import wait_established
from testbed.harness.bench.operator import Operator

COMPONENT: Final = KUBEFLOW_TRAINING_OPERATOR
NAMESPACE: Final = "kubeflow"
WEBHOOK_SECRET: Final = "training-operator-webhook-cert"  # noqa: S105 - a Secret's name
PYTORCHJOBS: Final = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
CRD_FILE: Final = "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
# The flags the issue calls "tuned": client-go's rate limit raised and 16 reconcile workers.
TUNED: Final = ("--kube-api-qps=500", "--kube-api-burst=1000", "--controller-threads=16")
# The same image as the bench's TrainingJobs get by default (kwok never pulls it).
IMAGE: Final = "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"
# Inside its private mount namespace: its /tmp, and what the bench puts there for it.
PRIVATE_TMP: Final = "/tmp"  # noqa: S108 - a private mount, not the machine's /tmp
KUBECONFIG_FILE: Final = "kubeconfig"
INIT_CONTAINERS_FILE: Final = "init-containers.yaml"


def pytorch_job(name: str, namespace: str, replicas: int) -> JsonDict:
    """A PyTorchJob of `replicas` pods (1 master, the rest workers) in the container `pytorch`, the one
    the operator injects the distributed environment into."""

    def replica(count: int) -> JsonDict:
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [{"name": "pytorch", "image": IMAGE}]}},
        }

    specs: JsonDict = {"Master": replica(1)}
    if replicas > 1:
        specs["Worker"] = replica(replicas - 1)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {"bench": "true"}},
        "spec": {"pytorchReplicaSpecs": specs},
    }


def pytorch_job_running(job: JsonDict) -> bool:
    """Kubeflow's "Running": the condition Running is True (its conditions are its state)."""
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Running" and c.get("status") == "True" for c in conditions)


def binary() -> Path:
    """The operator's binary, built on first use (hack/kube-bins.sh)."""
    return ensure(COMPONENT) / COMPONENT


def install(client: KubeClient) -> Path:
    """Builds (or finds) the operator, applies its PyTorchJob CRD server-side (about 600 KB, too big
    for a client-side apply's annotation), and makes its namespace and empty webhook Secret; returns
    the binary."""
    directory = ensure(COMPONENT)
    doc = yaml.safe_load((directory / CRD_FILE).read_text())
    client.patch(CRDS, None, doc["metadata"]["name"], doc, patch_type="apply", field_manager="bench")
    wait_established(client, doc["metadata"]["name"])
    for resource, namespace, body in (
        (NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        (
            SECRETS,
            NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": WEBHOOK_SECRET, "namespace": NAMESPACE},
            },
        ),
    ):
        with contextlib.suppress(AlreadyExists):
            client.create(resource, namespace, body)
    return directory / COMPONENT


class KubeflowOperator(Operator):
    """Kubeflow's training-operator as a process: metrics, probes and webhooks on 127.0.0.1 ports of
    their own, its /tmp private (see the module's docstring)."""

    samples_python_stacks = False  # a Go binary

    name = "Kubeflow training-operator"

    def __init__(self, binary: Path, kubeconfig: Path, work: Path, log_path: Path, extra: tuple[str, ...]):
        self.health_port = free_port()
        self.webhook_port = free_port()
        self.work = work
        self.binary = binary
        self.kubeconfig = kubeconfig
        super().__init__(kubeconfig, log_path, extra)

    @property
    def private_binary(self) -> str:
        """The binary's path inside the private /tmp: where the cache lies under the machine's /tmp
        (a HOME or TJ_CACHE_DIR there), the mount hides its own path (`prepare` links it in)."""
        return f"{PRIVATE_TMP}/{COMPONENT}"

    def build_command(self, kubeconfig: Path, extra: tuple[str, ...]) -> list[str]:
        script = 'mount --bind "$1" /tmp && shift && exec "$@"'
        return in_private_mounts(
            script,
            str(self.work / "tmp"),
            self.private_binary,
            f"--kubeconfig={PRIVATE_TMP}/{KUBECONFIG_FILE}",
            "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{self.port}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            f"--webhook-server-port={self.webhook_port}",
            f"--pytorch-init-container-template-file={PRIVATE_TMP}/{INIT_CONTAINERS_FILE}",
            "--zap-log-level=info",
            *extra,
        )

    def prepare(self) -> None:
        """The private /tmp with a self-signed serving certificate, the empty init-container list and
        the kubeconfig."""
        private = self.work / "tmp"
        certs = private / "k8s-webhook-server" / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        if not (certs / "tls.crt").exists():
            openssl(
                *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.crt"),
                *("-days", "30", "-subj", "/CN=training-operator", "-addext", "subjectAltName=IP:127.0.0.1"),
                cwd=certs,
            )
        (private / INIT_CONTAINERS_FILE).write_text("[]\n")
        linked = private / COMPONENT
        linked.unlink(missing_ok=True)
        try:
            linked.hardlink_to(self.binary)
        except OSError:  # another file system
            shutil.copy2(self.binary, linked)
        copy = private / KUBECONFIG_FILE
        copy.touch(mode=0o600)
        shutil.copyfile(self.kubeconfig, copy)

    def environment(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "MY_POD_NAMESPACE": NAMESPACE}

    def ready(self) -> bool:
        return self.get_port(self.health_port, "/readyz")[0] == 200

    def arguments(self) -> list[str]:
        return self.command[self.command.index(self.private_binary) + 1 :]
