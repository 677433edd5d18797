"""Every YAML block in README.md and docs/ is a manifest the real API server accepts.

Documentation that shows a manifest promises that it works: each ```yaml block of README.md and
docs/*.md is applied, unchanged, with `kubectl apply` to the dev cluster and must be created (the
blocks are whole manifests, so a reader can apply them as they are). Most are TrainingJobs; the
blocks of docs/shared-clusters.md that set up Kueue (ResourceFlavor, ClusterQueue, LocalQueue,
WorkloadPriorityClasses) are applied on the session's cluster with Kueue running, and that page is
also followed from start to end with the operator running, to show its story happens as written.
A block that shows an example is the example word for word, comments included: the
restricted-namespace block of docs/pod-template.md is examples/trainingjob-restricted.yaml
(tests/e2e/test_pod_security.py runs it in a namespace enforcing "restricted"), the resume block of
docs/progress.md examples/trainingjob-resume.yaml (tests/e2e/test_examples.py trains it from an
earlier job's claim), the block of docs/elastic.md examples/trainingjob-elastic.yaml
(tests/e2e/test_elastic_e2e.py trains it for real).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from crd import contract
from testbed import Kubectl
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import PatientKubectl
from tests.e2e.kueue_support import admitted_reason
from tests.e2e.lifecycle_support import retried, wait_state, wait_status

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHARED_CLUSTERS = REPO / "docs" / "shared-clusters.md"


def yaml_blocks(markdown: str) -> list[str]:
    """The text of every ```yaml fenced block, in order."""
    blocks: list[str] = []
    current: list[str] | None = None
    for line in markdown.splitlines():
        if current is None and line.strip() == "```yaml":
            current = []
        elif current is not None and line.strip() == "```":
            blocks.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def manifests(text: str) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(text) if document]


def is_trainingjob(manifest: dict[str, Any]) -> bool:
    return (manifest["apiVersion"], manifest["kind"]) == (contract.API_VERSION, contract.KIND)


def blocks(*, trainingjobs: bool) -> list[Any]:
    """The blocks of every document that hold only TrainingJobs (or, `trainingjobs` False, the others)."""
    return [
        pytest.param(text, id=f"{path.relative_to(REPO)}#{index}")
        for path in DOCUMENTS
        for index, text in enumerate(yaml_blocks(path.read_text(encoding="utf-8")))
        if all(is_trainingjob(manifest) for manifest in manifests(text)) == trainingjobs
    ]


def is_kueues(text: str) -> bool:
    return all(manifest["apiVersion"] == contract.KUEUE_API_VERSION for manifest in manifests(text))


BLOCKS = blocks(trainingjobs=True)
KUEUE_BLOCKS = [block for block in blocks(trainingjobs=False) if is_kueues(block.values[0])]
# Blocks of other objects (RBAC) are applied by the test of what their section says.
OTHER_BLOCKS = [block for block in blocks(trainingjobs=False) if not is_kueues(block.values[0])]


def created_lines(text: str) -> list[str]:
    """What `kubectl apply` prints for the block's objects when it creates them."""
    lines = []
    for manifest in manifests(text):
        group = manifest["apiVersion"].rpartition("/")[0]
        kind = manifest["kind"].lower() + (f".{group}" if group else "")
        lines.append(f"{kind}/{manifest['metadata']['name']} created")
    return lines


@contextlib.contextmanager
def applied(kubectl: Kubectl, namespace: str, text: str) -> Iterator[str]:
    """`kubectl apply -n namespace` of the block; yields kubectl's output. Its objects are deleted
    afterwards (the cluster-scoped ones would outlive the namespace)."""
    try:
        result = PatientKubectl.of(kubectl).attempt("apply", "-n", namespace, "-f", "-", stdin=text)
        assert result.returncode == 0, result.stderr
        yield result.stdout
    finally:
        retried(
            "the block's objects deleted",
            functools.partial(
                kubectl.run,
                "delete",
                "-n",
                namespace,
                "-f",
                "-",
                "--ignore-not-found",
                "--wait=false",
                stdin=text,
            ),
        )


def test_every_other_block_is_applied_by_the_test_of_its_section() -> None:
    from tests.e2e.test_network_policy_real_node import policy_blocks  # noqa: PLC0415 - it imports this module
    from tests.e2e.test_pipelines_e2e import docs_blocks as pipeline_blocks  # noqa: PLC0415 - it imports this module
    from tests.e2e.test_tenant_escalation import docs_blocks  # noqa: PLC0415 - it imports this module
    from tests.e2e.test_volcano_e2e import docs_blocks as volcano_blocks  # noqa: PLC0415 - it imports this module

    claimed = set(docs_blocks())  # docs/security.md, what a tenant can do through a TrainingJob
    claimed |= set(policy_blocks())  # docs/security.md, network policy
    claimed |= set(volcano_blocks())  # docs/shared-clusters.md, Volcano's Queue
    claimed |= set(pipeline_blocks())  # docs/pipelines.md, the training step's Role
    assert claimed
    assert {block.values[0] for block in OTHER_BLOCKS} <= claimed


def test_the_documents_have_yaml_blocks() -> None:
    assert len(BLOCKS) >= 3
    # docs/shared-clusters.md: flavor, ClusterQueue, LocalQueue, priorities, racks (Topology to LocalQueue),
    # MultiKueue's manager and worker set-ups
    assert len(KUEUE_BLOCKS) == 7
    assert yaml_blocks("text\n```yaml\na: 1\n```\n```\nnot: yaml\n```\n") == ["a: 1\n"]


@pytest.mark.parametrize(
    ("example", "document"),
    [
        ("trainingjob-restricted.yaml", "pod-template.md"),
        ("trainingjob-resume.yaml", "progress.md"),
        ("trainingjob-elastic.yaml", "elastic.md"),
    ],
)
def test_a_block_that_shows_an_example_is_the_example(example: str, document: str) -> None:
    text = (REPO / "examples" / example).read_text(encoding="utf-8")
    assert text in yaml_blocks((REPO / "docs" / document).read_text(encoding="utf-8"))


@pytest.mark.parametrize("text", BLOCKS)
def test_yaml_block_is_accepted(cluster: Kubectl, namespace: str, text: str) -> None:
    (manifest,) = manifests(text)
    result = PatientKubectl.of(cluster).attempt("apply", "-n", namespace, "-f", "-", stdin=text)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"trainingjob.{contract.GROUP}/{manifest['metadata']['name']} created"


@pytest.mark.parametrize("text", KUEUE_BLOCKS)
def test_kueue_yaml_block_is_accepted(kueue: Kubectl, namespace: str, text: str) -> None:
    assert all(manifest["apiVersion"] == contract.KUEUE_API_VERSION for manifest in manifests(text))
    with applied(kueue, namespace, text) as output:
        assert output.strip().splitlines() == created_lines(text)


def test_the_shared_clusters_page_happens_as_written(
    kueue: Kubectl, coscheduling: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    """The page's blocks applied in order, with the operator running: the sweep runs on the flavor's
    nodes, the high-priority job preempts it, and the sweep waits, saying so. The Volcano and MultiKueue
    sections' blocks are tests/e2e/test_volcano_e2e.py's and tests/e2e/test_multikueue_e2e.py's."""
    from tests.e2e.test_multikueue_e2e import section_blocks  # noqa: PLC0415 - it imports this module
    from tests.e2e.test_volcano_e2e import is_volcanos  # noqa: PLC0415 - it imports this module

    kubectl = kueue
    multikueue = set(section_blocks())
    texts = [
        text
        for text in yaml_blocks(SHARED_CLUSTERS.read_text(encoding="utf-8"))
        if not is_volcanos(text) and text not in multikueue
    ]
    start_operator()
    with contextlib.ExitStack() as stack:
        for text in texts:
            stack.enter_context(applied(kubectl, namespace, text))
            names = [manifest["metadata"]["name"] for manifest in manifests(text) if is_trainingjob(manifest)]
            if names == ["resnet-sweep"]:
                wait_state(kubectl, namespace, "resnet-sweep", "Running")
        wait_state(kubectl, namespace, "bert-finetune", "Running")
        sweep = wait_status(
            kubectl,
            namespace,
            "resnet-sweep",
            "Queued (Preempted)",
            lambda s: s.get("state") == "Queued" and admitted_reason(s) == "Preempted",
        )
        pods = kubectl.items("pods", "-n", namespace, "-l", f"{contract.JOB_NAME_LABEL}=bert-finetune")

    assert sweep["message"].startswith(
        "waiting in LocalQueue team-a: evicted by Kueue: Preempted to accommodate"
    )
    assert (sweep["restartCount"], sweep["queue"]["evictions"]) == (0, 1)
    assert [pod["spec"]["nodeSelector"] for pod in pods] == [{"nvidia.com/gpu.product": "A100-SXM4-80GB"}] * 2
