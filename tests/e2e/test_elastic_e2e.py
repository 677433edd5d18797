"""Elastic training for real: torch under torchrun on the real node, a worker lost and replaced.

Why: an elastic job is only as good as torchrun's rendezvous and the operator's part in it together.
Here the elastic example (examples/trainingjob-elastic.yaml, made small: 3 CPU workers, 2 at least,
its checkpoints on a claim of the cluster's default class instead of NFS) runs the reference trainer
under `python -m torch.distributed.run` in the trainer image on the local cluster's real node
(testbed/node/realnode.py): the agents rendezvous over the pod network at worker 0's c10d store
behind the job's master Service, found through CoreDNS. Then:

1. 3 workers train;
2. worker 2's pod is deleted (its trainer gets the kubelet's SIGTERM, then its grace period), with
   the node cordoned so that its replacement waits for the scheduler: the other two re-rendezvous
   and train on from the latest checkpoint, with no gang restart and nothing counted as a failure;
3. the node is uncordoned: the replacement runs, its agent joins, and the world is 3 again;
4. the job completes with every epoch trained.

Then `kubectl scale` on kwok's pods: within the bounds it adds and removes workers without a restart,
outside them it is refused; on a job that is not elastic it restarts the gang with the new size.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd import contract
from testbed import Kubectl
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import events_of, get_job, pods_of, status_of, wait, wait_for_state
from tests.e2e.realnode import NODE, job_on_node

JsonDict = dict[str, Any]

NAME = "elastic"
EPOCHS = 40
# An epoch takes about 2.5 s. When the replacement may be scheduled, some 35 epochs (90 s) are left:
# about three times what its agent needs to start and join on 2 cores, so the world of 2 cannot
# finish the job before the world is whole again.
PACE = {
    "TRAIN_STEPS_PER_EPOCH": "4",
    "TRAIN_STEP_SECONDS": "0.5",
    "TRAIN_PROGRESS_INTERVAL": "0",
    "TRAIN_DIST_TIMEOUT": "120",
}
WORLD = re.compile(r"rank=(\d+) INFO train: joining the rendezvous at \S+ as rank \d+ of (\d+)")
RESUMED = re.compile(r"resuming from epoch (\d+) \(checkpoint ")


def manifest() -> JsonDict:
    """The elastic example, made small: 3 CPU workers (at least 2), a short last call, few epochs,
    checkpoints on a claim of the cluster's default class, placed on the real node."""
    job: JsonDict = yaml.safe_load((REPO / "examples" / "trainingjob-elastic.yaml").read_text())
    job["metadata"]["name"] = NAME
    spec = job["spec"]
    spec.update(numWorkers=3, gpusPerWorker=0)
    spec["elastic"] = {
        "minWorkers": 2,
        "maxWorkers": 3,
        "maxRestarts": 3,
        "rendezvous": {"lastCallTimeoutSeconds": 2, "joinTimeoutSeconds": 240},
    }
    spec["hyperparameters"]["epochs"] = EPOCHS
    spec["checkpoint"]["storage"] = {
        "type": "pvc",
        "pvc": {"create": {"size": "1Gi", "whenDeleted": "Delete"}},
    }
    spec["env"] = [{"name": key, "value": value} for key, value in PACE.items()]
    return job_on_node(job, memory="1Gi")


@pytest.fixture
def cordoning(real_node: Kubectl) -> Iterator[None]:
    """The test cordons the real node; it is uncordoned afterwards whatever happens."""
    try:
        yield
    finally:
        real_node.run("uncordon", NODE)


def changes(sizes: list[int]) -> list[int]:
    """The world sizes with repeats of the same size (a restart into the same world) folded."""
    return [size for size, _ in itertools.groupby(sizes)]


class Job:
    """The test's view of the job: its status, the world sizes its pods' processes joined."""

    def __init__(self, cluster: Kubectl, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace

    def status(self) -> JsonDict:
        return status_of(self.cluster, self.namespace, NAME)

    def epoch(self) -> int:
        return int(self.status().get("currentEpoch") or 0)

    def log(self, index: int) -> str:
        """Worker `index`'s trainer log, as `kubectl logs` reads it through the kubelet."""
        result = self.cluster.attempt("logs", f"{NAME}-worker-{index}", "-n", self.namespace, "-c=trainer")
        return result.stdout if result.returncode == 0 else ""

    def worlds(self, index: int) -> list[int]:
        """The world sizes the training processes of worker `index` joined, in order."""
        return [int(size) for _, size in WORLD.findall(self.log(index))]

    def workers_column(self) -> str:
        """The WORKERS column of `kubectl get tj`."""
        header, row = self.cluster.run("get", "tj", NAME, "-n", self.namespace).splitlines()
        return dict(zip(header.split(), row.split(), strict=True))["WORKERS"]


def checkpoint_directory(cluster: Kubectl, namespace: str) -> Path:
    """Where the job's claim keeps its files on the real node (the local-path provisioner's hostPath)."""
    claim = cluster.get_json("pvc", f"{NAME}{contract.CHECKPOINTS_SUFFIX}", "-n", namespace)
    volume = cluster.get_json("pv", claim["spec"]["volumeName"])
    return Path(volume["spec"]["hostPath"]["path"])


@pytest.mark.slow
def test_a_deleted_worker_shrinks_the_world_and_its_replacement_grows_it_back(
    real_node: Kubectl, namespace: str, start_operator: StartOperator, cordoning: None
) -> None:
    cluster = real_node
    start_operator("--progress-interval=0")
    job = Job(cluster, namespace)
    cluster.apply(manifest(), "-n", namespace)
    lost = f"{NAME}-worker-2"

    # 1. Three workers train under torchrun. (On a busy machine the rendezvous may close with the first
    # two before the third pod starts; torchrun then grows the world to 3 when it joins.)
    def trained_by_three() -> bool:
        return job.epoch() >= 1 and all(job.worlds(index)[-1:] == [3] for index in range(3))

    wait("an epoch trained by 3 workers", trained_by_three, 300)
    assert job.workers_column() == "3"

    # 2. Worker 2's pod is deleted while its replacement cannot be scheduled: the others go on.
    cluster.run("cordon", NODE)
    before = job.epoch()
    cluster.run("delete", "pod", lost, "-n", namespace, "--wait=false")
    shrunk = wait("the shrink", lambda: (status := job.status()).get("elastic") and status, 120)
    assert (shrunk["state"], shrunk["elastic"]["shrinks"]) == ("Running", 1)
    assert shrunk["elastic"]["lastShrinkReason"] == "PodDeleted"

    def trained_by_two() -> JsonDict | None:
        status = job.status()
        two = job.worlds(0)[-1:] == [2] and job.worlds(1)[-1:] == [2]
        return status if two and int(status.get("currentEpoch") or 0) > before else None

    status = wait("an epoch trained by the 2 workers left", trained_by_two, 240)
    assert status["message"].startswith(f"2/3 workers running (elastic.minWorkers 2); waiting for {lost}")
    assert job.workers_column() == "2"
    [replacement] = [p for p in pods_of(cluster, namespace, NAME) if p["metadata"]["name"] == lost]
    assert replacement["status"]["phase"] == "Pending"  # the node is cordoned
    assert (status["restartCount"], status["attempt"], status.get("restarts")) == (0, 0, None)
    # They resumed from the latest checkpoint, not from scratch.
    resumed = [int(epoch) for epoch in RESUMED.findall(job.log(0))]
    assert resumed, job.log(0)[-3000:]
    assert resumed[-1] >= before

    # 3. The replacement can be scheduled again: it joins, and the world is whole.
    cluster.run("uncordon", NODE)

    def grown() -> JsonDict | None:
        status = job.status()
        back = (status.get("elastic") or {}).get("grows") == 1 and status["workers"]["active"] == 3
        return status if back and job.worlds(2)[-1:] == [3] else None

    status = wait("the world grown back to 3", grown, 300)
    assert (status["state"], status["elastic"]["replacing"]) == ("Running", [])

    # 4. Every epoch trained, no gang restart, the loss counted where it belongs.
    done = wait_for_state(cluster, namespace, NAME, "Completed", timeout=300)["status"]
    assert (done["currentEpoch"], done["totalEpochs"], done["progress"]) == (EPOCHS, EPOCHS, "100%")
    assert done["checkpoint"]["latest"].endswith(f"epoch-{EPOCHS}")
    assert (checkpoint_directory(cluster, namespace) / f"epoch-{EPOCHS}").is_dir()
    assert (done["restartCount"], done["attempt"], done.get("restarts")) == (0, 0, None)
    assert done["elastic"] == {"shrinks": 1, "grows": 1, "replacing": [], "lastShrinkReason": "PodDeleted"}
    # The worlds since all three first trained together: 3, then 2 without the lost worker, then 3.
    assert changes(job.worlds(0))[-3:] == changes(job.worlds(1))[-3:] == [3, 2, 3]
    events = {event["reason"]: event for event in events_of(cluster, namespace, NAME)}
    assert events["WorkerLost"]["type"] == "Warning"
    assert "PodDeleted" in events["WorkerLost"]["message"]
    assert f"{lost} running again: 3 workers running" in events["WorkerRejoined"]["message"]
    assert contract.NUM_WORKERS_ANNOTATION not in (replacement["metadata"].get("annotations") or {})


# ---------------------------------------------------------------------------------------------------
# kubectl scale (kwok's pods: nothing trains, the scale subresource and the operator's answer to it)


def scale(cluster: Kubectl, namespace: str, name: str, replicas: int) -> JsonDict:
    """What `kubectl scale` and a HorizontalPodAutoscaler read: the TrainingJob's scale subresource."""
    path = f"/apis/{contract.GROUP}/{contract.VERSION}/namespaces/{namespace}/trainingjobs/{name}/scale"
    cluster.run("scale", f"tj/{name}", "-n", namespace, f"--replicas={replicas}")
    answer: JsonDict = json.loads(cluster.run("get", "--raw", path))
    return answer


def pod_uids(cluster: Kubectl, namespace: str, name: str) -> dict[str, str]:
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(cluster, namespace, name)}


def running_workers(cluster: Kubectl, namespace: str, name: str, count: int) -> JsonDict:
    def probe() -> JsonDict | None:
        status = status_of(cluster, namespace, name)
        running = status.get("state") == "Running" and (status.get("workers") or {}).get("active") == count
        return status if running and status.get("replicas") == count else None

    return wait(f"{count} workers of {name} running", probe, 120)


def test_kubectl_scale_resizes_an_elastic_job_within_its_bounds_without_a_restart(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    name = "scaled"
    job = {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": {
            "model": "cnn",
            "dataset": "mnist",
            "numWorkers": 3,
            "gpusPerWorker": 0,
            "elastic": {"minWorkers": 2, "maxWorkers": 4},
        },
    }
    cluster.apply(job, "-n", namespace)
    running_workers(cluster, namespace, name, 3)
    first = pod_uids(cluster, namespace, name)

    grown = scale(cluster, namespace, name, 4)
    assert grown["spec"]["replicas"] == 4
    assert (
        grown["status"]["selector"]
        == f"{contract.JOB_NAME_LABEL}={name},{contract.MANAGED_BY_LABEL}=trainingjob-operator"
    )
    status = running_workers(cluster, namespace, name, 4)
    assert {pod: uid for pod, uid in pod_uids(cluster, namespace, name).items() if pod in first} == first
    assert (status["restartCount"], status["attempt"], status["message"]) == (0, 0, "4/4 workers running")
    assert scale(cluster, namespace, name, 4)["status"]["replicas"] == 4

    scale(cluster, namespace, name, 2)
    status = running_workers(cluster, namespace, name, 2)
    kept = (f"{name}-worker-0", f"{name}-worker-1")

    def only_the_kept_pods() -> dict[str, str] | None:
        uids = pod_uids(cluster, namespace, name)  # the removed pods may take a moment to terminate
        return uids if set(uids) == set(kept) else None

    left = wait(f"{name}-worker-2 and -3 gone", only_the_kept_pods, 120)
    assert left == {pod: first[pod] for pod in kept}
    assert (status["restartCount"], status["attempt"]) == (0, 0)

    # A HorizontalPodAutoscaler targets it as docs/elastic.md shows (the dev cluster runs no metrics
    # server: what it would read and write is the scale subresource above).
    cluster.run("autoscale", f"tj/{name}", "-n", namespace, "--min=2", "--max=4", "--cpu=80%")
    hpa = cluster.get_json("hpa", name, "-n", namespace)
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "name": name,
    }

    # Outside the bounds: refused, naming the field and the bounds (never clamped).
    refused = cluster.attempt("scale", f"tj/{name}", "-n", namespace, "--replicas=5")
    assert refused.returncode != 0
    assert "spec.numWorkers" in refused.stderr
    assert "numWorkers must be within [elastic.minWorkers, elastic.maxWorkers]" in refused.stderr
    assert get_job(cluster, namespace, name)["spec"]["numWorkers"] == 2


def test_kubectl_scale_of_a_job_that_is_not_elastic_restarts_its_gang(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    name = "fixed"
    cluster.apply(
        {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND,
            "metadata": {"name": name},
            "spec": {"model": "cnn", "dataset": "mnist", "numWorkers": 2, "gpusPerWorker": 0},
        },
        "-n",
        namespace,
    )
    running_workers(cluster, namespace, name, 2)
    scale(cluster, namespace, name, 3)
    status = running_workers(cluster, namespace, name, 3)
    assert (status["restartCount"], status["lastRestartReason"], status["attempt"]) == (1, "Resized", 1)
