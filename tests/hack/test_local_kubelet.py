"""The local kubelet's decisions about a pod (hack/local_kubelet), without a cluster.

What a kubelet computes from a Pod is what makes a locally run trainer behave like one in a cluster:
the environment ($(VAR) expansion, the downward API, Secret and ConfigMap references), the mount paths
made local, and which commands it can run at all. The end-to-end behaviour (processes, tokens, status)
is tested against the real API server in tests/e2e/test_demo.py.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from builders.configmap import TRAINER_SOURCES_NAME
from builders.pods import build_pod
from controller.runtime.client import KubeClient
from crd import contract
from crd.spec import parse
from hack.local_kubelet.env import resolve_env
from hack.local_kubelet.kubelet import Kubelet, PodEvent
from hack.local_kubelet.pods import (
    expand,
    field_value,
    gang_size,
    is_running,
    python_script_args,
    torchrun_args,
)
from hack.local_kubelet.volumes import Mount, remap
from hack.podstatus import exit_code_of, log_tail_message, terminated_status_patch
from tests.unit import fakeapi
from tests.unit.crd_cases import job

JsonDict = dict[str, Any]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        ("$(A)/x", "1/x"),
        ("$(A)$(B)", "12"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$1"),
        ("cost $5", "cost $5"),
        ("$(A", "$(A"),
        ("end$", "end$"),
        ("$()", "$()"),
    ],
)
def test_expand_follows_kubernetes(value: str, expected: str) -> None:
    assert expand(value, {"A": "1", "B": "2"}) == expected


def pod_of(manifest: JsonDict, index: int = 0) -> JsonDict:
    manifest["metadata"].update(namespace="ml", uid="job-uid", generation=1)
    pod = build_pod(parse(manifest), index, attempt=1, resume_from=None)
    pod["metadata"]["uid"] = "uid-1"
    pod["spec"]["nodeName"] = "gpu-node-0"
    pod["status"] = {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}]}
    return pod


def test_field_values_of_the_downward_api() -> None:
    pod = pod_of(job({}))
    assert field_value(pod, "metadata.name") == pod["metadata"]["name"]
    assert field_value(pod, "metadata.namespace") == "ml"
    assert field_value(pod, "status.podIP") == "10.0.0.7"
    assert field_value(pod, "spec.nodeName") == "gpu-node-0"
    assert field_value(pod, f"metadata.labels['{contract.ATTEMPT_LABEL}']") == "1"
    assert field_value(pod, "metadata.labels['absent']") is None
    assert field_value(pod, "status.hostIP") is None
    assert field_value(pod, "spec.unknownField") is None


def test_resolve_env_gives_the_operator_environment_with_references_resolved() -> None:
    manifest = job({"spec.checkpoint.enabled": True})
    manifest["spec"]["env"] = [
        {"name": "SHARED", "value": "$(CHECKPOINT_DIR)/shared"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "GONE", "valueFrom": {"secretKeyRef": {"name": "missing", "key": "x"}}},
        {
            "name": "MAYBE",
            "valueFrom": {"configMapKeyRef": {"name": "missing", "key": "x", "optional": True}},
        },
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
    ]
    pod = pod_of(manifest)
    container = pod["spec"]["containers"][0]
    container["envFrom"] = [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}]
    objects = {
        ("Secret", "creds"): {"data": {"token": base64.b64encode(b"s3cret").decode()}},
        ("ConfigMap", "settings"): {"data": {"mode": "fast", "level": "3"}},
    }
    asked: list[tuple[str, str, str]] = []

    def lookup(kind: str, namespace: str, name: str) -> JsonDict | None:
        asked.append((kind, namespace, name))
        return objects.get((kind, name))

    env, notes = resolve_env(pod, container, lookup)
    assert env["POD_NAME"] == pod["metadata"]["name"]
    assert env["TRAININGJOB_NAMESPACE"] == "ml"
    assert env["CHECKPOINT_DIR"] == "/checkpoints"
    assert env["SHARED"] == "/checkpoints/shared"  # expanded against what came before
    assert env["TOKEN"] == "s3cret"
    assert env["MODE"] == "fast"
    assert (env["CFG_mode"], env["CFG_level"]) == ("fast", "3")  # prefix + key, as is
    assert "GONE" not in env
    assert "MAYBE" not in env
    assert "CPU" not in env
    assert all(namespace == "ml" for _kind, namespace, _name in asked)
    assert len(notes) == 2  # the missing required Secret and the unsupported resourceFieldRef
    assert any("GONE" in note and "missing" in note for note in notes)
    assert any("CPU" in note and "resourceFieldRef" in note for note in notes)


def test_remap_makes_mount_paths_local(tmp_path: Path) -> None:
    mounts = [
        Mount("/checkpoints", tmp_path / "checkpoints"),
        Mount(contract.CONFIG_MOUNT_PATH, tmp_path / "config"),
        Mount("/checkpoints/tensorboard", tmp_path / "tb"),
    ]
    assert remap("/checkpoints", mounts) == str(tmp_path / "checkpoints")
    assert remap("/checkpoints/epoch-3", mounts) == str(tmp_path / "checkpoints" / "epoch-3")
    assert remap("/checkpoints/tensorboard/run", mounts) == str(tmp_path / "tb" / "run")  # longest wins
    assert remap("/etc/trainingjob/config.json", mounts) == str(tmp_path / "config" / "config.json")
    assert remap("/checkpointsX", mounts) == "/checkpointsX"
    assert remap("s3://bucket/job", mounts) == "s3://bucket/job"
    assert remap("relative/checkpoints", mounts) == "relative/checkpoints"


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (list(contract.DEFAULT_COMMAND), ([], "/etc/trainingjob/train.py", [])),
        (
            ["python3", "-u", "/etc/trainingjob/train.py", "--lr", "1"],
            (["-u"], "/etc/trainingjob/train.py", ["--lr", "1"]),
        ),
        (["/usr/bin/python3.11", "/code/train.py"], ([], "/code/train.py", [])),
        (["python", "train.py", "-x"], ([], "train.py", ["-x"])),
        (["python", "-m", "torch.distributed.run", "/etc/trainingjob/train.py"], None),
        (["python", "-c", "print(1)"], None),
        (["python", "-u"], None),
        (["torchrun", "/code/train.py"], None),
        (["bash", "-c", "python /etc/trainingjob/train.py"], None),
        (["sleep", "1000"], None),
        ([], None),
    ],
)
def test_only_python_scripts_can_run(
    tokens: list[str], expected: tuple[list[str], str, list[str]] | None
) -> None:
    assert python_script_args(tokens) == expected


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (list(contract.ELASTIC_DEFAULT_COMMAND), ["/etc/trainingjob/train.py"]),
        (["torchrun", "--nproc-per-node=2", "/code/t.py", "-x"], ["--nproc-per-node=2", "/code/t.py", "-x"]),
        (["/usr/local/bin/torchrun", "t.py"], ["t.py"]),
        (["python3", "-u", "-m", "torch.distributed.run", "t.py"], ["t.py"]),
        (["python", "-m", "torch.distributed.launch", "t.py"], None),
        (["python", "/etc/trainingjob/train.py"], None),
        (["python", "-m"], None),
        (["bash", "-c", "torchrun t.py"], None),
        ([], None),
    ],
)
def test_torchrun_commands_give_torchruns_arguments(tokens: list[str], expected: list[str] | None) -> None:
    assert torchrun_args(tokens) == expected


def test_a_pod_runs_once_kwok_marked_it_running() -> None:
    pod = pod_of(job({}))
    assert not is_running(pod)  # no container status yet
    pod["status"]["containerStatuses"] = [{"name": "trainer", "state": {"running": {"startedAt": "t"}}}]
    assert is_running(pod)
    pod["metadata"]["deletionTimestamp"] = "t"
    assert not is_running(pod)
    assert gang_size(pod_of(job({"spec.numWorkers": 3}))) == 3
    # An elastic job's pods start alone: torchrun's rendezvous waits for the others, if it must.
    elastic = {"spec.numWorkers": 3, "spec.elastic": {"minWorkers": 2, "maxWorkers": 3}}
    assert gang_size(pod_of(job(elastic))) == 1


def test_a_process_end_becomes_what_a_kubelet_reports() -> None:
    pod = pod_of(job({}))
    pod["status"]["containerStatuses"] = [
        {"name": "trainer", "containerID": "kwok://trainer", "state": {"running": {"startedAt": "t0"}}}
    ]
    assert exit_code_of(0) == 0
    assert exit_code_of(1) == 1
    assert exit_code_of(-15) == 143  # killed by SIGTERM
    patch = terminated_status_patch(
        pod,
        exit_code=143,
        message="bye",
        disruption="TerminationByKubelet",
        now="t1",
        who="the local kubelet",
    )
    status = patch["status"]
    assert status["phase"] == "Failed"
    [container] = status["containerStatuses"]
    assert container["state"]["terminated"] == {
        "exitCode": 143,
        "reason": "Error",
        "startedAt": "t0",
        "finishedAt": "t1",
        "message": "bye",
    }
    assert container["containerID"] == "kwok://trainer"
    [disruption] = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
    assert disruption["reason"] == "TerminationByKubelet"
    assert disruption["message"] == "TerminationByKubelet (simulated by the local kubelet)"
    assert terminated_status_patch(pod, now="t1")["status"]["phase"] == "Succeeded"


def test_the_termination_message_is_the_log_tail_a_kubelet_keeps() -> None:
    text = "".join(f"line {i}\n" for i in range(200))
    message = log_tail_message(text)
    assert message.endswith("line 199")
    assert len(message.splitlines()) <= 80
    assert len(message.encode()) <= 2048
    assert log_tail_message("é" * 3000).startswith("é")  # never half a character


def running_pod(changes: dict[str, Any], uid: str) -> JsonDict:
    pod = pod_of(job({"spec.numWorkers": 1, **changes}))
    pod["metadata"]["uid"] = uid
    pod["status"]["containerStatuses"] = [{"name": "trainer", "state": {"running": {"startedAt": "t"}}}]
    return pod


def test_odd_pods_never_stop_the_kubelet(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    unlabelled = running_pod({}, "unlabelled")
    del unlabelled["metadata"]["labels"][contract.JOB_NAME_LABEL]
    two_containers = running_pod({}, "two-containers")
    two_containers["spec"]["containers"].append({"name": "sidecar", "image": "busybox"})
    custom = running_pod({"spec.command": ["sleep", "3600"]}, "custom")
    no_config = running_pod({}, "no-config")  # the trainer's ConfigMap does not exist (the fake API: 404)
    weird_status = running_pod({}, "weird-status")
    weird_status["status"] = {"phase": "Running", "containerStatuses": "running"}
    odd: list[JsonDict] = [
        {},
        {"metadata": {}},
        {"metadata": {"uid": "bare"}},
        {"metadata": {"uid": "x"}, "spec": 1},
    ]
    with fakeapi.running() as api:
        client = KubeClient(api.api_client(), qps=0, burst=0, max_attempts=1)
        kubelet = Kubelet(client, ["ml"], tmp_path / "state", tmp_path / "logs")
        for pod in [*odd, weird_status, unlabelled, two_containers, custom, no_config]:
            kubelet.handle(PodEvent("upsert", pod))
        kubelet.tick()
        for pod in odd:
            kubelet.handle(PodEvent("delete", pod))
        kubelet.tick()
    assert kubelet.running == set()
    assert kubelet.started == {}
    assert {"unlabelled", "two-containers", "custom", "no-config"} <= kubelet.done
    assert "weird-status" not in kubelet.done  # not Running as far as it can tell: it waits
    messages = "\n".join(record.getMessage() for record in caplog.records)
    assert (
        "command 'sleep 3600': only `python SCRIPT` and torchrun with the script in one of the pod's volumes"
        in messages
    )
    assert f"ConfigMap {TRAINER_SOURCES_NAME}" in messages
    assert not (tmp_path / "logs").exists()  # nothing was started
