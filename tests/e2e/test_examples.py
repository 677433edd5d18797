"""Every example in examples/ applies cleanly and runs on the local cluster, as a user would run it.

The examples are applied with `kubectl apply -n <namespace>`. Those whose comments promise a
training result train to Completed on the local cluster's real node (testbed/node/realnode.py:
real torch in containers, claims of the local-path provisioner), placed there and made to fit the
machine by tests/e2e/realnode.py's `job_on_node`: the resume example continues from the checkpoints
an earlier job left on its retained claim, the bring-your-own example trains its own code from a
ConfigMap on a dataset from a claim. The others reach Running on kwok with one Running pod per worker,
their pods carrying what the example asks for. The advanced example asks for what the dev cluster does
not have: a PriorityClass `high-priority`, eight nodes labelled node-type=gpu-large (its nodeSelector)
with four free GPUs each, one worker per node (its hostname anti-affinity), and a volume for its
checkpoint claim. The test adds them and removes them afterwards; the extra nodes carry the
nvidia.com/gpu NoSchedule taint the example tolerates, so no other test's pod lands on them. Its
claim gets a PersistentVolume made for it (kwok's nodes run no provisioner).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd import contract
from crd.defaults import subschema
from testbed import PYTHON_IMAGE, REGISTRY, Image, Kubectl, WaitTimeout, claim_directory
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    PatientKubectl,
    assert_healthy,
    extra_nodes,
    get_job,
    job_manifest,
    persistent_volume,
    pods_of,
    priority_class,
    wait,
    wait_for_state,
)
from tests.e2e.operator import OperatorProcess
from tests.e2e.realnode import PACE, job_on_node

EXAMPLES = REPO / "examples"
SIMPLE_EXAMPLES = [
    "trainingjob-simple.yaml",
    "trainingjob-distributed.yaml",
    # Elastic: Running once minWorkers run; run_example waits for every worker. It trains for real in
    # tests/e2e/test_elastic_e2e.py.
    "trainingjob-elastic.yaml",
    # Its program (in the file's ConfigMap) trains for real with JAX in tests/frameworks/test_jax.py.
    "trainingjob-jax.yaml",
    # Its trainer's stop on SIGTERM is tests/trainer/test_preemption.py's.
    "trainingjob-preemptible.yaml",
]
# With every TensorFlow role, below; its program trains for real on the real node in
# tests/e2e/test_frameworks_real_node.py.
TENSORFLOW_EXAMPLE = "trainingjob-tensorflow.yaml"
# Run in a namespace enforcing the "restricted" Pod Security Standard by tests/e2e/test_pod_security.py.
RESTRICTED_EXAMPLE = "trainingjob-restricted.yaml"
# Trained to Completed on the real node, below.
TRAINED_EXAMPLES = ["trainingjob-resume.yaml", "trainingjob-byo.yaml"]
# Applied on kwok by tests/e2e/test_frameworks_admission_e2e.py and trained with the real frameworks on
# the real node by tests/e2e/test_xgboost_paddle_real_node.py.
FRAMEWORK_EXAMPLES = ["trainingjob-xgboost.yaml", "trainingjob-paddle.yaml"]
# Trained against the dev cluster's MLflow server on the real node by tests/e2e/test_mlflow_real_node.py.
TRACKED_EXAMPLES = ["trainingjob-mlflow.yaml"]
# Applied on kwok by tests/e2e/test_mpi_e2e.py and run with OpenMPI on the real node by
# tests/e2e/test_mpi_real_node.py.
MPI_EXAMPLE = "trainingjob-mpi.yaml"


@pytest.fixture
def kubectl(cluster: Kubectl) -> Kubectl:
    """The project's kubectl, riding out the restarts of the shared API server other tests make."""
    return PatientKubectl.of(cluster)


def load(path: Path) -> dict[str, Any]:
    """The example's TrainingJob (a file may hold the objects it uses before it)."""
    manifest = next(
        doc for doc in yaml.safe_load_all(path.read_text()) if doc and doc.get("kind") == contract.KIND
    )
    assert isinstance(manifest, dict)
    return manifest


def test_every_example_is_covered() -> None:
    assert sorted(path.name for path in EXAMPLES.glob("*.yaml")) == sorted(
        [
            *SIMPLE_EXAMPLES,
            "trainingjob-advanced.yaml",
            RESTRICTED_EXAMPLE,
            *TRAINED_EXAMPLES,
            *TRACKED_EXAMPLES,
            TENSORFLOW_EXAMPLE,
            MPI_EXAMPLE,
            *FRAMEWORK_EXAMPLES,
        ]
    )


def test_the_advanced_example_has_every_section_of_the_spec() -> None:
    """Its comment says so: every object of the spec (a new section must show up there too), but
    elastic, tensorflow and mpi, which change how the whole job runs (a PyTorch job under torchrun; a
    TensorFlow job's roles; an MPI launcher) and have examples of their own."""
    sections = {name for name, node in subschema("spec")["properties"].items() if node["type"] == "object"}
    own = {"elastic", "tensorflow", "mpi"}
    assert own <= sections
    assert sections - set(load(EXAMPLES / "trainingjob-advanced.yaml")["spec"]) == own


def run_example(kubectl: Kubectl, namespace: str, operator: OperatorProcess, path: Path) -> None:
    manifest = load(path)
    name = manifest["metadata"]["name"]
    assert "namespace" not in manifest["metadata"]

    result = kubectl.attempt("apply", "-n", namespace, "-f", str(path))

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no warnings either
    assert result.stdout.strip().splitlines()[-1] == f"trainingjob.{contract.GROUP}/{name} created"
    workers = int(manifest["spec"]["numWorkers"])
    wait_for_state(kubectl, namespace, name, "Running", timeout=120)

    def every_worker_running() -> dict[str, Any] | None:
        found = get_job(kubectl, namespace, name)
        return found if found["status"]["workers"]["active"] == workers else None

    # An elastic job is Running once minWorkers run; the others may still be starting.
    job = wait(f"all {workers} workers of {name} running", every_worker_running, timeout=120)
    assert job["status"]["workers"]["active"] == workers
    gpus = int(manifest["spec"].get("gpusPerWorker", 1))
    assert job["status"]["resources"] == {"gpus": workers * gpus, "workers": workers}
    pods = pods_of(kubectl, namespace, name)
    assert [pod["metadata"]["name"] for pod in pods] == sorted(f"{name}-worker-{i}" for i in range(workers))
    assert all(pod["status"]["phase"] == "Running" for pod in pods)
    framework = manifest["spec"].get("framework", "pytorch")
    image = manifest["spec"].get("image", contract.DEFAULT_IMAGES[framework])
    assert {pod["spec"]["containers"][0]["image"] for pod in pods} == {image}
    assert_healthy(operator)


@pytest.mark.parametrize("example", SIMPLE_EXAMPLES)
def test_example_runs(kubectl: Kubectl, namespace: str, operator: OperatorProcess, example: str) -> None:
    run_example(kubectl, namespace, operator, EXAMPLES / example)


def test_the_tensorflow_example_runs_a_pod_per_role(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    """A chief, two workers, a parameter server and an evaluator, each Running with its task in TF_CONFIG;
    the checkpoint claim the evaluator reads gets a volume made for it (no provisioner here)."""
    with persistent_volume(kubectl, namespace, "tf-parameter-servers-checkpoints"):
        result = kubectl.attempt("apply", "-n", namespace, "-f", str(EXAMPLES / TENSORFLOW_EXAMPLE))
        assert (result.returncode, result.stderr) == (0, "")
        assert result.stdout.splitlines() == [
            "configmap/tf-training-code created",
            f"trainingjob.{contract.GROUP}/tf-parameter-servers created",
        ]

        def every_role_running() -> dict[str, Any] | None:
            found = get_job(kubectl, namespace, "tf-parameter-servers")
            status = found.get("status") or {}
            return (
                found if status.get("roleSummary") == "chief 1/1, worker 2/2, ps 1/1, evaluator 1/1" else None
            )

        job = wait("every role of tf-parameter-servers running", every_role_running, timeout=120)
        assert job["status"]["state"] == "Running"
        assert job["status"]["replicas"] == 2  # the workers (kubectl scale sets numWorkers)
        pods = {pod["metadata"]["name"]: pod for pod in pods_of(kubectl, namespace, "tf-parameter-servers")}
        assert sorted(pods) == [
            "tf-parameter-servers-chief-0",
            "tf-parameter-servers-evaluator-0",
            "tf-parameter-servers-ps-0",
            "tf-parameter-servers-worker-0",
            "tf-parameter-servers-worker-1",
        ]
        chief = pods["tf-parameter-servers-chief-0"]["spec"]["containers"][0]
        assert chief["image"] == contract.DEFAULT_IMAGES["tensorflow"]
        assert chief["command"] == ["python", "/code/train_tf.py"]
        env = {entry["name"]: entry.get("value") for entry in chief["env"]}
        assert json.loads(env["TF_CONFIG"])["task"] == {"type": "chief", "index": 0}
        assert env["RANK"] == "0"
        assert_healthy(operator)


@pytest.fixture
def gpu_large_nodes(kubectl: Kubectl) -> Iterator[list[str]]:
    """Eight nodes matching the advanced example's nodeSelector, tainted as GPU nodes often are."""
    labels = {"node-type": "gpu-large", "nvidia.com/gpu.product": "A100-SXM4-80GB"}
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    with extra_nodes(kubectl, 8, gpus=8, labels=labels, taint=taint, prefix="tj-e2e-large") as names:
        yield names


def test_advanced_example_runs(
    kubectl: Kubectl, namespace: str, gpu_large_nodes: list[str], operator: OperatorProcess
) -> None:
    claim = "advanced-training-checkpoints"
    with priority_class(kubectl, "high-priority"), persistent_volume(kubectl, namespace, claim, size="500Gi"):
        run_example(kubectl, namespace, operator, EXAMPLES / "trainingjob-advanced.yaml")
        pods = pods_of(kubectl, namespace, "advanced-training")
        # One worker per node (hostname anti-affinity), all on the gpu-large nodes.
        assert sorted(pod["spec"]["nodeName"] for pod in pods) == sorted(gpu_large_nodes)
        assert {pod["spec"]["priorityClassName"] for pod in pods} == {"high-priority"}
        assert {pod["spec"]["priority"] for pod in pods} == {
            int(kubectl.get_json("priorityclass", "high-priority")["value"])
        }
        # torchrun runs the reference trainer the trainer's ConfigMap mounts, four processes per worker,
        # checkpointing to the claim.
        trainer = pods[0]["spec"]["containers"][0]
        assert (trainer["command"], trainer["args"]) == (["torchrun"], ["/etc/trainingjob/train.py"])
        env = {entry["name"]: entry.get("value") for entry in trainer["env"]}
        assert (env["PET_NPROC_PER_NODE"], env["PET_NNODES"], env["WORLD_SIZE"]) == ("4", "8", "32")
        assert env["CHECKPOINT_DIR"] == "/checkpoints"
        volumes = {volume["name"]: volume for volume in pods[0]["spec"]["volumes"]}
        assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": claim}
        # Its pod template: labels and annotations beside the operator's, the trainer's pull policy.
        for pod in pods:
            assert pod["metadata"]["labels"]["team"] == "vision"
            assert pod["metadata"]["labels"][contract.JOB_NAME_LABEL] == "advanced-training"
            assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
            assert pod["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
        # The job and its pods go before the PriorityClass and the nodes do; the claim stays.
        kubectl.run("delete", "trainingjob", "advanced-training", "-n", namespace)
        wait("the advanced example's pods gone", lambda: not pods_of(kubectl, namespace, "advanced-training"))
        kept = kubectl.get_json("pvc", claim, "-n", namespace)
        assert "ownerReferences" not in kept["metadata"]
        assert "deletionTimestamp" not in kept["metadata"]


# ---------------------------------------------------------------------------------------------------
# Trained to Completed on the real node


def applied(kubectl: Kubectl, namespace: str, documents: list[dict[str, Any]]) -> list[str]:
    """`kubectl apply` of the documents as one multi-document YAML; the lines it printed."""
    result = kubectl.attempt("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(documents))
    assert (result.returncode, result.stderr) == (0, "")
    return result.stdout.splitlines()


def test_the_resume_example_continues_from_the_claim_an_earlier_job_retained(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    kubectl = PatientKubectl.of(real_node)
    start_operator("--progress-interval=0")
    claim = "gpt-training-checkpoints"
    # The earlier job: checkpoints on the claim the operator creates for it (retained by default).
    earlier = job_manifest(
        "gpt-training",
        hyperparameters={"epochs": 3},
        checkpoint={"enabled": True},
        env=[{"name": key, "value": value} for key, value in PACE.items()],
    )
    kubectl.apply(job_on_node(earlier), "-n", namespace)
    done = wait_for_state(kubectl, namespace, "gpt-training", "Completed", timeout=240)
    assert done["status"]["checkpoint"]["latest"] == "/checkpoints/epoch-3"
    created = kubectl.get_json("pvc", claim, "-n", namespace)
    assert "ownerReferences" not in created["metadata"]
    stored = claim_directory(kubectl, namespace, claim)

    kubectl.run("delete", "trainingjob", "gpt-training", "-n", namespace)

    def collected() -> bool:
        # The garbage collector deleted what the job owned (its pods, its Services)...
        gone = kubectl.get_or_none("service", "gpt-training-headless", "-n", namespace) is None
        return gone and not pods_of(kubectl, namespace, "gpt-training")

    wait("the deleted job's objects collected", collected, 120)
    # ... and left the claim alone.
    kept = kubectl.get_json("pvc", claim, "-n", namespace)
    assert kept["metadata"]["uid"] == created["metadata"]["uid"]
    assert "deletionTimestamp" not in kept["metadata"]

    # The example as it is, placed on the node and paced like the earlier job.
    resume = job_on_node(load(EXAMPLES / "trainingjob-resume.yaml"))
    resume["spec"]["env"] = [{"name": key, "value": value} for key, value in PACE.items()]
    assert applied(kubectl, namespace, [resume]) == [f"trainingjob.{contract.GROUP}/gpt-resume created"]
    job = wait_for_state(kubectl, namespace, "gpt-resume", "Completed", timeout=240)
    status = job["status"]
    assert (status["currentEpoch"], status["totalEpochs"]) == (6, 6)
    assert status["checkpoint"]["latest"] == "/checkpoints/epoch-6"
    log = kubectl.run("logs", "gpt-resume-worker-0", "-n", namespace)
    # The new job read the checkpoint the earlier one wrote, and trained only what was left.
    assert "resuming from epoch 3 (checkpoint /checkpoints/epoch-3): 3 of 6 epochs left" in log
    assert "epoch 3/6" not in log
    assert "epoch 4/6" in log
    # Every 2 epochs (and the last), 3 kept: what is left of the earlier job's, then the new ones.
    assert sorted(path.name for path in stored.glob("epoch-*")) == ["epoch-3", "epoch-4", "epoch-6"]


def secret_command(text: str) -> list[str]:
    """The `kubectl create secret` command of the example's opening comment, its lines joined."""
    lines = [line.removeprefix("#").strip() for line in text.splitlines() if line.startswith("#")]
    start = next(i for i, line in enumerate(lines) if line.startswith("kubectl create secret"))
    words: list[str] = []
    for line in lines[start:]:
        words.append(line.removesuffix("\\"))
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(words))


def test_the_byo_example_trains_its_own_code_on_its_dataset_to_completed(
    registry: Kubectl, namespace: str, start_operator: StartOperator, node_images: Callable[[str], Image]
) -> None:
    """The example as its comment says to apply it, with the local cluster's registry for the user's:
    its private image `registry.example/myteam/trainer:1.0` is pushed there as `myteam/trainer:1.0`
    (the base image the node has: Debian's Python, all the example's plain-Python code needs), the
    Secret is made with the comment's command for that registry, and the node pulls the image with
    it through the job's imagePullSecrets. The init container's `python:3.12-slim` is not on this
    machine either and becomes the base image. The code from a ConfigMap, the dataset prepared on a
    claim and the job are the example's."""
    kubectl = PatientKubectl.of(registry)
    start_operator("--progress-interval=0")
    text = (EXAMPLES / "trainingjob-byo.yaml").read_text()
    documents = [doc for doc in yaml.safe_load_all(text) if doc]
    [job] = [doc for doc in documents if doc["kind"] == contract.KIND]
    host, _, private = job["spec"]["image"].partition("/")
    assert (host, private) == ("registry.example", "myteam/trainer:1.0")
    digest = REGISTRY.push(node_images("base"), private)
    job["spec"]["image"] = REGISTRY.reference(private)
    [prepare] = job["spec"]["podTemplate"]["spec"]["initContainers"]
    assert prepare["image"] == "python:3.12-slim"
    prepare["image"] = PYTHON_IMAGE
    documents[documents.index(job)] = job_on_node(job, memory="128Mi")

    user, password = REGISTRY.credentials()
    placeholders = {
        "<namespace>": namespace,
        f"--docker-server={host}": f"--docker-server={REGISTRY.host}",
        "<user>": user,
        "<token>": password,
    }
    command = secret_command(text)
    for placeholder, value in placeholders.items():
        command = [word.replace(placeholder, value) for word in command]
    assert command[:5] == ["kubectl", "create", "secret", "docker-registry", "registry-credentials"]
    assert kubectl.run(*command[1:]).strip() == "secret/registry-credentials created"
    assert applied(kubectl, namespace, documents) == [
        "configmap/byo-training-code created",
        "persistentvolumeclaim/byo-dataset created",
        f"trainingjob.{contract.GROUP}/byo-training created",
    ]
    done = wait_for_state(kubectl, namespace, "byo-training", "Completed", timeout=240)
    status = done["status"]
    assert (status["currentEpoch"], status["totalEpochs"], status["progress"]) == (5, 5, "100%")
    assert status["metrics"]["accuracy"] > 0.9

    dataset = claim_directory(kubectl, namespace, "byo-dataset") / "points.csv"
    assert len(dataset.read_text().splitlines()) == 400  # prepared on the claim once

    seen: list[object] = []

    def succeeded() -> list[dict[str, Any]] | None:
        pods = pods_of(kubectl, namespace, "byo-training")
        phases = [(pod["metadata"]["name"], pod["status"].get("phase")) for pod in pods]
        seen[:] = [phases, [pod["metadata"].get("deletionTimestamp") for pod in pods]]
        return pods if [phase for _, phase in phases] == ["Succeeded", "Succeeded"] else None

    try:
        kept = wait("both pods Succeeded (kept by cleanPodPolicy Running)", succeeded, 60)
    except WaitTimeout as timeout:
        raise AssertionError(f"{timeout}; pods and deletions last seen: {seen}") from None
    for pod in kept:
        assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-credentials"}]
        # Pulled from the registry: the image ID is a repository digest there (containerd names an
        # image by the repository it first pulled it from; other tests push the same image elsewhere).
        (trainer,) = pod["status"]["containerStatuses"]
        assert trainer["imageID"].startswith(f"{REGISTRY.host}/"), trainer
        assert trainer["imageID"].endswith(f"@{digest}"), trainer
    prepared = kubectl.run("logs", "byo-training-worker-0", "-n", namespace, "-c", "prepare-data")
    assert prepared.startswith("dataset /data/points.csv")
    log = kubectl.run("logs", "byo-training-worker-0", "-n", namespace)
    assert log.splitlines()[0] == "rank 0/2: 200 of 400 rows from /data/points.csv"
    assert "epoch 5/5: loss=" in log
