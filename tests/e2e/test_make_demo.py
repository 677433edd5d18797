"""`make demo`, end to end, on a throwaway cluster of its own with its own real node, and what a new
user types next.

Why: the README's first command must work as written: the machine check, the cluster with its real
node, the operator, the simple example trained in containers to Completed, a second run reusing it
all, and `make demo-down` stopping every process and undoing the node's changes to the machine. And
so must what a newcomer runs after it, as written: every command the demo prints to look around (the
kubectl plugin among them, on PATH after the `eval` line), and README's platform-team install, `make
deploy`, which on the local cluster puts the operator on the real node, where its pods run for real
and a third `make demo` is reconciled by it.

There is one real node per machine (its network namespace and fixed paths), so the session's is taken
off for this test and put back afterwards.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import REAL_NODE, Kubectl, free_port, is_ready, listening_addresses, pid_running, wait_for
from tests.cluster import REPO, dev_cluster

pytestmark = pytest.mark.slow


@pytest.fixture
def no_session_node(real_node: Kubectl) -> Iterator[None]:
    """The session's real node taken off for the test (one per machine), put back afterwards."""
    dev_cluster("remove", "real-node")
    try:
        yield
    finally:
        dev_cluster("up", "--with", "real-node")


def make(target: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), target],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def printed_commands(output: str) -> list[str]:
    """The commands the demo prints to look around, as a user copies them (a label's value too)."""
    shown = output.split("Look around", 1)[1].split("Run it again", 1)[0]
    commands = []
    for line in shown.splitlines()[1:]:
        text = line.strip()
        label = re.match(r"[a-z ]+:\s{2,}(.*)", text)
        if label:
            text = label.group(1)
        if text and not text.startswith((".", "/")) and not text.endswith(".log"):
            commands.append(text)
    return commands


def readme_command(heading: str, command: str) -> str:
    """`command` as README's section `heading` writes it in a code block (so the test runs it as
    written, and fails when README stops saying it)."""
    section = (REPO / "README.md").read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [
        line.split("#", 1)[0].strip()
        for line in re.findall(r"```\n(.*?)```", section, re.DOTALL)[0].splitlines()
    ]
    assert command in lines, f"README's {heading!r} no longer shows {command!r}: {lines}"
    return command


def in_shell(eval_line: str, command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`command` in bash, in the repository, after the demo's `eval` line, as a user's terminal runs it."""
    script = f"set -o pipefail\n{eval_line}\n{command}"
    return subprocess.run(
        ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_make_demo_runs_end_to_end_and_again_and_stops(tmp_path: Path, no_session_node: None) -> None:
    dev = tmp_path / "dev"
    namespace = f"demo-{uuid.uuid4().hex[:6]}"
    env = dict(
        os.environ,
        TJ_DEV_DIR=str(dev),
        TJ_DEV_NODES="2",
        DEMO_NAMESPACE=namespace,
        DEMO_METRICS_PORT=str(free_port()),
        DEMO_HEALTH_PORT=str(free_port()),
        DEMO_STEP_SECONDS="0.02",
        DEMO_TIMEOUT="300",
    )
    env.pop("KUBECONFIG", None)
    state_path = dev / "run" / "state.json"
    machine = REAL_NODE.machine_snapshot()
    pids: list[int] = []
    try:
        # Warm caches: the cluster, its node and the images start in seconds.
        first = make("demo", env, timeout=900)
        output = first.stdout + first.stderr
        assert first.returncode == 0, output
        assert "preflight: ok" in output
        assert "root and cgroup v1 for the real node" in output
        assert f"{namespace}/mnist-training  Completed" in output
        assert "make demo-down" in output
        assert re.search(r"epoch 10/10 +progress 100%", output), output
        state = json.loads(state_path.read_text())
        extras = state["extras"]
        assert set(extras) == {"operator"}
        assert "real-node" in state["optional"]
        pids = [p["pid"] for p in [*state["processes"].values(), *extras.values()]]
        assert all(pid_running(pid) for pid in pids)
        assert listening_addresses(extras["operator"]["pid"]) == {
            ("127.0.0.1", int(env["DEMO_METRICS_PORT"])),
            ("127.0.0.1", int(env["DEMO_HEALTH_PORT"])),
        }
        kubectl = Kubectl(dev / "bin" / "kubectl", dev / "kubeconfig")
        pods = kubectl.items("pods", "-n", namespace)
        assert {pod["spec"]["nodeName"] for pod in pods} == {"real-node"}
        # The `kubectl logs` command it prints works: the node's kubelet serves the trainer's output.
        [(pod, shown_namespace)] = re.findall(r"kubectl logs (\S+) -n (\S+)", output)
        assert shown_namespace == namespace
        assert "training finished: 10 epochs" in kubectl.run("logs", pod, "-n", namespace)

        # Again: everything is reused, the job is created anew and trains again.
        second = make("demo", env, timeout=600)
        output = second.stdout + second.stderr
        assert second.returncode == 0, output
        assert "already running (API server" in output
        assert "real-node is already running" in output
        assert "operator already runs" in output
        assert "is there from an earlier run: deleting it" in output
        assert f"{namespace}/mnist-training  Completed" in output
        assert json.loads(state_path.read_text())["extras"] == extras

        # What a newcomer runs next, as written: each command the demo printed, in a shell where the
        # printed `eval` line ran (the plugin is on PATH), from the repository.
        user_env = {key: value for key, value in env.items() if key != "TJ_DEV_DIR"}
        commands = printed_commands(output)
        [eval_line] = [command for command in commands if command.startswith("eval ")]
        assert 'eval "$(hack/dev-cluster.sh env)"' in (REPO / "README.md").read_text()
        assert any(command.startswith("kubectl trainingjob describe") for command in commands), commands
        assert any(command.startswith("curl ") for command in commands), commands
        deploy = readme_command("Install into a cluster", "make deploy")
        printed_deploy = [command for command in commands if command.startswith("make deploy")]
        assert [command.split("#", 1)[0].strip() for command in printed_deploy] == [deploy]
        for command in commands:
            if command != eval_line and command not in printed_deploy:
                ran = in_shell(eval_line, command, user_env)
                assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
                assert ran.stdout.strip(), (command, ran.stderr)
        described = in_shell(
            eval_line, f"kubectl trainingjob describe mnist-training -n {namespace}", user_env
        )
        assert "real-node" in described.stdout, described.stdout + described.stderr

        # README's platform-team line on this cluster: the operator on the real node, from the image
        # this tree builds, Ready for real; the demo's own operator stopped, and the job of a third
        # `make demo` reconciled by the deployed one.
        ran = in_shell(eval_line, deploy, user_env)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert "deploy: the local cluster: the operator goes on its real node real-node" in ran.stdout
        assert "stopped the demo's operator" in ran.stdout
        assert "operator" not in json.loads(state_path.read_text())["extras"]

        def operator_ready() -> list[dict[str, object]] | None:
            pods = kubectl.items("pods", "-n", "trainingjob-system")
            return pods if len(pods) == 2 and all(is_ready(pod) for pod in pods) else None

        deployed = wait_for("the deployed operator's pods Ready", operator_ready, timeout=300)
        assert {pod["spec"]["nodeName"] for pod in deployed} == {"real-node"}  # type: ignore[index]
        third = make("demo", env, timeout=600)
        output = third.stdout + third.stderr
        assert third.returncode == 0, output
        assert "the operator installed by `make deploy` runs the job" in output
        assert f"{namespace}/mnist-training  Completed" in output
        undeploy = in_shell(eval_line, "make undeploy", user_env)
        assert undeploy.returncode == 0, undeploy.stdout + undeploy.stderr
    finally:
        down = make("demo-down", env, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "taking down the real node" in down.stderr
    assert not state_path.exists()
    assert not any(pid_running(pid) for pid in pids)
    assert REAL_NODE.machine_snapshot() == machine
