"""The local kubelet as a kubelet: `kubectl logs` and the kubelet API's checks.

Why: on kwok's nodes the local kubelet is what serves container logs, so what `kubectl logs` shows is
whatever it does. These tests go through the real API server and the built kubectl: the API server
dials the kubelet endpoint in the Node's status with its client certificate. The pure rules behind
it are tested in tests/hack/test_local_kubelet_*.py; what a pod template's init containers, sidecars
and volumes do on a kubelet is tested on the real node (tests/e2e/test_real_node_pods.py).
"""

from __future__ import annotations

import http.client
import re
import shutil
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hack.devcluster.pki import issue, openssl
from tests.cluster import DEV, Kubectl, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.localkubelet import (
    LocalKubelet,
    alive,
    kubelet_port,
    local_kubelet,
    training_job,
    wait_for_trainers,
)

JsonDict = dict[str, Any]
PKI = DEV / "run" / "pki"
__all__ = ["local_kubelet"]  # the fixture


# ---------------------------------------------------------------------------------------------------
# kubectl logs


def test_kubectl_logs_follows_tails_and_stamps_a_running_trainer(
    cluster: Kubectl, namespace: str, start_operator: StartOperator, local_kubelet: Callable[[], LocalKubelet]
) -> None:
    start_operator("--progress-interval=0")
    local_kubelet()
    cluster.apply(training_job("lg", epochs=8), "-n", namespace)
    rank0 = wait_for_trainers(namespace, 2)["lg-worker-0"]
    pod = ("lg-worker-0", "-n", namespace)

    def tail() -> str | None:
        out = cluster.run("logs", *pod, "--tail=2")
        return out if "epoch 1/8:" in out else None

    assert len(wait_for("rank 0's first epoch in its last lines", tail, 60).splitlines()) == 2
    stamped = cluster.run("logs", *pod, "--tail=1", "--timestamps")
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z \d{4}-\d\d-\d\d .* rank=0 ", stamped), stamped
    assert len(cluster.run("logs", *pod, "--limit-bytes=16").encode()) == 16
    assert cluster.run("logs", *pod, "--since-time=2999-01-01T00:00:00Z") == ""
    assert "rank=0 INFO train: epoch 1/8:" in cluster.run("logs", *pod, "--since=1h")

    follow = subprocess.Popen(
        [str(cluster.binary), f"--kubeconfig={cluster.kubeconfig}", "logs", "-f", *pod],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()
        assert alive(rank0.pid), first  # it streams while the trainer still trains
        rest = follow.stdout.read()  # to the end (not communicate(): it would skip what readline buffered)
        assert follow.stderr is not None
        err = follow.stderr.read()
        follow.wait(60)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    lines = (first + rest).splitlines()
    assert lines[0].endswith(
        f"progress reports go to the annotation ml.example.com/progress of pod {namespace}/lg-worker-0"
    )
    assert [int(n) for n in re.findall(r"epoch (\d)/8:", first + rest)] == list(range(1, 9))
    assert lines[-1].endswith("training finished: 8 epochs, 40 steps")

    previous = cluster.attempt("logs", *pod, "--previous")
    assert previous.returncode != 0
    assert 'previous terminated container "trainer" in pod "lg-worker-0" not found' in previous.stderr
    unknown = cluster.attempt("logs", *pod, "-c", "nope")
    assert "container nope is not valid for pod lg-worker-0" in unknown.stderr


# ---------------------------------------------------------------------------------------------------
# The kubelet API's authentication and authorisation


def kubelet_get(path: str, cert: tuple[Path, Path] | None = None) -> tuple[int, str]:
    """GET on the kubelet endpoint, its serving certificate verified with the cluster's CA for 127.0.0.1."""
    context = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    connection = http.client.HTTPSConnection("127.0.0.1", kubelet_port(), context=context, timeout=30)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


@pytest.fixture
def certificates(tmp_path: Path) -> Path:
    """A directory with a client certificate of the cluster's CA for user `nobody`, and a certificate
    for the API server's own name from a CA the cluster does not know."""
    ours = tmp_path / "pki"
    ours.mkdir()
    for name in ("ca.crt", "ca.key"):
        shutil.copy(PKI / name, ours / name)
    issue(ours, "nobody", "/CN=nobody/O=developers", "extendedKeyUsage=clientAuth")
    strange = tmp_path / "strange"
    strange.mkdir()
    openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt"),
        *("-days", "1", "-subj", "/CN=another-ca"),
        cwd=strange,
    )
    issue(strange, "impostor", "/CN=kube-apiserver-kubelet-client", "extendedKeyUsage=clientAuth")
    shutil.copy(strange / "impostor.crt", ours / "impostor.crt")
    shutil.copy(strange / "impostor.key", ours / "impostor.key")
    return ours


def test_the_kubelet_api_wants_a_certificate_of_the_cluster_and_asks_the_api_server(
    namespace: str, local_kubelet: Callable[[], LocalKubelet], certificates: Path
) -> None:
    local_kubelet()
    path = f"/containerLogs/{namespace}/absent/trainer"
    assert kubelet_get(path) == (401, "Unauthorized")
    nobody = (certificates / "nobody.crt", certificates / "nobody.key")
    assert kubelet_get(path, nobody) == (
        403,
        "Forbidden (user=nobody, verb=get, resource=nodes, subresource(s)=[proxy])",
    )
    api_server = (PKI / "apiserver-kubelet-client.crt", PKI / "apiserver-kubelet-client.key")
    assert kubelet_get(path, api_server) == (404, 'pod "absent" does not exist')
    assert kubelet_get("/pods", api_server) == (404, "404 page not found")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        kubelet_get(path, (certificates / "impostor.crt", certificates / "impostor.key"))
