"""Every example in examples/ applies cleanly and runs on the local cluster, as a user would run it.

The examples are applied unchanged with `kubectl apply -n <namespace> -f examples/<file>` and must
reach Running with one Running pod per worker. The advanced example asks for what the dev cluster
does not have: a PriorityClass `high-priority` and eight nodes labelled node-type=gpu-large (its
nodeSelector) with four free GPUs each, one worker per node (its hostname anti-affinity). The test
adds both and removes them afterwards; the extra nodes carry the nvidia.com/gpu NoSchedule taint the
example tolerates, so no other test's pod lands on them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd import contract
from tests.cluster import REPO, Kubectl
from tests.e2e.jobs import (
    PatientKubectl,
    assert_healthy,
    extra_nodes,
    get_job,
    pods_of,
    priority_class,
    wait,
    wait_for_state,
)
from tests.e2e.operator import OperatorProcess

EXAMPLES = REPO / "examples"
SIMPLE_EXAMPLES = [
    "trainingjob-simple.yaml",
    "trainingjob-distributed.yaml",
    "trainingjob-resume.yaml",
    # Elastic: Running once minWorkers run; run_example waits for every worker. It trains for real in
    # tests/e2e/test_elastic_e2e.py.
    "trainingjob-elastic.yaml",
]
# Run in a namespace enforcing the "restricted" Pod Security Standard by tests/e2e/test_pod_security.py.
RESTRICTED_EXAMPLE = "trainingjob-restricted.yaml"


@pytest.fixture
def kubectl(cluster: Kubectl) -> Kubectl:
    """The project's kubectl, riding out the restarts of the shared API server other tests make."""
    return PatientKubectl.of(cluster)


def load(path: Path) -> dict[str, Any]:
    manifest = yaml.safe_load(path.read_text())
    assert isinstance(manifest, dict)
    return manifest


def test_every_example_is_covered() -> None:
    assert sorted(path.name for path in EXAMPLES.glob("*.yaml")) == sorted(
        [*SIMPLE_EXAMPLES, "trainingjob-advanced.yaml", RESTRICTED_EXAMPLE]
    )


def run_example(kubectl: Kubectl, namespace: str, operator: OperatorProcess, path: Path) -> None:
    manifest = load(path)
    name = manifest["metadata"]["name"]
    assert "namespace" not in manifest["metadata"]

    result = kubectl.attempt("apply", "-n", namespace, "-f", str(path))

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # no warnings either
    assert result.stdout.strip() == f"trainingjob.{contract.GROUP}/{name} created"
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
    with priority_class(kubectl, "high-priority"):
        run_example(kubectl, namespace, operator, EXAMPLES / "trainingjob-advanced.yaml")
        pods = pods_of(kubectl, namespace, "advanced-training")
        # One worker per node (hostname anti-affinity), all on the gpu-large nodes.
        assert sorted(pod["spec"]["nodeName"] for pod in pods) == sorted(gpu_large_nodes)
        assert {pod["spec"]["priorityClassName"] for pod in pods} == {"high-priority"}
        assert {pod["spec"]["priority"] for pod in pods} == {
            int(kubectl.get_json("priorityclass", "high-priority")["value"])
        }
        # The job and its pods go before the PriorityClass and the nodes do.
        kubectl.run("delete", "trainingjob", "advanced-training", "-n", namespace)
        wait("the advanced example's pods gone", lambda: not pods_of(kubectl, namespace, "advanced-training"))
