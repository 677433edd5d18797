"""The local kubelet as a kubelet: `kubectl logs`, the kubelet API's checks, sidecars, volumes.

Why: on the local cluster the local kubelet is the only thing that runs containers, so what `kubectl
logs` shows, what a pod with init containers and sidecars reports, and what a job finds in its volumes
is whatever it does. These tests go through the real API server and the built kubectl, with the real
operator creating the pods: the API server dials the kubelet endpoint in the Node's status with its
client certificate, and the pods carry the podTemplate as the operator merged it. The pure rules
behind it are tested in tests/hack/test_local_kubelet_*.py.
"""

from __future__ import annotations

import http.client
import re
import shutil
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hack.devcluster.pki import issue, openssl
from tests.cluster import DEV, Kubectl, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    job_manifest,
    persistent_volume,
    pods_of,
    wait_for_bound_claim,
    wait_for_state,
)
from tests.e2e.localkubelet import (
    FAST_EPOCHS,
    LocalKubelet,
    alive,
    container_processes,
    kubelet_port,
    local_kubelet,
    training_job,
    wait_for_trainers,
)

JsonDict = dict[str, Any]
PKI = DEV / "run" / "pki"
__all__ = ["local_kubelet"]  # the fixture


def container_states(pod: JsonDict, key: str = "containerStatuses") -> dict[str, JsonDict]:
    return {s["name"]: s["state"] for s in pod["status"].get(key) or []}


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


# ---------------------------------------------------------------------------------------------------
# Pods with init containers and sidecars

TOOLS = {
    # Waits for the test to say go (a file in the pod's emptyDir), then writes the "dataset".
    "fetch.py": (
        "import os, sys, time\n"
        "target = sys.argv[1]\n"
        "while not os.path.exists(os.path.join(os.path.dirname(target), 'go')):\n"
        "    time.sleep(0.1)\n"
        "open(target, 'w').write('42\\n')\n"
        "print('fetched', os.path.basename(target), flush=True)\n"
    ),
}


def sidecar_job(name: str, template: JsonDict) -> JsonDict:
    return job_manifest(
        name,
        numWorkers=1,
        hyperparameters={"epochs": 2},
        env=[{"name": key, "value": value} for key, value in FAST_EPOCHS.items()],
        podTemplate=template,
    )


def test_init_containers_run_first_and_native_sidecars_stop_after_the_trainer(
    cluster: Kubectl, namespace: str, start_operator: StartOperator, local_kubelet: Callable[[], LocalKubelet]
) -> None:
    start_operator("--progress-interval=0")
    kubelet = local_kubelet()
    cluster.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tools"}, "data": TOOLS},
        "-n",
        namespace,
    )
    mounts = [{"name": "tools", "mountPath": "/tools"}, {"name": "scratch", "mountPath": "/scratch"}]
    template = {
        "spec": {
            "volumes": [
                {"name": "tools", "configMap": {"name": "tools"}},
                {"name": "scratch", "emptyDir": {}},
            ],
            "initContainers": [
                {"name": "log-shipper", "image": "fluent/fluent-bit:3.1", "restartPolicy": "Always"},
                {
                    "name": "fetch",
                    "image": "python:3.12",
                    "command": ["python", "/tools/fetch.py", "/scratch/dataset.txt"],
                    "volumeMounts": mounts,
                },
            ],
            "containers": [{"name": "trainer", "volumeMounts": [mounts[1]]}],
        }
    }
    manifest = sidecar_job("native", template)
    # The job may complete before the kubelet has stopped the sidecar (the trainer decides): keep the
    # pod to see how it ends.
    manifest["spec"]["cleanPodPolicy"] = "None"
    cluster.apply(manifest, "-n", namespace)

    def initializing() -> JsonDict | None:
        pods = pods_of(cluster, namespace, "native")
        pod = pods[0] if pods else None
        states = container_states(pod, "initContainerStatuses") if pod else {}
        return pod if "running" in states.get("fetch", {}) else None

    pod = wait_for("the init container running", initializing, 90)
    assert pod["status"]["phase"] == "Pending"
    initialized = next(c for c in pod["status"]["conditions"] if c["type"] == "Initialized")
    assert (initialized["status"], initialized["message"]) == (
        "False",
        "containers with incomplete status: [fetch]",
    )
    assert "running" in container_states(pod, "initContainerStatuses")["log-shipper"]
    assert container_states(pod)["trainer"] == {"waiting": {"reason": "PodInitializing"}}
    (kubelet.pod_dir(pod) / "volumes" / "scratch" / "go").touch()

    job = wait_for_state(cluster, namespace, "native", "Completed", timeout=120)
    assert job["status"]["currentEpoch"] == 2

    def succeeded() -> JsonDict | None:
        [pod] = pods_of(cluster, namespace, "native")
        return pod if pod["status"]["phase"] == "Succeeded" else None

    pod = wait_for("the pod to succeed once its sidecar stopped", succeeded, 60)
    init = container_states(pod, "initContainerStatuses")
    assert init["fetch"]["terminated"]["exitCode"] == 0
    assert init["log-shipper"]["terminated"]["exitCode"] == 0  # the stand-in, stopped after the trainer
    assert container_states(pod)["trainer"]["terminated"]["reason"] == "Completed"
    logs = ("native-worker-0", "-n", namespace)
    assert cluster.run("logs", *logs, "-c", "fetch") == "fetched dataset.txt\n"
    shipper = cluster.run("logs", *logs, "-c", "log-shipper")
    assert (
        'log-shipper (fluent/fluent-bit:3.1) runs "(the image\'s default command)", which cannot run'
        in shipper
    )
    assert shipper.endswith("stand-in: stopped\n")
    assert "training finished: 2 epochs" in cluster.run("logs", *logs, "-c", "trainer")


ISTIO_LIKE = {"name": "istio-proxy", "image": "istio/proxyv2:1.22", "args": ["proxy", "sidecar"]}


@pytest.mark.parametrize(
    "case",
    [
        # A classic sidecar never exits: its pod stays Running, which cleanPodPolicy Running (the default)
        # ends.
        ({"spec": {"containers": [ISTIO_LIKE]}}, "Running"),
        # A native one is stopped by the kubelet after the trainer; All removes the finished pods too.
        ({"spec": {"initContainers": [{**ISTIO_LIKE, "restartPolicy": "Always"}]}}, "All"),
    ],
    ids=["classic", "native"],
)
def test_a_job_with_a_sidecar_that_never_exits_completes_and_its_pods_are_cleaned_up(
    cluster: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    local_kubelet: Callable[[], LocalKubelet],
    case: tuple[JsonDict, str],
) -> None:
    template, policy = case
    start_operator("--progress-interval=0")
    kubelet = local_kubelet()
    manifest = sidecar_job("meshed", template)
    manifest["spec"]["cleanPodPolicy"] = policy
    cluster.apply(manifest, "-n", namespace)

    job = wait_for_state(cluster, namespace, "meshed", "Completed", timeout=120)
    status = job["status"]
    assert status["currentEpoch"] == 2
    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert (succeeded["status"], succeeded["reason"]) == ("True", "AllWorkersSucceeded")
    wait_for("the job's pods deleted", lambda: not pods_of(cluster, namespace, "meshed"), 60)
    wait_for("every container process stopped", lambda: not container_processes(kubelet.state_dir), 60)
    events = cluster.items("events", "-n", namespace, "--field-selector", "involvedObject.name=meshed")
    deleted = [e["message"] for e in events if e["reason"] == "SuccessfulDelete"]
    assert deleted == [f"Deleted pod: meshed-worker-0 (job Completed; cleanPodPolicy {policy})"]


def test_a_kept_pod_runs_its_classic_sidecar_after_the_trainer_until_the_job_is_deleted(
    cluster: Kubectl, namespace: str, start_operator: StartOperator, local_kubelet: Callable[[], LocalKubelet]
) -> None:
    start_operator("--progress-interval=0")
    kubelet = local_kubelet()
    manifest = sidecar_job("kept", {"spec": {"containers": [ISTIO_LIKE]}})
    manifest["spec"]["cleanPodPolicy"] = "None"
    cluster.apply(manifest, "-n", namespace)

    wait_for_state(cluster, namespace, "kept", "Completed", timeout=120)
    [pod] = pods_of(cluster, namespace, "kept")
    states = container_states(pod)
    assert states["trainer"]["terminated"]["exitCode"] == 0
    assert "running" in states["istio-proxy"]
    assert pod["status"]["phase"] == "Running"  # as on a real node: the classic sidecar still runs
    assert pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "trainer"
    # kubectl logs without -c shows the trainer (the annotation), -c the sidecar's stand-in.
    assert "training finished: 2 epochs" in cluster.run("logs", "kept-worker-0", "-n", namespace)
    proxy_log = cluster.run("logs", "kept-worker-0", "-n", namespace, "-c", "istio-proxy")
    assert (
        "istio-proxy (istio/proxyv2:1.22) runs 'proxy sidecar', which cannot run on this machine" in proxy_log
    )
    assert container_processes(kubelet.state_dir)  # the stand-in runs
    assert (kubelet.pod_dir(pod) / "home").is_dir()

    cluster.run("delete", "trainingjob", "kept", "-n", namespace)
    wait_for("the stand-in to stop", lambda: not container_processes(kubelet.state_dir), 60)
    wait_for("the pod's own directories to go", lambda: not kubelet.pod_dir(pod).exists(), 30)


# ---------------------------------------------------------------------------------------------------
# Volumes: a claim shared by jobs, the pod's own volumes, hostPath under the dev directory

# Your own code as the local kubelet can run it: paths come from the environment and the arguments,
# which it remaps (it cannot rewrite paths written inside a program).
CODE = {
    "prepare.py": (
        "import os, sys\n"
        "os.makedirs(os.path.join(sys.argv[1], 'wikitext'), exist_ok=True)\n"
        "open(os.path.join(sys.argv[1], 'wikitext', 'train.txt'), 'w').write('a dataset\\n')\n"
        "print('dataset prepared')\n"
    ),
    "train.py": (
        "import os, stat\n"
        "data, token, cache = os.environ['DATA'], os.environ['API_TOKEN_FILE'], os.environ['CACHE']\n"
        "print('dataset:', open(os.path.join(data, 'wikitext', 'train.txt')).read().strip())\n"
        "with open(os.path.join(data, 'runs.txt'), 'a') as runs:\n"
        "    runs.write(os.environ['POD_NAME'] + '\\n')\n"
        "print('runs:', ' '.join(open(os.path.join(data, 'runs.txt')).read().split()))\n"
        "print('secret:', open(token).read(), oct(stat.S_IMODE(os.stat(token).st_mode)))\n"
        "open(os.path.join(cache, 'seen'), 'w').write('cached')\n"
        "print('in the code directory:', os.getcwd() == os.path.dirname(os.path.abspath(__file__)))\n"
    ),
}


@pytest.fixture
def dataset_claim(cluster: Kubectl, namespace: str) -> Iterator[str]:
    """A PersistentVolumeClaim bound to a volume made for it (the local cluster has no provisioner)."""
    with persistent_volume(cluster, namespace, "data"):
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        cluster.apply(claim, "-n", namespace)
        wait_for_bound_claim(cluster, namespace, "data")
        yield "data"


def own_code_job(name: str, *, prepare: bool) -> JsonDict:
    mount = {"name": "data", "mountPath": "/data"}
    code = {"name": "code", "mountPath": "/code"}
    template: JsonDict = {
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "code", "configMap": {"name": "code"}},
                {
                    "name": "api",
                    "secret": {
                        "secretName": "api",
                        "items": [{"key": "token", "path": "token", "mode": 0o400}],
                    },
                },
                {
                    "name": "cache",
                    "hostPath": {"path": f"/var/cache/trainingjob-test-{name}", "type": "DirectoryOrCreate"},
                },
            ],
            "containers": [
                {
                    "name": "trainer",
                    "workingDir": "/code",
                    "env": [
                        {"name": "DATA", "value": "/data"},
                        {"name": "API_TOKEN_FILE", "value": "/secrets/api/token"},
                        {"name": "CACHE", "value": "/cache"},
                    ],
                    "volumeMounts": [
                        mount,
                        code,
                        {"name": "api", "mountPath": "/secrets/api", "readOnly": True},
                        {"name": "cache", "mountPath": "/cache"},
                    ],
                }
            ],
        }
    }
    if prepare:
        template["spec"]["initContainers"] = [
            {
                "name": "prepare",
                "image": "python:3.12",
                "command": ["python", "/code/prepare.py", "/data"],
                "volumeMounts": [mount, code],
            }
        ]
    return job_manifest(name, numWorkers=1, command=["python", "train.py"], podTemplate=template)


def test_a_claim_is_shared_by_jobs_and_configmap_secret_and_hostpath_volumes_are_local(
    cluster: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    local_kubelet: Callable[[], LocalKubelet],
    dataset_claim: str,
) -> None:
    start_operator()
    kubelet = local_kubelet()
    cluster.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "code"}, "data": CODE}, "-n", namespace
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "api"},
        "stringData": {"token": "t0ken"},
    }
    cluster.apply(secret, "-n", namespace)

    cluster.apply(own_code_job("first", prepare=True), "-n", namespace)
    wait_for_state(cluster, namespace, "first", "Completed", timeout=120)
    assert cluster.run("logs", "first-worker-0", "-n", namespace, "-c", "prepare") == "dataset prepared\n"
    first = cluster.run("logs", "first-worker-0", "-n", namespace)
    assert first.splitlines() == [
        "dataset: a dataset",
        "runs: first-worker-0",
        "secret: t0ken 0o400",
        "in the code directory: True",
    ]

    # The next job, without the init container, finds what the first one left in the claim.
    cluster.apply(own_code_job("second", prepare=False), "-n", namespace)
    wait_for_state(cluster, namespace, "second", "Completed", timeout=120)
    second = cluster.run("logs", "second-worker-0", "-n", namespace)
    assert "runs: first-worker-0 second-worker-0" in second
    claim = kubelet.claim_dir(dataset_claim)
    assert (claim / "runs.txt").read_text() == "first-worker-0\nsecond-worker-0\n"

    [pod] = pods_of(cluster, namespace, "second")
    node = pod["spec"]["nodeName"]
    cached = kubelet.state_dir / "hostpath" / node / "var" / "cache" / "trainingjob-test-second" / "seen"
    assert cached.read_text() == "cached"
    assert not Path("/var/cache/trainingjob-test-second").exists()  # never the machine's own path
    assert (kubelet.pod_dir(pod) / "volumes" / "code" / "train.py").read_text() == CODE["train.py"]
