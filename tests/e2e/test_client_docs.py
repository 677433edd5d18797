"""docs/client.md, run as a notebook would run it: every example, in order, in one session.

Why: the page is the client's tutorial, so each example has to work as written. The Python blocks
share one namespace of variables, like the cells of a notebook, against the local cluster with the
real operator and the local kubelet running the reference trainer (so `wait(progress=True)` sees a
real run to Completed). The shell blocks run `kubectl trainingjob ...` through the built kubectl,
with the plugin on PATH. Blocks marked `<!-- test: fake-api -->` read logs, which the local
cluster's fake nodes do not serve: they run against the scripted API server instead.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import tests.e2e.test_demo as demo_tests
from tests.cluster import DEV, REPO, Kubectl
from tests.e2e.conftest import StartOperator
from tests.unit.clientfakes import job, kubeconfig_for, pod
from tests.unit.fakeapi import FakeApi, Reply, Stream, running

DOC = REPO / "docs" / "client.md"
FAKE_NAMESPACE = "ns"
local_kubelet = demo_tests.local_kubelet


@dataclass(frozen=True)
class Block:
    language: str
    code: str
    fake_api: bool
    line: int


def blocks(text: str) -> list[Block]:
    found = []
    pattern = re.compile(r"(<!-- test: fake-api -->\n)?```(\w+)\n(.*?)```", re.DOTALL)
    for match in pattern.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(match.group(2), match.group(3), match.group(1) is not None, line))
    return found


def test_the_page_has_the_examples_this_test_expects() -> None:
    found = blocks(DOC.read_text())
    assert [b.language for b in found] == ["python"] * 10 + ["sh", "sh"]
    assert [b.line for b in found if b.fake_api] == [
        b.line for b in found if "logs(" in b.code or " logs " in b.code
    ]


def kubeconfig_in(namespace: str, path: Path) -> Path:
    """The admin kubeconfig with its context's namespace set to the test's (as a user would have it)."""
    config = yaml.safe_load((DEV / "kubeconfig").read_text())
    for context in config["contexts"]:
        context["context"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def logs_api() -> Iterator[FakeApi]:
    """A scripted API server with job mnist-notebook (2 ranks) and logs for both."""
    with running() as api:
        jobs = f"/apis/ml.example.com/v1/namespaces/{FAKE_NAMESPACE}/trainingjobs"
        pods = f"/api/v1/namespaces/{FAKE_NAMESPACE}/pods"
        api.default("GET", f"{jobs}/mnist-notebook", Reply(200, job("mnist-notebook", state="Running")))
        for rank in (0, 1):
            name = f"mnist-notebook-worker-{rank}"
            api.default("GET", f"{pods}/{name}", Reply(200, pod(name, rank)))
        api.default("GET", f"{pods}/mnist-notebook-worker-0/log", Reply(200, b"rank 0: epoch 3/3 done\n"))
        api.default(
            "GET",
            f"{pods}/mnist-notebook-worker-1/log",
            Stream((b"rank 1: epoch 1/3\n", b"rank 1: epoch 2/3\n")),
        )
        yield api


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
    namespace: str,
    start_operator: StartOperator,
    local_kubelet: Callable[[], demo_tests.LocalKubelet],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """The operator and the local kubelet for the namespace, $KUBECONFIG with it as the context's
    namespace, and the repository as the working directory (the examples name examples/...)."""
    start_operator("--progress-interval=0")
    local_kubelet()
    kubeconfig = kubeconfig_in(namespace, tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.chdir(REPO)
    return kubeconfig


@pytest.mark.slow
def test_every_example_of_the_client_page_runs(
    namespace: str, notebook_kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = notebook_kubeconfig
    path = f"{Path(sys.executable).parent}:{DEV / 'bin'}:{os.environ['PATH']}"
    shell_env = dict(os.environ, PATH=path, KUBECONFIG=str(kubeconfig), NAMESPACE=namespace)
    notebook: dict[str, object] = {}
    printed: list[str] = []
    with logs_api() as api:
        fake_kubeconfig = kubeconfig_for(api, tmp_path / "fake-kubeconfig", namespace=FAKE_NAMESPACE)
        for block in blocks(DOC.read_text()):
            if block.language == "python" and block.fake_api:
                from trainingjob_client import TrainingJobClient  # noqa: PLC0415 - as the notebook imported it

                fake = {**notebook, "client": TrainingJobClient(kubeconfig=fake_kubeconfig)}
                printed.append(run_python(block, fake))
            elif block.language == "python":
                printed.append(run_python(block, notebook))
            elif block.fake_api:
                printed.append(
                    run_shell(
                        block, dict(shell_env, KUBECONFIG=str(fake_kubeconfig), NAMESPACE=FAKE_NAMESPACE)
                    )
                )
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
    assert re.search(r"^0 mnist-notebook-worker-0 gpu-node-\d \w+", output, re.MULTILINE)  # ranks
    assert "rank 0: epoch 3/3 done\n\nrank 1: epoch 1/3\nrank 1: epoch 2/3\n" in output  # logs
    assert f'TrainingJob "no-such-job" not found in namespace "{namespace}"' in output
    assert f"TrainingJob {namespace}/mnist-notebook Completed" in output  # kubectl trainingjob watch
    assert "RANK   POD" in output  # kubectl trainingjob describe
    assert "trainingjob.ml.example.com/mnist-training resumed" in output
    assert output.endswith("rank 1: epoch 1/3\nrank 1: epoch 2/3\n")  # kubectl trainingjob logs -f
    assert Kubectl.from_dev_cluster().get_or_none("trainingjob", "from-yaml", "-n", namespace) is None
