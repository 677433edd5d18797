"""`kubectl trainingjob tensorboard`: the viewer Pod built from a TrainingJob
(trainingjob_client/tensorboard.py, pure), what happens to a pod already there, and the command's flags
and one-line refusals against a scripted API server. tests/e2e/test_mlflow_real_node.py runs the command
through the real kubectl on the real node and reads the scalars back from TensorBoard's HTTP API."""

from __future__ import annotations

import copy
import io
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd import contract
from crd.spec import TrainingJob, parse
from tests.unit.clientfakes import JOBS, NAMESPACE, UID, kubeconfig_for, not_found
from tests.unit.fakeapi import FakeApi, Reply, running
from trainingjob_client import plugin, tensorboard
from trainingjob_client.tensorboard import Existing, TensorBoardUnavailable, existing_viewer, viewer_pod

REPO = Path(__file__).resolve().parents[2]
JsonDict = dict[str, Any]


def example() -> JsonDict:
    """examples/trainingjob-mlflow.yaml as stored: checkpoints on a claim the operator creates."""
    manifest: JsonDict = yaml.safe_load((REPO / "examples" / "trainingjob-mlflow.yaml").read_text())
    manifest["metadata"].update(namespace=NAMESPACE, uid=UID)
    return manifest


def job_with(**spec: Any) -> TrainingJob:
    manifest = example()
    manifest["spec"].update(spec)
    return parse(manifest)


def test_the_viewer_mounts_the_jobs_claim_read_only_and_serves_its_log_directory() -> None:
    pod = viewer_pod(parse(example()))
    assert pod["metadata"]["name"] == "mnist-mlflow-tensorboard"
    assert pod["metadata"]["namespace"] == NAMESPACE
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert container["command"] == [
        "tensorboard",
        "--logdir=/checkpoints/tensorboard",
        "--host=0.0.0.0",
        "--port=6006",
    ]
    assert container["image"] == contract.DEFAULT_IMAGES["pytorch"]
    assert spec["volumes"] == [
        {
            "name": tensorboard.LOG_VOLUME,
            "persistentVolumeClaim": {"claimName": "mnist-mlflow-checkpoints", "readOnly": True},
        },
        {"name": "tmp", "emptyDir": {}},
    ]
    assert container["volumeMounts"] == [
        {"name": tensorboard.LOG_VOLUME, "mountPath": "/checkpoints", "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    assert container["readinessProbe"]["httpGet"] == {"path": "/", "port": 6006}
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False


def test_the_viewer_is_owned_by_the_job_but_never_looks_like_one_of_its_workers() -> None:
    metadata = viewer_pod(parse(example()))["metadata"]
    assert metadata["ownerReferences"] == [
        {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": "mnist-mlflow", "uid": UID}
    ]
    labels = metadata["labels"]
    assert all(key.startswith("app.kubernetes.io/") for key in labels), labels
    assert labels[contract.MANAGED_BY_LABEL] == "kubectl-trainingjob"
    assert contract.JOB_NAME_LABEL not in labels
    assert labels[contract.MANAGED_BY_LABEL] != contract.MANAGED_BY_VALUE  # the operator's informers skip it


def test_the_viewer_meets_the_restricted_pod_security_standard() -> None:
    spec = viewer_pod(parse(example()))["spec"]
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsNonRoot": True,
        "runAsUser": contract.NON_ROOT_USER,
        "runAsGroup": contract.NON_ROOT_GROUP,
    }
    assert spec["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


def test_the_viewer_reads_as_the_user_the_template_gives_the_trainer() -> None:
    template = {
        "spec": {
            "securityContext": {"runAsUser": 2000, "fsGroup": 3000},
            "containers": [{"name": contract.CONTAINER_NAME, "securityContext": {"runAsGroup": 4000}}],
        }
    }
    context = viewer_pod(job_with(podTemplate=template))["spec"]["securityContext"]
    assert context == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsUser": 2000,
        "fsGroup": 3000,
        "runAsGroup": 4000,
    }


def test_the_viewer_goes_where_the_jobs_pods_may_go_and_pulls_as_they_do() -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    template_toleration = {"key": "gpu", "operator": "Exists"}
    job = job_with(
        scheduling={"nodeSelector": {"pool": "train"}, "tolerations": [toleration], "priority": "high"},
        podTemplate={
            "spec": {
                "nodeSelector": {"zone": "a"},
                "tolerations": [template_toleration],
                "imagePullSecrets": [{"name": "registry"}],
            }
        },
    )
    spec = viewer_pod(job)["spec"]
    assert spec["nodeSelector"] == {"pool": "train", "zone": "a"}
    assert spec["tolerations"] == [toleration, template_toleration]
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert "priorityClassName" not in spec


def test_an_nfs_checkpoint_export_is_mounted_read_only_at_the_trainers_path() -> None:
    checkpoint = {
        "enabled": True,
        "mountPath": "/ckpt",
        "storage": {"type": "nfs", "nfs": {"server": "nfs.example.com", "path": "/exports/a"}},
    }
    pod = viewer_pod(job_with(checkpoint=checkpoint))
    assert pod["spec"]["volumes"][0] == {
        "name": tensorboard.LOG_VOLUME,
        "nfs": {"server": "nfs.example.com", "path": "/exports/a", "readOnly": True},
    }
    assert pod["spec"]["containers"][0]["command"][1] == "--logdir=/ckpt/tensorboard"


def test_a_log_directory_on_a_claim_the_template_mounts_is_viewed_from_that_claim() -> None:
    template = {
        "spec": {
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "runs", "persistentVolumeClaim": {"claimName": "team-runs"}},
            ],
            "containers": [
                {
                    "name": contract.CONTAINER_NAME,
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": "/scratch"},
                        {"name": "runs", "mountPath": "/runs", "subPath": "mnist"},
                    ],
                }
            ],
        }
    }
    monitoring = {**example()["spec"]["monitoring"], "tensorboardLogDir": "/runs/tb"}
    pod = viewer_pod(job_with(monitoring=monitoring, podTemplate=template))
    assert pod["spec"]["volumes"][0] == {
        "name": tensorboard.LOG_VOLUME,
        "persistentVolumeClaim": {"claimName": "team-runs"},
    }
    assert pod["spec"]["containers"][0]["volumeMounts"][0] == {
        "name": tensorboard.LOG_VOLUME,
        "mountPath": "/runs",
        "readOnly": True,
        "subPath": "mnist",
    }
    assert pod["spec"]["containers"][0]["command"][1] == "--logdir=/runs/tb"


def test_image_overrides_the_jobs() -> None:
    pod = viewer_pod(parse(example()), image="tensorflow/tensorflow:2.17.0")
    assert pod["spec"]["containers"][0]["image"] == "tensorflow/tensorflow:2.17.0"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"monitoring": {"tensorboardEnabled": False}}, "set spec.monitoring.tensorboardEnabled=true"),
        (
            {"checkpoint": {"enabled": False}},
            "writes its TensorBoard logs to /tmp/tensorboard, which is inside its pods",
        ),
        (
            {"checkpoint": {"enabled": True, "storage": {"type": "s3", "s3": {"bucket": "b"}}}},
            "set spec.monitoring.tensorboardLogDir to a directory on a pvc or nfs volume",
        ),
        (
            {"monitoring": {"tensorboardEnabled": True, "tensorboardLogDir": "/scratch/tb"}},
            "writes its TensorBoard logs to /scratch/tb",
        ),
    ],
)
def test_logs_no_other_pod_can_read_are_refused_saying_what_to_set(spec: JsonDict, says: str) -> None:
    with pytest.raises(TensorBoardUnavailable) as refused:
        viewer_pod(job_with(**spec))
    assert f"TrainingJob {NAMESPACE}/mnist-mlflow " in str(refused.value)
    assert says in str(refused.value)
    assert "\n" not in str(refused.value)


# ------------------------------------------------------------------------------- an existing viewer


def stored(pod: JsonDict, **status: Any) -> JsonDict:
    answer = copy.deepcopy(pod)
    answer["metadata"]["uid"] = "pod-uid"
    answer["status"] = status
    return answer


def test_a_running_viewer_of_the_job_is_reused_a_stale_one_replaced_another_pod_left_alone() -> None:
    wanted = viewer_pod(parse(example()))
    assert existing_viewer(stored(wanted, phase="Running"), wanted) is Existing.REUSE
    assert existing_viewer(stored(wanted, phase="Failed"), wanted) is Existing.REPLACE
    terminating = stored(wanted, phase="Running")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert existing_viewer(terminating, wanted) is Existing.REPLACE
    earlier_job = stored(wanted, phase="Running")
    earlier_job["metadata"]["ownerReferences"][0]["uid"] = "an-earlier-job"
    assert existing_viewer(earlier_job, wanted) is Existing.REPLACE
    other_image = viewer_pod(parse(example()), image="other:1")
    assert existing_viewer(stored(wanted, phase="Running"), other_image) is Existing.REPLACE
    someone_elses = stored(wanted, phase="Running")
    someone_elses["metadata"]["labels"] = {"app": "mine"}
    assert existing_viewer(someone_elses, wanted) is Existing.FOREIGN


def test_progress_says_why_the_viewer_is_not_ready_yet() -> None:
    pod = viewer_pod(parse(example()))
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/2 nodes are available:\n 1 node(s) had volume node affinity conflict.",
    }
    assert tensorboard.progress(stored(pod, phase="Pending", conditions=[unschedulable])) == (
        "Pending: Unschedulable: 0/2 nodes are available: 1 node(s) had volume node affinity conflict."
    )
    pulling = {"name": "tensorboard", "state": {"waiting": {"reason": "ContainerCreating"}}}
    assert tensorboard.progress(stored(pod, phase="Pending", containerStatuses=[pulling])) == (
        "Pending: ContainerCreating"
    )
    started = {"name": "tensorboard", "state": {"running": {}}}
    assert tensorboard.progress(stored(pod, phase="Running", containerStatuses=[started])) == (
        "Running: TensorBoard is starting"
    )
    ready = stored(pod, phase="Running", conditions=[{"type": "Ready", "status": "True"}])
    assert tensorboard.is_ready(ready)
    assert tensorboard.progress(ready) == "Ready"


def test_a_viewer_that_ended_says_why_and_suggests_another_image_when_it_could_not_start() -> None:
    pod = viewer_pod(parse(example()))
    assert tensorboard.failure(stored(pod, phase="Running"), "img:1") is None
    exited = {
        "name": "tensorboard",
        "state": {
            "terminated": {
                "reason": "StartError",
                "exitCode": 128,
                "message": 'exec: "tensorboard": executable file not found in $PATH',
            }
        },
    }
    said = tensorboard.failure(stored(pod, phase="Failed", containerStatuses=[exited]), "img:1")
    assert said == (
        f"TensorBoard ended in pod {NAMESPACE}/mnist-mlflow-tensorboard: StartError (exit code 128): "
        'exec: "tensorboard": executable file not found in $PATH; does image img:1 have the tensorboard '
        "package? choose another with --image"
    )
    killed = {"name": "tensorboard", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}
    assert tensorboard.failure(stored(pod, phase="Failed", containerStatuses=[killed]), "img:1") == (
        f"TensorBoard ended in pod {NAMESPACE}/mnist-mlflow-tensorboard: OOMKilled (exit code 137)"
    )


# ------------------------------------------------------------------------------ the command's flags


def test_the_commands_flags_are_kubectls() -> None:
    args = plugin.parser().parse(["tensorboard", "mnist", "--port=0", "--keep=false", "--timeout=90s"])
    assert (args.command, args.name, args.port, args.keep, args.timeout, args.image) == (
        "tensorboard",
        "mnist",
        0,
        False,
        90.0,
        None,
    )
    args = plugin.parser().parse(["tensorboard", "mnist", "--keep", "--image", "tb:1", "-n", "team"])
    assert (args.port, args.keep, args.image, args.namespace) == (6006, True, "tb:1", "team")


@pytest.mark.parametrize("port", ["65536", "-1", "http"])
def test_a_bad_port_is_one_line_and_exit_code_2(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        plugin.parser().parse(["tensorboard", "mnist", f"--port={port}"])
    assert exited.value.code == plugin.EXIT_ERROR
    error = capsys.readouterr().err
    assert error.count("\n") == 1
    assert error.startswith("kubectl trainingjob tensorboard: argument --port:")


@pytest.fixture
def api() -> Any:
    with running() as server:
        yield server


def run(kubeconfig: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = plugin.main(["tensorboard", *argv, "-n", NAMESPACE, f"--kubeconfig={kubeconfig}"], out, err)
    return code, out.getvalue(), err.getvalue()


def test_a_job_without_viewable_logs_is_refused_in_one_line_before_any_pod(
    api: FakeApi, tmp_path: Path
) -> None:
    kubeconfig = kubeconfig_for(api, tmp_path / "kubeconfig")
    stored_job = example()
    stored_job["spec"]["checkpoint"] = {"enabled": False}
    api.script("GET", f"{JOBS}/mnist-mlflow", Reply(200, stored_job))
    code, out, err = run(kubeconfig, "mnist-mlflow")
    assert (code, out) == (plugin.EXIT_ERROR, "")
    assert err.count("\n") == 1
    assert err.startswith(f"kubectl trainingjob: TrainingJob {NAMESPACE}/mnist-mlflow writes its TensorBoard")
    assert not api.requests("POST")


def test_a_port_in_use_is_refused_in_one_line_before_any_pod(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = kubeconfig_for(api, tmp_path / "kubeconfig")
    with_kubectl_on_path(tmp_path, monkeypatch)
    api.script("GET", f"{JOBS}/mnist-mlflow", Reply(200, example()))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run(kubeconfig, "mnist-mlflow", f"--port={port}")
    assert (code, out) == (plugin.EXIT_ERROR, "")
    assert err == f"kubectl trainingjob: port {port} on 127.0.0.1 is in use: choose another with --port\n"
    assert not api.requests("POST")


def test_no_such_job_is_one_line(api: FakeApi, tmp_path: Path) -> None:
    kubeconfig = kubeconfig_for(api, tmp_path / "kubeconfig")
    api.script("GET", f"{JOBS}/nope", Reply(404, not_found("trainingjobs", "nope")))
    code, out, err = run(kubeconfig, "nope")
    assert (code, out) == (plugin.EXIT_ERROR, "")
    assert err.count("\n") == 1
    assert 'TrainingJob "nope" not found' in err


def with_kubectl_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kubectl on PATH (the command looks for it before it makes a pod; these tests end before it
    would port-forward)."""
    kubectl = tmp_path / "kubectl"
    kubectl.write_text("#!/bin/sh\nexit 1\n")
    kubectl.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))


VIEWER = f"/api/v1/namespaces/{NAMESPACE}/pods/mnist-mlflow-tensorboard"


def test_a_pod_of_the_name_it_did_not_make_is_left_alone(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_kubectl_on_path(tmp_path, monkeypatch)
    kubeconfig = kubeconfig_for(api, tmp_path / "kubeconfig")
    api.script("GET", f"{JOBS}/mnist-mlflow", Reply(200, example()))
    someone_elses = {"metadata": {"name": "mnist-mlflow-tensorboard", "labels": {"app": "mine"}}}
    api.script("GET", VIEWER, Reply(200, someone_elses))
    code, out, err = run(kubeconfig, "mnist-mlflow", "--port=0")
    assert (code, out) == (plugin.EXIT_ERROR, "")
    assert err == (
        f"kubectl trainingjob: pod {NAMESPACE}/mnist-mlflow-tensorboard exists and is not a TensorBoard "
        "viewer made by this command: delete it or rename it\n"
    )
    assert not api.requests("POST")
    assert not api.requests("DELETE")


def test_a_viewer_that_cannot_start_is_deleted_and_the_error_says_why(
    api: FakeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_kubectl_on_path(tmp_path, monkeypatch)
    kubeconfig = kubeconfig_for(api, tmp_path / "kubeconfig")
    api.script("GET", f"{JOBS}/mnist-mlflow", Reply(200, example()))
    created = stored(viewer_pod(parse(example())), phase="Pending")
    exited = {"name": "tensorboard", "state": {"terminated": {"reason": "StartError", "exitCode": 128}}}
    api.script(
        "GET",
        VIEWER,
        Reply(404, not_found("pods", "mnist-mlflow-tensorboard")),
        Reply(200, stored(created, phase="Failed", containerStatuses=[exited])),
        Reply(404, not_found("pods", "mnist-mlflow-tensorboard")),
    )
    api.script("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", Reply(201, created))
    api.script("DELETE", VIEWER, Reply(200, created))
    code, out, err = run(kubeconfig, "mnist-mlflow", "--port=0")
    assert (code, out) == (plugin.EXIT_ERROR, "")
    assert err.splitlines() == [
        f"pod {NAMESPACE}/mnist-mlflow-tensorboard created",
        f"pod {NAMESPACE}/mnist-mlflow-tensorboard deleted",
        f"kubectl trainingjob: TensorBoard ended in pod {NAMESPACE}/mnist-mlflow-tensorboard: StartError "
        f"(exit code 128); does image {contract.DEFAULT_IMAGES['pytorch']} have the tensorboard package? "
        "choose another with --image",
    ]
    (posted,) = api.requests("POST")
    assert posted.json()["metadata"]["name"] == "mnist-mlflow-tensorboard"
    (deleted,) = api.requests("DELETE")
    assert deleted.json()["preconditions"] == {"uid": "pod-uid"}


STOPPABLE = """
import time
from trainingjob_client.viewer import _stop_signals_interrupt
with _stop_signals_interrupt():
    try:  # the signal may come as soon as "serving" is out, before a later `try` is entered
        print("serving", flush=True)
        time.sleep(60)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
"""


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_end_a_viewer_started_with_sigint_ignored(stop: signal.Signals) -> None:
    """A viewer started in a script's background (`kubectl trainingjob tensorboard ... &`) inherits
    SIGINT ignored, and Python installs no handler for it then: the viewer must install its own."""
    process = subprocess.Popen(
        [sys.executable, "-c", STOPPABLE],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # noqa: PLW1509 - no threads here
    )
    assert process.stdout is not None
    try:
        assert process.stdout.readline() == "serving\n"
        process.send_signal(stop)
        out, _ = process.communicate(timeout=30)
    finally:
        process.kill()
    assert out == "interrupted\n"
    assert process.returncode == 0
