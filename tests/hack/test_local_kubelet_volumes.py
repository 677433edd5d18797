"""A pod's volumes and containers made local (hack/local_kubelet/volumes.py, launch.py), without a cluster.

Where each volume type lands decides what is shared: a claim's data must outlive the pod and be seen by
the next job (a dataset, a retained checkpoint claim), an emptyDir must be new for every pod, a
hostPath must never be the machine's real path. Which command runs decides what a pod can do here:
python scripts from the pod's volumes run with their paths remapped, other sidecar commands get a
stand-in. The API is replaced by a table of ConfigMaps and Secrets; the same on the real cluster:
tests/e2e/test_local_kubelet.py.
"""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from builders.configmap import TRAINER_SOURCES, TRAINER_SOURCES_NAME
from builders.pods import build_pod
from controller.runtime.client import KubeClient
from crd import contract
from crd.spec import parse
from hack.local_kubelet.launch import (
    LOOPBACK_TORCHRUN,
    STAND_IN_DONE,
    STAND_IN_SLEEP,
    AttemptKey,
    AttemptPorts,
    LocalSettings,
    prepare,
)
from hack.local_kubelet.pods import Role, SkipPod
from hack.local_kubelet.volumes import LocalVolumes, Mount, TokenFile, remap
from tests.unit import fakeapi
from tests.unit.crd_cases import job

JsonDict = dict[str, Any]
TRAIN_PY = "print('training')\n"


class TableVolumes(LocalVolumes):
    """LocalVolumes reading ConfigMaps and Secrets from a table; tokens are written, not requested."""

    def __init__(self, state_dir: Path, objects: dict[tuple[str, str], JsonDict]) -> None:
        with fakeapi.running() as api:
            super().__init__(KubeClient(api.api_client(), qps=0, burst=0), state_dir)
        self.objects = objects

    def lookup(self, kind: str, namespace: str, name: str) -> JsonDict | None:
        return self.objects.get((kind, name))

    def mint_token(self, pod: JsonDict, token: TokenFile) -> None:
        token.path.parent.mkdir(parents=True, exist_ok=True)
        token.path.write_text(f"token-of-{pod['metadata']['name']}")


def worker(template: JsonDict | None = None, uid: str = "uid-1", **spec: Any) -> JsonDict:
    manifest = job({f"spec.{key}": value for key, value in spec.items()})
    if template is not None:
        manifest["spec"]["podTemplate"] = template
    manifest["metadata"].update(namespace="ml", uid="job-uid", generation=1)
    pod = build_pod(parse(manifest), 0, attempt=0, resume_from=None)
    pod["metadata"]["uid"] = uid
    pod["spec"]["nodeName"] = "gpu-node-1"
    pod["status"] = {"phase": "Running"}
    return pod


def objects(**extra: JsonDict) -> dict[tuple[str, str], JsonDict]:
    table = {
        # The namespace's shared copy of the trainer's sources, with a stand-in trainer.
        ("ConfigMap", TRAINER_SOURCES_NAME): {"data": {**TRAINER_SOURCES, contract.TRAINER_FILE: TRAIN_PY}},
    }
    for key, value in extra.items():
        kind, _, name = key.partition("__")
        table[(kind, name.replace("_", "-"))] = value
    return table


def settings() -> LocalSettings:
    return LocalSettings("/usr/bin/python3", "https://127.0.0.1:6443", None)


def test_remap_makes_paths_in_values_lists_and_flags_local(tmp_path: Path) -> None:
    mounts = [Mount("/code", tmp_path / "code"), Mount("/data", tmp_path / "data")]
    assert (
        remap("/code:/usr/lib/python3:/data/lib", mounts)
        == f"{tmp_path}/code:/usr/lib/python3:{tmp_path}/data/lib"
    )
    assert remap("--data=/data/train", mounts) == f"--data={tmp_path}/data/train"
    assert remap("--name=run", mounts) == "--name=run"
    assert remap("http://host:80/data", mounts) == "http://host:80/data"  # a URL is not a path list
    assert remap("a:b", mounts) == "a:b"


def test_each_volume_type_lands_where_it_is_shared_as_in_a_cluster(tmp_path: Path) -> None:
    template = {
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "wikitext"}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "cache", "hostPath": {"path": "/var/cache/datasets", "type": "DirectoryOrCreate"}},
                {"name": "socket", "hostPath": {"path": "/run/agent.sock", "type": "FileOrCreate"}},
                {"name": "shared", "nfs": {"server": "nfs.example", "path": "/exports/team"}},
                {"name": "fast", "csi": {"driver": "example.csi"}},
            ],
            "containers": [
                {
                    "name": "trainer",
                    "volumeMounts": [
                        {"name": "data", "mountPath": "/data", "readOnly": True},
                        {"name": "scratch", "mountPath": "/scratch"},
                        {"name": "cache", "mountPath": "/cache", "subPath": "wikitext"},
                        {"name": "shared", "mountPath": "/shared", "subPathExpr": "$(POD_NAME)"},
                        {"name": "fast", "mountPath": "/fast"},
                    ],
                }
            ],
        }
    }
    state = tmp_path / "state"
    volumes = TableVolumes(state, objects())
    first = volumes.prepare(worker(template, uid="uid-1"))
    second = volumes.prepare(worker(template, uid="uid-2"))
    assert first.dirs["data"] == second.dirs["data"] == state / "ml" / "claims" / "wikitext"
    assert first.dirs["scratch"] == state / "ml" / "pods" / "case-job-worker-0-uid-1" / "volumes" / "scratch"
    assert first.dirs["scratch"] != second.dirs["scratch"]  # an emptyDir is the pod's own
    assert first.dirs["cache"] == state / "hostpath" / "gpu-node-1" / "var" / "cache" / "datasets"
    assert (state / "hostpath" / "gpu-node-1" / "run" / "agent.sock").is_file()
    assert first.dirs["shared"] == state / "nfs" / "nfs.example" / "exports" / "team"
    assert first.notes == ["volume fast (csi) is an empty directory here"]
    trainer = next(c for c in worker(template)["spec"]["containers"] if c["name"] == "trainer")
    mounts, notes = first.mounts(trainer, {"POD_NAME": "case-job-worker-0"})
    by_path = {m.path: m.local for m in mounts}
    assert by_path["/cache"] == first.dirs["cache"] / "wikitext"
    assert by_path["/shared"] == first.dirs["shared"] / "case-job-worker-0"
    assert by_path[contract.CONFIG_MOUNT_PATH] == first.dirs["config"]
    assert contract.SHM_MOUNT_PATH not in by_path  # the host's /dev/shm serves
    assert all(local.is_dir() for local in by_path.values())
    assert notes == []


def test_configmap_secret_projected_and_downward_files_are_written_with_their_modes(tmp_path: Path) -> None:
    template = {
        "spec": {
            "volumes": [
                {
                    "name": "code",
                    "configMap": {
                        "name": "code",
                        "items": [{"key": "train.py", "path": "src/train.py", "mode": 0o500}],
                    },
                },
                {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400}},
                {
                    "name": "info",
                    "projected": {
                        "sources": [
                            {
                                "downwardAPI": {
                                    "items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]
                                }
                            },
                            {"configMap": {"name": "code", "items": [{"key": "blob", "path": "blob.bin"}]}},
                        ]
                    },
                },
                {"name": "maybe", "secret": {"secretName": "absent", "optional": True}},
            ]
        }
    }
    table = objects(
        ConfigMap__code={
            "data": {"train.py": "print(1)\n"},
            "binaryData": {"blob": base64.b64encode(b"\x00\x01").decode()},
        },
        Secret__creds={"data": {"token": base64.b64encode(b"s3cret").decode()}},
    )
    prepared = TableVolumes(tmp_path, table).prepare(worker(template))
    script = prepared.dirs["code"] / "src" / "train.py"
    assert script.read_text() == "print(1)\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o500
    assert not (prepared.dirs["code"] / "blob").exists()  # items choose the keys
    secret = prepared.dirs["creds"] / "token"
    assert (secret.read_text(), stat.S_IMODE(secret.stat().st_mode)) == ("s3cret", 0o400)
    assert (prepared.dirs["info"] / "name").read_text() == "case-job-worker-0"
    assert (prepared.dirs["info"] / "blob.bin").read_bytes() == b"\x00\x01"
    assert list(prepared.dirs["maybe"].iterdir()) == []
    assert stat.S_IMODE((prepared.dirs["config"] / contract.TRAINER_FILE).stat().st_mode) == 0o644
    # config.json from the pod's own annotation (a downward API projection), beside the trainer.
    config = json.loads((prepared.dirs["config"] / contract.CONFIG_FILE).read_text())
    assert config["name"] == "case-job"
    assert prepared.tokens == []  # the API server's ServiceAccount admission adds the token volume

    missing = {
        "spec": {
            "volumes": [{"name": "code", "configMap": {"name": "code", "items": [{"key": "x", "path": "x"}]}}]
        }
    }
    with pytest.raises(SkipPod, match="ConfigMap code of volume code has no key x"):
        TableVolumes(tmp_path, table).prepare(worker(missing))
    with pytest.raises(SkipPod, match="Secret gone of volume creds does not exist"):
        TableVolumes(tmp_path, objects()).prepare(
            worker({"spec": {"volumes": [{"name": "creds", "secret": {"secretName": "gone"}}]}})
        )


def sidecar_template() -> JsonDict:
    mounts = [{"name": "code", "mountPath": "/code"}]
    return {
        "spec": {
            "volumes": [{"name": "code", "configMap": {"name": "tools"}}],
            "initContainers": [
                {"name": "fetch", "image": "busybox", "command": ["sh", "-c", "wget data"]},
                {"name": "shipper", "image": "fluent/fluent-bit:3.1", "restartPolicy": "Always"},
                {
                    "name": "tailer",
                    "image": "python:3.12",
                    "restartPolicy": "Always",
                    "command": ["python", "-u", "tail.py", "--dir=/code"],
                    "workingDir": "/code",
                    "env": [{"name": "PYTHONPATH", "value": "/code"}],
                    "volumeMounts": mounts,
                },
            ],
            "containers": [{"name": "proxy", "image": "istio/proxyv2:1.22", "args": ["proxy", "sidecar"]}],
        }
    }


def test_python_scripts_of_the_pods_volumes_run_and_other_commands_get_a_stand_in(tmp_path: Path) -> None:
    volumes = TableVolumes(tmp_path, objects(ConfigMap__tools={"data": {"tail.py": "print('tail')\n"}}))
    launch = prepare(worker(sidecar_template()), volumes, settings(), {})
    by_name = {c.name: c for c in launch.containers}
    assert [(c.name, c.role) for c in launch.containers] == [
        ("fetch", Role.INIT),
        ("shipper", Role.SIDECAR),
        ("tailer", Role.SIDECAR),
        ("trainer", Role.MAIN),
        ("proxy", Role.MAIN),
    ]
    pod_dir = tmp_path / "ml" / "pods" / "case-job-worker-0-uid-1"
    trainer = by_name["trainer"]
    assert trainer.command == [
        "/usr/bin/python3",
        str(pod_dir / "volumes" / "config" / contract.TRAINER_FILE),
    ]
    assert (trainer.trainer, trainer.stand_in) == (True, False)
    assert trainer.env["MASTER_ADDR"] == "127.0.0.1"
    assert trainer.env["MASTER_PORT"] == str(launch.port)
    assert trainer.env["TRAININGJOB_PROGRESS_API_URL"] == "https://127.0.0.1:6443"

    code = pod_dir / "volumes" / "code"
    tailer = by_name["tailer"]
    assert tailer.command == ["/usr/bin/python3", "-u", str(code / "tail.py"), f"--dir={code}"]
    assert tailer.cwd == code
    assert tailer.env["PYTHONPATH"] == str(code)
    assert "MASTER_ADDR" not in tailer.env  # only the trainer gets the rendezvous and the progress API
    assert "TRAININGJOB_PROGRESS_API_URL" not in tailer.env

    for name, code_ in (("fetch", STAND_IN_DONE), ("shipper", STAND_IN_SLEEP), ("proxy", STAND_IN_SLEEP)):
        container = by_name[name]
        assert container.stand_in
        assert container.command[:3] == ["/usr/bin/python3", "-c", code_]
    assert "'proxy sidecar', which cannot run on this machine" in by_name["proxy"].command[3]
    assert by_name["proxy"].cwd == pod_dir / "home"


def test_a_trainer_that_cannot_run_here_leaves_the_pod_alone(tmp_path: Path) -> None:
    volumes = TableVolumes(tmp_path, objects())
    with pytest.raises(SkipPod, match=r"command 'sh -c python /code/train\.py': only `python SCRIPT`"):
        prepare(worker(command=["sh", "-c", "python /code/train.py"]), volumes, settings(), {})
    assert not (tmp_path / "ml").exists()  # refused before any volume was written
    with pytest.raises(SkipPod, match=r"command 'python /code/train\.py': only .* it is not a file"):
        prepare(worker(command=["python", "/code/train.py"]), volumes, settings(), {})
    with pytest.raises(SkipPod, match=r"command 'torchrun /code/train\.py': only .* it is not a file"):
        prepare(worker(command=["torchrun", "/code/train.py"]), volumes, settings(), {})
    own_code = {
        "spec": {
            "volumes": [{"name": "code", "configMap": {"name": "code"}}],
            "containers": [{"name": "trainer", "volumeMounts": [{"name": "code", "mountPath": "/code"}]}],
        }
    }
    runs = TableVolumes(tmp_path, objects(ConfigMap__code={"data": {"train.py": "print(2)\n"}}))
    launch = prepare(worker(own_code, command=["python", "/code/train.py"]), runs, settings(), {})
    assert launch.container("trainer").command[-1].endswith("/volumes/code/train.py")


def elastic_worker(index: int, uid: str) -> JsonDict:
    manifest = job(
        {"spec.numWorkers": 3, "spec.gpusPerWorker": 0, "spec.elastic": {"minWorkers": 2, "maxWorkers": 3}}
    )
    manifest["metadata"].update(namespace="ml", uid="job-uid", generation=1)
    pod = build_pod(parse(manifest), index, attempt=0, resume_from=None)
    pod["metadata"]["uid"] = uid
    pod["status"] = {"phase": "Running"}
    return pod


def test_an_elastic_trainer_runs_under_torchrun_with_its_rendezvous_on_the_loopback(tmp_path: Path) -> None:
    volumes = TableVolumes(tmp_path, objects())
    ports: dict[AttemptKey, AttemptPorts] = {}
    first = prepare(elastic_worker(0, "uid-0"), volumes, settings(), ports)
    second = prepare(elastic_worker(2, "uid-2"), volumes, settings(), ports)
    [attempt] = ports.values()
    trainer = first.container("trainer")
    config = tmp_path / "ml" / "pods" / "case-job-worker-0-uid-0" / "volumes" / "config"
    # `python -m torch.distributed.run /etc/trainingjob/train.py`, with the local script and torch.
    assert trainer.command == [
        "/usr/bin/python3",
        str(LOOPBACK_TORCHRUN),
        str(config / contract.TRAINER_FILE),
    ]
    assert (trainer.torchrun, trainer.stand_in) == (True, False)
    for launch in (first, second):
        env = launch.container("trainer").env
        assert env["PET_RDZV_ENDPOINT"] == f"127.0.0.1:{attempt.rendezvous}"
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", str(attempt.master))
        assert (env["PET_LOCAL_ADDR"], env["GLOO_SOCKET_IFNAME"]) == ("127.0.0.1", "lo")
        assert "TRAIN_SIMULATE" not in env  # real torch
        assert env["PET_NNODES"] == "2:3"
    assert first.container("trainer").env["PET_RDZV_CONF"].startswith("is_host=true,")
    assert second.container("trainer").env["PET_RDZV_CONF"].startswith("is_host=false,")
    assert attempt.master != attempt.rendezvous


def test_torchrun_options_stay_and_paths_in_volumes_are_made_local(tmp_path: Path) -> None:
    volumes = TableVolumes(tmp_path, objects())
    command = ["torchrun", "--nproc-per-node", "1", "/etc/trainingjob/train.py", "--out=/etc/trainingjob/x"]
    launch = prepare(worker(command=command), volumes, settings(), {})
    config = tmp_path / "ml" / "pods" / "case-job-worker-0-uid-1" / "volumes" / "config"
    assert launch.container("trainer").command == [
        "/usr/bin/python3",
        str(LOOPBACK_TORCHRUN),
        "--nproc-per-node",
        "1",
        str(config / contract.TRAINER_FILE),
        f"--out={config / 'x'}",
    ]
