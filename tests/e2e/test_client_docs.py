"""docs/client.md, run as a notebook would run it: every example, in order, in one session.

Why: the page is the client's tutorial, so each example has to work as written. The Python blocks
share one namespace of variables, like the cells of a notebook, against the local cluster with the
real operator. The job the page trains, mnist-notebook, runs on the local cluster's real node
(testbed/node/realnode.py): the reference trainer with real torch in containers, so
`wait(progress=True)` sees a real run to Completed and `logs()` reads the trainer's real output
through the API server from the node's kubelet. The page's code does not place it there (nor should
it): a mutating webhook of the test's (tests/e2e/node_webhook.py) adds the node's toleration and
selector to that job's pods, as a platform's admission sends a team's pods to its node pool. The
shell blocks run `kubectl trainingjob ...` through the built kubectl, with the plugin on PATH.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from testbed import Kubectl
from tests.cluster import DEV, REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.node_webhook import job_pods_on_node
from tests.e2e.realnode import NODE

DOC = REPO / "docs" / "client.md"
TRAINED_JOB = "mnist-notebook"  # the page's job that trains


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    line: int


def blocks(text: str) -> list[Block]:
    found = []
    for match in re.finditer(r"```(\w+)\n(.*?)```", text, re.DOTALL):
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(match.group(1), match.group(2), line))
    return found


def test_the_page_has_the_examples_this_test_expects() -> None:
    assert [b.language for b in blocks(DOC.read_text())] == ["python"] * 10 + ["sh", "sh"]


def kubeconfig_in(namespace: str, path: Path) -> Path:
    """The admin kubeconfig with its context's namespace set to the test's (as a user would have it)."""
    config = yaml.safe_load((DEV / "kubeconfig").read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(config))
    return path


def run_python(block: Block, variables: dict[str, object]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, f"{DOC}:{block.line}", "exec"), variables)  # noqa: S102 - the docs' examples
    return out.getvalue()


def run_shell(block: Block, env: dict[str, str]) -> str:
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"{DOC}:{block.line}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture
def notebook_kubeconfig(
    real_node: Kubectl,
    namespace: str,
    start_operator: StartOperator,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Path]:
    """The operator for the namespace, the trained job's pods sent to the real node, $KUBECONFIG
    with the namespace as its context's, and the repository as the working directory (the examples
    name examples/...)."""
    start_operator("--progress-interval=0")
    kubeconfig = kubeconfig_in(namespace, tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.chdir(REPO)
    with job_pods_on_node(real_node, namespace, TRAINED_JOB, tmp_path / "webhook"):
        yield kubeconfig


@pytest.mark.slow
def test_every_example_of_the_client_page_runs(
    namespace: str, notebook_kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = notebook_kubeconfig
    path = f"{Path(sys.executable).parent}:{DEV / 'bin'}:{os.environ['PATH']}"
    shell_env = dict(os.environ, PATH=path, KUBECONFIG=str(kubeconfig), NAMESPACE=namespace)
    notebook: dict[str, object] = {}
    printed: list[str] = []
    for block in blocks(DOC.read_text()):
        if block.language == "python":
            printed.append(run_python(block, notebook))
        else:
            printed.append(run_shell(block, shell_env))
    drawn = capsys.readouterr().err
    output = "".join(printed)

    assert printed[0] == f"{namespace}\n"
    assert "Completed 3 3 {" in output  # wait(progress=True) saw the real run end
    assert "mnist-notebook Completed 100%" in drawn  # and drew its bar
    assert re.search(r"Condition\(type='Succeeded', status='True'", output)
    assert "Completed     epoch 3/3  progress 100%" in output  # watch: the finished job, once
    assert "Normal Running Running: 2/2 workers running" in output  # events
    assert re.search(rf"^0 mnist-notebook-worker-0 {NODE} \w+", output, re.MULTILINE)  # ranks
    # logs: rank 0's tail, then rank 1 followed to the end of its container, the trainers' real output
    logs = output[output.index("rank=0 INFO") :]
    assert re.search(r"rank=0 INFO train: training finished: 3 epochs.*\n\n.*rank=1 INFO", logs, re.DOTALL)
    assert re.search(r"rank=1 INFO train: epoch 3/3: loss", logs)
    assert f'TrainingJob "no-such-job" not found in namespace "{namespace}"' in output
    assert f"TrainingJob {namespace}/mnist-notebook Completed" in output  # kubectl trainingjob watch
    assert "RANK   POD" in output  # kubectl trainingjob describe
    assert "trainingjob.ml.example.com/mnist-training resumed" in output
    # kubectl trainingjob logs -f: rank 1's log to its last line
    assert re.search(r"rank=1 INFO train: training finished: 3 epochs.*\n$", output)
    assert Kubectl.from_dev_cluster().get_or_none("trainingjob", "from-yaml", "-n", namespace) is None
