"""`kubectl trainingjob ...` through the real kubectl plugin mechanism, against the local cluster.

The built kubectl finds the console script `kubectl-trainingjob` on PATH and runs it with the
arguments after the plugin's name and its own environment ($KUBECONFIG); nothing here calls the
plugin directly. The operator runs for the test's namespace; pods end the way tests/cluster.py ends
them, except in the logs test, whose job runs on the local cluster's real node
(testbed/node/realnode.py): the reference trainer with real torch in a container, its output read
through the API server from the node's kubelet.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import yaml

from testbed import Kubectl, end_pod, terminated
from tests.cluster import DEV
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import job_manifest, kubeconfig_to_nowhere, pods_of, wait, wait_for_state
from tests.e2e.operator import OperatorProcess
from tests.e2e.realnode import training_job, wait_running

KUBECTL = DEV / "bin" / "kubectl"
PLUGIN_DIR = Path(sys.executable).parent


def plugin_env(kubeconfig: Path | None = None) -> dict[str, str]:
    """PATH with the plugin and the built kubectl; $KUBECONFIG as a user's shell would have it."""
    assert (PLUGIN_DIR / "kubectl-trainingjob").is_file(), "pip install -e . installs the console script"
    return dict(
        os.environ,
        PATH=f"{PLUGIN_DIR}:{KUBECTL.parent}:/usr/bin:/bin",
        KUBECONFIG=str(kubeconfig or DEV / "kubeconfig"),
    )


def kubectl_trainingjob(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBECTL), "trainingjob", *args],
        capture_output=True,
        text=True,
        env=env or plugin_env(),
        timeout=180,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr.strip()


def completed_job(kubectl: Kubectl, namespace: str, name: str, **spec: object) -> None:
    kubectl.apply(job_manifest(name, **spec), "-n", namespace)
    wait_for_state(kubectl, namespace, name, "Running")
    for worker in pods_of(kubectl, namespace, name):
        end_pod(kubectl, namespace, worker["metadata"]["name"])
    wait_for_state(kubectl, namespace, name, "Completed")


def test_kubectl_lists_the_plugin(kubectl: Kubectl) -> None:
    # `kubectl` (the session's cluster) is what puts the built kubectl into the dev directory.
    listed = subprocess.run(
        [str(KUBECTL), "plugin", "list"],
        capture_output=True,
        text=True,
        env=plugin_env(),
        timeout=60,
        check=False,
    )
    assert str(PLUGIN_DIR / "kubectl-trainingjob") in listed.stdout, listed.stdout + listed.stderr


def test_describe_suspend_resume_and_watch_to_completed(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    kubectl.apply(job_manifest("tj"), "-n", namespace)
    wait_for_state(kubectl, namespace, "tj", "Running")
    described = kubectl_trainingjob("describe", "tj", "-n", namespace)
    assert described.returncode == 0, described.stderr
    assert "State:       Running" in described.stdout
    assert "Running:     all workers" in described.stdout
    for rank in (0, 1):
        assert f"  {rank}      tj-worker-{rank}   gpu-node-" in described.stdout

    suspended = kubectl_trainingjob("suspend", "tj", "-n", namespace)
    assert (suspended.returncode, suspended.stdout) == (0, "trainingjob.ml.example.com/tj suspended\n")
    wait_for_state(kubectl, namespace, "tj", "Suspended")
    described = kubectl_trainingjob("-n", namespace, "describe", "tj")
    assert "Not running: Suspended: Suspended: spec.suspend is true" in described.stdout
    assert "  0      (no pod)" in described.stdout
    resumed = kubectl_trainingjob("resume", "tj", "-n", namespace)
    assert (resumed.returncode, resumed.stdout) == (0, "trainingjob.ml.example.com/tj resumed\n")
    wait_for_state(kubectl, namespace, "tj", "Running", timeout=90)

    watch = subprocess.Popen(
        [str(KUBECTL), "trainingjob", "watch", "tj", "-n", namespace, "--timeout=3m"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=plugin_env(),
    )
    try:
        assert watch.stderr is not None
        first = watch.stderr.readline()  # the watch is in place and saw the job running
        for worker in pods_of(kubectl, namespace, "tj"):
            end_pod(kubectl, namespace, worker["metadata"]["name"])
        out, err = watch.communicate(timeout=120)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    assert out.startswith(f"TrainingJob {namespace}/tj Completed after ")
    assert first.startswith(f"{namespace}/tj  Running ")  # one line per change when not on a terminal
    assert "Completed: all 2 workers succeeded" in err


def test_watch_on_a_terminal_draws_a_progress_bar(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    completed_job(kubectl, namespace, "bar")
    controller, terminal = pty.openpty()
    # A terminal 120 columns wide (a new pseudo-terminal has none, and a bar then has no room).
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    try:
        process = subprocess.Popen(
            [str(KUBECTL), "trainingjob", "watch", "bar", "-n", namespace],
            stdout=subprocess.PIPE,
            stderr=terminal,
            env=plugin_env(),
        )
        os.close(terminal)
        out, _ = process.communicate(timeout=60)
        drawn = read_all(controller)
    finally:
        os.close(controller)
    assert process.returncode == 0
    assert out.decode().startswith(f"TrainingJob {namespace}/bar Completed")
    assert f"{namespace}/bar Completed 100%|" in drawn


def read_all(fd: int, timeout: float = 10.0) -> str:
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            if chunks:
                break
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the terminal's other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def test_watch_exit_codes_for_a_timeout_and_a_failure(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    kubectl.apply(job_manifest("fails", failurePolicy={"restartPolicy": "Never"}), "-n", namespace)
    wait_for_state(kubectl, namespace, "fails", "Running")
    timed_out = kubectl_trainingjob("watch", "fails", "-n", namespace, "--timeout=2s")
    assert timed_out.returncode == 3, timed_out
    assert timed_out.stderr.splitlines()[-1].startswith(
        f"kubectl trainingjob: TrainingJob {namespace}/fails did not finish within 2s; it is Running"
    )
    end_pod(kubectl, namespace, "fails-worker-1", exit_code=1, reason="Error")
    wait_for_state(kubectl, namespace, "fails", "Failed")
    failed = kubectl_trainingjob("watch", "fails", "-n", namespace)
    assert failed.returncode == 1, failed
    assert failed.stdout.startswith(f"TrainingJob {namespace}/fails Failed")


def test_logs_follow_rank_0s_real_log_to_the_end_of_its_container(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    kubectl = real_node
    start_operator("--progress-interval=0")
    kubectl.apply(training_job("lg", epochs=8), "-n", namespace)
    wait_running(kubectl, namespace, "lg-worker-0", timeout=180)
    follow = subprocess.Popen(
        [str(KUBECTL), "trainingjob", "logs", "lg", "-f", "-n", namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=plugin_env(),
    )
    try:
        assert follow.stdout is not None
        seen = []
        for line in follow.stdout:
            seen.append(line)
            if "epoch 1/8:" in line:
                break
        # The first epoch's line arrived while rank 0 still had seven epochs to train: it was followed.
        assert terminated(kubectl.get_json("pod", "lg-worker-0", "-n", namespace), "trainer") is None, seen
        rest = follow.stdout.read()  # to the end (not communicate(): it would skip what was buffered)
        assert follow.stderr is not None
        err = follow.stderr.read()
        follow.wait(60)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    output = "".join(seen) + rest
    assert [int(n) for n in re.findall(r"rank=0 INFO train: epoch (\d)/8:", output)] == list(range(1, 9))
    assert output.rstrip().splitlines()[-1].endswith("training finished: 8 epochs, 40 steps")
    wait_for_state(kubectl, namespace, "lg", "Completed", timeout=180)
    tail = kubectl_trainingjob("logs", "lg", "--rank", "1", "--tail", "2", "-n", namespace)
    assert tail.returncode == 0, tail.stderr
    assert len(tail.stdout.splitlines()) == 2
    assert "rank=1 INFO train: training finished: 8 epochs" in tail.stdout


def test_bad_input_is_one_line_and_exit_code_2(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    missing = one_line_error(kubectl_trainingjob("describe", "nope", "-n", namespace))
    assert missing == f'kubectl trainingjob: TrainingJob "nope" not found in namespace "{namespace}"'

    completed_job(kubectl, namespace, "done", cleanPodPolicy="All")
    wait("the finished job's pods to be deleted", lambda: pods_of(kubectl, namespace, "done") == [])
    gone = one_line_error(kubectl_trainingjob("logs", "done", "-n", namespace))
    assert gone == (
        f"kubectl trainingjob: pod {namespace}/done-worker-0 (rank 0 of TrainingJob done) no longer exists: "
        "the job is Completed and its pods were cleaned up (cleanPodPolicy All)"
    )
    elsewhere = one_line_error(kubectl_trainingjob("watch", "done", "-n", "default"))
    assert elsewhere == (
        f'kubectl trainingjob: TrainingJob "done" not found in namespace "default" '
        f'(there is one in namespace "{namespace}")'
    )
    rank = one_line_error(kubectl_trainingjob("logs", "done", "--rank=7", "-n", namespace))
    assert rank.endswith(f"rank 7 is out of range: TrainingJob {namespace}/done has 2 workers (ranks 0-1)")

    down = tmp_path / "down-kubeconfig"
    port = kubeconfig_to_nowhere(down)
    unreachable = one_line_error(
        kubectl_trainingjob("describe", "done", "-n", namespace, env=plugin_env(down))
    )
    assert unreachable == (
        f"kubectl trainingjob: cannot reach the Kubernetes API server at 127.0.0.1:{port}: connection refused"
    )

    flag = one_line_error(kubectl_trainingjob("logs", "done", "--follow=sometimes"))
    assert flag.startswith("kubectl trainingjob logs: argument --follow: invalid boolean 'sometimes'")


def test_kubeconfig_and_context_flags(kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    """--kubeconfig and --context as kubectl users pass them, the context's namespace as the default."""
    kubectl.apply(job_manifest("ctx", suspend=True), "-n", namespace)
    config = yaml.safe_load((DEV / "kubeconfig").read_text())
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    config["contexts"].append(
        {"name": "tj-plugin", "context": {**current["context"], "namespace": namespace}}
    )
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    env = plugin_env()
    env.pop("KUBECONFIG")
    found = kubectl_trainingjob("describe", "ctx", f"--kubeconfig={path}", "--context", "tj-plugin", env=env)
    assert found.returncode == 0, found.stderr
    assert f"Namespace:   {namespace}" in found.stdout
    wrong = one_line_error(
        kubectl_trainingjob("describe", "ctx", f"--kubeconfig={path}", "--context=nope", env=env)
    )
    assert wrong.startswith(f"kubectl trainingjob: cannot use kubeconfig {path}: ")
