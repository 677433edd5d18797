"""A TrainingJob's pod template on the real node: init containers, sidecars, and the volumes a job brings.

Why: what a job puts in `spec.podTemplate` (docs/pod-template.md) only matters if a kubelet runs it as
the job meant: init containers before the trainer, a native sidecar stopped after it, a classic
sidecar that never exits not keeping the job from completing, and the job's own code and data from
a ConfigMap, a Secret and a claim that outlives it. Here the real operator merges the template into
each worker pod and the local cluster's real node (testbed/node/realnode.py) runs it: the trainer
is the reference trainer with real torch in the trainer image, the other containers run in the base
image (`python:3.11-slim`, Debian's Python), and a claim is one of the local-path provisioner's.
"""

from __future__ import annotations

from typing import Any

import pytest

from testbed import PYTHON_IMAGE, Kubectl, claim_directory, container_states, pod_processes, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import job_manifest, pods_of, wait_for_bound_claim, wait_for_state
from tests.e2e.realnode import PACE, job_on_node

JsonDict = dict[str, Any]
pytestmark = pytest.mark.slow

# A sidecar's program: it says it runs, then waits for the kubelet's SIGTERM and exits 0 on it. It
# never ends by itself, as a log shipper or a mesh proxy does not.
SIDECAR_PROGRAM = (
    "import signal, sys, threading\n"
    "def stop(signum, frame):\n"
    "    print('stopped', flush=True)\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('serving', flush=True)\n"
    "threading.Event().wait()\n"
)


def sidecar(name: str, **fields: Any) -> JsonDict:
    return {"name": name, "image": PYTHON_IMAGE, "command": ["python", "-c", SIDECAR_PROGRAM], **fields}


def sidecar_job(name: str, template: JsonDict, clean_pod_policy: str) -> JsonDict:
    """One worker of the reference trainer, two short epochs, with `template` merged into its pod."""
    return job_on_node(
        job_manifest(
            name,
            numWorkers=1,
            hyperparameters={"epochs": 2},
            env=[{"name": key, "value": value} for key, value in PACE.items()],
            podTemplate=template,
            cleanPodPolicy=clean_pod_policy,
        )
    )


def the_pod(cluster: Kubectl, namespace: str, job: str) -> JsonDict | None:
    pods = pods_of(cluster, namespace, job)
    return pods[0] if pods else None


# ---------------------------------------------------------------------------------------------------
# Init containers and sidecars

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


def test_init_containers_run_first_and_native_sidecars_stop_after_the_trainer(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    cluster = real_node
    start_operator("--progress-interval=0")
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
                sidecar("log-shipper", restartPolicy="Always"),
                {
                    "name": "fetch",
                    "image": PYTHON_IMAGE,
                    "command": ["python", "/tools/fetch.py", "/scratch/dataset.txt"],
                    "volumeMounts": mounts,
                },
            ],
            "containers": [{"name": "trainer", "volumeMounts": [mounts[1]]}],
        }
    }
    # The job may complete before the kubelet has stopped the sidecar (the trainer decides): keep the
    # pod to see how it ends.
    cluster.apply(sidecar_job("native", template, "None"), "-n", namespace)

    def initializing() -> JsonDict | None:
        pod = the_pod(cluster, namespace, "native")
        states = container_states(pod, "initContainerStatuses") if pod else {}
        return pod if "running" in states.get("fetch", {}) else None

    pod = wait_for("the init container running", initializing, 180)
    assert pod["status"]["phase"] == "Pending"
    initialized = next(c for c in pod["status"]["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "False"
    assert "running" in container_states(pod, "initContainerStatuses")["log-shipper"]
    assert container_states(pod)["trainer"] == {"waiting": {"reason": "PodInitializing"}}
    cluster.run("exec", "native-worker-0", "-n", namespace, "-c", "fetch", "--", "touch", "/scratch/go")

    job = wait_for_state(cluster, namespace, "native", "Completed", timeout=240)
    assert job["status"]["currentEpoch"] == 2

    def succeeded() -> JsonDict | None:
        pod = the_pod(cluster, namespace, "native")
        return pod if pod and pod["status"]["phase"] == "Succeeded" else None

    pod = wait_for("the pod to succeed once its sidecar stopped", succeeded, 90)
    init = container_states(pod, "initContainerStatuses")
    assert init["fetch"]["terminated"]["exitCode"] == 0
    assert init["log-shipper"]["terminated"]["exitCode"] == 0  # stopped by SIGTERM after the trainer
    assert (
        init["log-shipper"]["terminated"]["finishedAt"]
        >= container_states(pod)["trainer"]["terminated"]["finishedAt"]
    )
    assert container_states(pod)["trainer"]["terminated"]["reason"] == "Completed"
    logs = ("native-worker-0", "-n", namespace)
    assert cluster.run("logs", *logs, "-c", "fetch") == "fetched dataset.txt\n"
    assert cluster.run("logs", *logs, "-c", "log-shipper") == "serving\nstopped\n"
    assert "training finished: 2 epochs" in cluster.run("logs", *logs, "-c", "trainer")


@pytest.mark.parametrize(
    "case",
    [
        # A classic sidecar never exits: its pod stays Running, which cleanPodPolicy Running (the default)
        # ends.
        ({"spec": {"containers": [sidecar("proxy")]}}, "Running"),
        # A native one is stopped by the kubelet after the trainer; All removes the finished pods too.
        ({"spec": {"initContainers": [sidecar("proxy", restartPolicy="Always")]}}, "All"),
    ],
    ids=["classic", "native"],
)
def test_a_job_with_a_sidecar_that_never_exits_completes_and_its_pods_are_cleaned_up(
    real_node: Kubectl, namespace: str, start_operator: StartOperator, case: tuple[JsonDict, str]
) -> None:
    cluster = real_node
    template, policy = case
    start_operator("--progress-interval=0")
    cluster.apply(sidecar_job("meshed", template, policy), "-n", namespace)
    pod = wait_for("the worker pod", lambda: the_pod(cluster, namespace, "meshed"), 60)
    uid = pod["metadata"]["uid"]

    job = wait_for_state(cluster, namespace, "meshed", "Completed", timeout=240)
    status = job["status"]
    assert status["currentEpoch"] == 2
    succeeded = next(c for c in status["conditions"] if c["type"] == "Succeeded")
    assert (succeeded["status"], succeeded["reason"]) == ("True", "AllWorkersSucceeded")
    wait_for("the job's pods deleted", lambda: not pods_of(cluster, namespace, "meshed"), 120)
    wait_for("no process of the pod left on the node", lambda: not pod_processes({uid}), 60)
    events = cluster.items("events", "-n", namespace, "--field-selector", "involvedObject.name=meshed")
    deleted = [e["message"] for e in events if e["reason"] == "SuccessfulDelete"]
    assert deleted == [f"Deleted pod: meshed-worker-0 (job Completed; cleanPodPolicy {policy})"]


def test_a_kept_pod_runs_its_classic_sidecar_after_the_trainer_until_the_job_is_deleted(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    cluster = real_node
    start_operator("--progress-interval=0")
    cluster.apply(sidecar_job("kept", {"spec": {"containers": [sidecar("proxy")]}}, "None"), "-n", namespace)

    wait_for_state(cluster, namespace, "kept", "Completed", timeout=240)
    pod = the_pod(cluster, namespace, "kept")
    assert pod is not None
    states = container_states(pod)
    assert states["trainer"]["terminated"]["exitCode"] == 0
    assert "running" in states["proxy"]
    assert pod["status"]["phase"] == "Running"  # the classic sidecar still runs
    assert pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "trainer"
    # kubectl logs without -c shows the trainer (the annotation), -c the sidecar.
    assert "training finished: 2 epochs" in cluster.run("logs", "kept-worker-0", "-n", namespace)
    assert cluster.run("logs", "kept-worker-0", "-n", namespace, "-c", "proxy") == "serving\n"
    uid = pod["metadata"]["uid"]
    assert pod_processes({uid})  # the sidecar's process, and the pod's sandbox

    cluster.run("delete", "trainingjob", "kept", "-n", namespace)
    wait_for("the pod gone", lambda: the_pod(cluster, namespace, "kept") is None, 120)
    wait_for("no process of the pod left on the node", lambda: not pod_processes({uid}), 60)


# ---------------------------------------------------------------------------------------------------
# Volumes: a claim shared by jobs, a ConfigMap of code, a Secret

# Your own code: its paths come from the environment and the working directory.
CODE = {
    "prepare.py": (
        "import os, sys\n"
        "os.makedirs(os.path.join(sys.argv[1], 'wikitext'), exist_ok=True)\n"
        "open(os.path.join(sys.argv[1], 'wikitext', 'train.txt'), 'w').write('a dataset\\n')\n"
        "print('dataset prepared')\n"
    ),
    "train.py": (
        "import os, stat\n"
        "data, token = os.environ['DATA'], os.environ['API_TOKEN_FILE']\n"
        "print('dataset:', open(os.path.join(data, 'wikitext', 'train.txt')).read().strip())\n"
        "with open(os.path.join(data, 'runs.txt'), 'a') as runs:\n"
        "    runs.write(os.environ['POD_NAME'] + '\\n')\n"
        "print('runs:', ' '.join(open(os.path.join(data, 'runs.txt')).read().split()))\n"
        "print('secret:', open(token).read(), oct(stat.S_IMODE(os.stat(token).st_mode)))\n"
        "print('in the code directory:', os.getcwd() == os.path.dirname(os.path.abspath(__file__)))\n"
    ),
}


@pytest.fixture
def dataset_claim(real_node: Kubectl, namespace: str) -> str:
    """A claim of the cluster's default StorageClass, bound once a pod on the node uses it."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    real_node.apply(claim, "-n", namespace)
    return "data"


def own_code_job(name: str, *, prepare: bool) -> JsonDict:
    mount = {"name": "data", "mountPath": "/data"}
    code = {"name": "code", "mountPath": "/code"}
    api = {"name": "api", "mountPath": "/secrets/api", "readOnly": True}
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
            ],
            "containers": [
                {
                    "name": "trainer",
                    "workingDir": "/code",
                    "env": [
                        {"name": "DATA", "value": "/data"},
                        {"name": "API_TOKEN_FILE", "value": "/secrets/api/token"},
                    ],
                    "volumeMounts": [mount, code, api],
                }
            ],
        }
    }
    if prepare:
        template["spec"]["initContainers"] = [
            {
                "name": "prepare",
                "image": PYTHON_IMAGE,
                "command": ["python", "/code/prepare.py", "/data"],
                "volumeMounts": [mount, code],
            }
        ]
    manifest = job_manifest(
        name, numWorkers=1, image=PYTHON_IMAGE, command=["python", "train.py"], podTemplate=template
    )
    return job_on_node(manifest, memory="64Mi")


def test_a_claim_is_shared_by_jobs_and_configmap_and_secret_volumes_reach_the_trainer(
    real_node: Kubectl, namespace: str, start_operator: StartOperator, dataset_claim: str
) -> None:
    cluster = real_node
    start_operator()
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
    wait_for_state(cluster, namespace, "first", "Completed", timeout=180)
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
    wait_for_state(cluster, namespace, "second", "Completed", timeout=180)
    second = cluster.run("logs", "second-worker-0", "-n", namespace)
    assert "runs: first-worker-0 second-worker-0" in second
    wait_for_bound_claim(cluster, namespace, dataset_claim)
    stored = claim_directory(cluster, namespace, dataset_claim)
    assert (stored / "runs.txt").read_text() == "first-worker-0\nsecond-worker-0\n"
    assert (stored / "wikitext" / "train.txt").read_text() == "a dataset\n"
