"""`kubectl trainingjob` (trainingjob_client/plugin.py) against a scripted API server: its output, its
exit codes, and one line for every kind of trouble. The e2e tests run it through the real kubectl."""

from __future__ import annotations

import io
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.clientfakes import (
    JOBS,
    NAMESPACE,
    PODS,
    SteppingClock,
    changed,
    condition,
    job,
    kubeconfig_for,
    pod,
)
from tests.unit.fakeapi import FakeApi, Reply, Stream, event, items_list, running, status
from trainingjob_client import client as client_module
from trainingjob_client import plugin

MNIST = f"{JOBS}/mnist"


@pytest.fixture
def api() -> Iterator[FakeApi]:
    with running() as server:
        yield server


@pytest.fixture
def kubeconfig(api: FakeApi, tmp_path: Path) -> Path:
    return kubeconfig_for(api, tmp_path / "kubeconfig", namespace="elsewhere")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = plugin.main(list(argv), out, err)
    return code, out.getvalue(), err.getvalue()


def one_line(text: str) -> str:
    assert text.count("\n") == 1, text
    assert "Traceback" not in text
    return text.strip()


def finishing(api: FakeApi, final: dict[str, object]) -> None:
    current = job(state="Running", currentEpoch=1, totalEpochs=2)
    api.script("GET", MNIST, Reply(200, current))
    api.script(
        "GET",
        JOBS,
        Stream(
            (
                event(
                    "MODIFIED",
                    changed(current, "11", state="Restarting", restartCount=1, lastRestartReason="OOMKilled"),
                ),
                event("MODIFIED", changed(current, "12", **final)),
            )
        ),
    )


def test_watch_exits_0_when_the_job_completes(api: FakeApi, kubeconfig: Path) -> None:
    finishing(api, {"state": "Completed", "duration": "1m2s", "restartCount": 1, "currentEpoch": 2})
    code, out, err = run("watch", "mnist", "-n", NAMESPACE, f"--kubeconfig={kubeconfig}")
    assert code == plugin.EXIT_OK
    assert out == "TrainingJob ns/mnist Completed after 1m2s, 1 restarts\n"
    assert "ns/mnist  Running       epoch 1/2" in err
    assert "restart 1: OOMKilled" in err
    assert "Completed" in err.splitlines()[-2]


def test_watch_exits_1_when_the_job_fails(api: FakeApi, kubeconfig: Path) -> None:
    finishing(api, {"state": "Failed", "failureReason": "BackoffLimitExceeded", "message": "rank 1 exited 1"})
    code, out, _ = run("-n", NAMESPACE, "--kubeconfig", str(kubeconfig), "watch", "mnist")
    assert code == plugin.EXIT_FAILED
    assert out == "TrainingJob ns/mnist Failed: BackoffLimitExceeded: rank 1 exited 1\n"


def test_watch_exits_3_on_its_timeout(
    api: FakeApi, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "RealClock", lambda: SteppingClock(20))
    api.script("GET", MNIST, Reply(200, job(state="Running")))
    api.script("GET", JOBS, Stream(), Stream())
    code, _, err = run("watch", "mnist", "-n", NAMESPACE, f"--kubeconfig={kubeconfig}", "--timeout=1m")
    assert code == plugin.EXIT_TIMEOUT
    assert err.splitlines()[-1] == (
        "kubectl trainingjob: TrainingJob ns/mnist did not finish within 1m00s; it is Running"
    )


def test_logs_prints_the_ranks_log_and_follows_it(api: FakeApi, kubeconfig: Path) -> None:
    api.script("GET", MNIST, Reply(200, job(state="Running")), Reply(200, job(state="Running")))
    worker = f"{PODS}/mnist-worker-1"
    api.script("GET", worker, Reply(200, pod("mnist-worker-1", 1)), Reply(200, pod("mnist-worker-1", 1)))
    api.script("GET", f"{worker}/log", Reply(200, b"line 1\nline 2\n"), Stream((b"line 1\n", b"line 2\n")))
    assert run("logs", "mnist", "--rank", "1", "-n", NAMESPACE, f"--kubeconfig={kubeconfig}") == (
        0,
        "line 1\nline 2\n",
        "",
    )
    assert run("logs", "mnist", "--rank=1", "-f", "-n", NAMESPACE, f"--kubeconfig={kubeconfig}") == (
        0,
        "line 1\nline 2\n",
        "",
    )
    first, second = api.requests("GET", f"{worker}/log")
    assert "follow" not in first.query
    assert second.query["follow"] == "true"


def test_describe_prints_the_rank_table(api: FakeApi, kubeconfig: Path) -> None:
    pending = job(
        state="Pending",
        conditions=[
            condition(
                "Running", "False", "PodsUnschedulable", "1/2 pods unschedulable: 0/4 nodes are available"
            )
        ],
    )
    api.default("GET", MNIST, Reply(200, pending))
    api.script(
        "GET",
        PODS,
        Reply(
            200,
            items_list([pod("mnist-worker-0", 0), pod("mnist-worker-1", 1, node=None, phase="Pending")], "3"),
        ),
    )
    api.script("GET", f"/api/v1/namespaces/{NAMESPACE}/events", Reply(200, items_list([], "3")))
    code, out, err = run("describe", "mnist", "-n", NAMESPACE, f"--kubeconfig={kubeconfig}")
    assert (code, err) == (0, "")
    assert (
        "Not running: not running: PodsUnschedulable: 1/2 pods unschedulable: 0/4 nodes are available" in out
    )
    assert "  0      mnist-worker-0   gpu-node-0   Running   running" in out
    assert "  1      mnist-worker-1   -            Pending   -" in out


def test_suspend_and_resume(api: FakeApi, kubeconfig: Path) -> None:
    api.script("PATCH", MNIST, Reply(200, job()), Reply(200, job()))
    assert run("suspend", "mnist", "-n", NAMESPACE, f"--kubeconfig={kubeconfig}") == (
        0,
        "trainingjob.ml.example.com/mnist suspended\n",
        "",
    )
    assert run("resume", "mnist", "-n", NAMESPACE, f"--kubeconfig={kubeconfig}")[1] == (
        "trainingjob.ml.example.com/mnist resumed\n"
    )
    assert [r.json() for r in api.requests("PATCH", MNIST)] == [
        {"spec": {"suspend": True}},
        {"spec": {"suspend": False}},
    ]


def test_the_namespace_defaults_to_the_contexts_and_kubeconfig_to_the_environment(
    api: FakeApi, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    path = "/apis/ml.example.com/v1/namespaces/elsewhere/trainingjobs/mnist"
    api.script("GET", path, Reply(404, status(404, "NotFound", "x") | {"details": {"name": "mnist"}}))
    api.script("GET", "/apis/ml.example.com/v1/trainingjobs", Reply(200, items_list([job()], "1")))
    code, out, err = run("describe", "mnist")
    assert (code, out) == (plugin.EXIT_ERROR, "")
    assert one_line(err) == (
        'kubectl trainingjob: TrainingJob "mnist" not found in namespace "elsewhere" '
        '(there is one in namespace "ns")'
    )


def test_a_cluster_that_is_down(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = kubeconfig_for(None, tmp_path / "kubeconfig", server=f"http://127.0.0.1:{port}")
    code, _, err = run("watch", "mnist", f"--kubeconfig={path}")
    assert code == plugin.EXIT_ERROR
    assert one_line(err).startswith(
        "kubectl trainingjob: cannot reach the Kubernetes API server at 127.0.0.1:"
    )
    assert one_line(err).endswith(f"127.0.0.1:{port}: connection refused")


def test_a_missing_kubeconfig(tmp_path: Path) -> None:
    code, _, err = run("describe", "mnist", f"--kubeconfig={tmp_path / 'none'}")
    assert code == plugin.EXIT_ERROR
    assert (
        one_line(err)
        == f"kubectl trainingjob: cannot read kubeconfig {tmp_path / 'none'}: No such file or directory"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["logs", "mnist", "--rank=-1"],
            "kubectl trainingjob logs: argument --rank: invalid value '-1': must be at least 0",
        ),
        (
            ["logs", "mnist", "--follow=maybe"],
            "kubectl trainingjob logs: argument --follow: invalid boolean 'maybe'",
        ),
        (
            ["watch", "mnist", "--timeout=soon"],
            "kubectl trainingjob watch: argument --timeout: invalid duration 'soon'",
        ),
        (["explain", "mnist"], "kubectl trainingjob: argument COMMAND: invalid choice: 'explain'"),
        (["watch"], "kubectl trainingjob watch: the following arguments are required: NAME"),
        (["describe", "mnist", "--bogus"], "kubectl trainingjob: unknown flag or argument: --bogus"),
    ],
)
def test_bad_flags_are_one_line_and_exit_code_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        plugin.main(argv)
    assert exited.value.code == plugin.EXIT_ERROR
    assert one_line(capsys.readouterr().err).startswith(expected)


def test_follow_false_reads_the_whole_log(api: FakeApi, kubeconfig: Path) -> None:
    api.script("GET", MNIST, Reply(200, job(state="Running")))
    api.script("GET", f"{PODS}/mnist-worker-0", Reply(200, pod("mnist-worker-0", 0)))
    api.script("GET", f"{PODS}/mnist-worker-0/log", Reply(200, b"done\n"))
    assert run("logs", "mnist", "--follow=false", "-n", NAMESPACE, f"--kubeconfig={kubeconfig}") == (
        0,
        "done\n",
        "",
    )
