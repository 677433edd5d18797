"""Every YAML block in README.md and docs/ is a TrainingJob the real API server accepts.

Documentation that shows a manifest promises that it works: each ```yaml block of README.md and
docs/*.md is applied, unchanged, with `kubectl apply` to the dev cluster and must be created (the
blocks are whole manifests, so a reader can apply them as they are). The restricted-namespace block
of docs/pod-template.md is examples/trainingjob-restricted.yaml word for word, which
tests/e2e/test_pod_security.py runs in a namespace enforcing "restricted"; the block of docs/elastic.md
is examples/trainingjob-elastic.yaml, which tests/e2e/test_elastic_e2e.py trains for real.
"""

from __future__ import annotations

import pytest
import yaml

from crd import contract
from tests.cluster import REPO, Kubectl
from tests.e2e.jobs import PatientKubectl

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


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


BLOCKS = [
    pytest.param(text, id=f"{path.relative_to(REPO)}#{index}")
    for path in DOCUMENTS
    for index, text in enumerate(yaml_blocks(path.read_text(encoding="utf-8")))
]


def test_the_documents_have_yaml_blocks() -> None:
    assert len(BLOCKS) >= 3
    assert yaml_blocks("text\n```yaml\na: 1\n```\n```\nnot: yaml\n```\n") == ["a: 1\n"]


def test_the_restricted_block_is_the_example() -> None:
    example = (REPO / "examples" / "trainingjob-restricted.yaml").read_text(encoding="utf-8")
    manifest = yaml.safe_load(example)
    blocks = [yaml.safe_load(text) for text in yaml_blocks((REPO / "docs" / "pod-template.md").read_text())]
    assert manifest in blocks


def test_the_elastic_block_is_the_example() -> None:
    example = (REPO / "examples" / "trainingjob-elastic.yaml").read_text(encoding="utf-8")
    blocks = yaml_blocks((REPO / "docs" / "elastic.md").read_text(encoding="utf-8"))
    assert example in blocks  # word for word, comments included


@pytest.mark.parametrize("text", BLOCKS)
def test_yaml_block_is_accepted(cluster: Kubectl, namespace: str, text: str) -> None:
    manifest = yaml.safe_load(text)
    assert (manifest["apiVersion"], manifest["kind"]) == (contract.API_VERSION, contract.KIND)
    result = PatientKubectl.of(cluster).attempt("apply", "-n", namespace, "-f", "-", stdin=text)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"trainingjob.{contract.GROUP}/{manifest['metadata']['name']} created"
