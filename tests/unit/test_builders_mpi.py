"""builders/mpi.py and the MPI parts of the pod, env and PodGroup builders: what an MPI job's launcher
and workers run with (docs/env.md), and the key the reconciler makes for its Secret."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from builders import mpi
from builders.env import distributed_env
from builders.podgroup import build_pod_group
from builders.pods import build_pod
from builders.workload import pod_set
from controller.runtime.sshkeys import new_ssh_key
from crd.spec import TrainingJob, parse
from tests.unit.lifecycle_world import make_job

MPI = {
    "spec.framework": "mpi",
    "spec.gpusPerWorker": 0,
    "spec.command": ["mpirun", "-n", "4", "python3", "train.py"],
    "spec.args": ["--epochs", "2"],
    "spec.mpi": {"slotsPerWorker": 2},
}
WORKER0, WORKER1, LAUNCHER = range(3)


def mpi_job(changes: dict[str, Any] | None = None) -> TrainingJob:
    return parse(make_job({**MPI, **(changes or {})}))


def trainer(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["spec"]["containers"][0]
    return container


def env_values(pod: dict[str, Any]) -> dict[str, str]:
    return {entry["name"]: entry.get("value", "") for entry in trainer(pod)["env"]}


def test_the_launcher_runs_the_command_through_its_script_without_a_hostname() -> None:
    job = mpi_job()
    pod = build_pod(job, LAUNCHER, attempt=0, resume_from=None)
    assert pod["metadata"]["name"] == "mnist-launcher-0"
    assert "hostname" not in pod["spec"]
    container = trainer(pod)
    assert container["command"] == [
        "sh",
        "/etc/trainingjob-mpi/launcher.sh",
        "mpirun",
        "-n",
        "4",
        "python3",
        "train.py",
    ]
    assert container["args"] == ["--epochs", "2"]
    assert "readinessProbe" not in container
    assert pod["metadata"]["labels"]["ml.example.com/replica-type"] == "launcher"


def test_workers_serve_ssh_and_are_ready_when_it_answers() -> None:
    job = mpi_job({"spec.mpi": {"slotsPerWorker": 2, "sshPort": 2022}})
    pod = build_pod(job, WORKER1, attempt=0, resume_from=None)
    assert pod["spec"]["hostname"] == "mnist-worker-1"
    assert pod["spec"]["subdomain"] == "mnist-headless"
    container = trainer(pod)
    assert container["command"] == ["sh", "/etc/trainingjob-mpi/worker.sh"]
    assert "args" not in container
    assert {"name": "ssh", "containerPort": 2022, "protocol": "TCP"} in container["ports"]
    assert container["readinessProbe"]["tcpSocket"] == {"port": "ssh"}
    session = env_values(pod)["TRAININGJOB_MPI_SESSION_ENV"].split()
    assert {"POD_NAME", "TRAININGJOB_NAMESPACE", "MASTER_ADDR", "PATH", "KUBERNETES_SERVICE_HOST"} <= set(
        session
    )


@pytest.mark.parametrize("slot", [WORKER0, LAUNCHER])
def test_every_mpi_pod_runs_as_an_ordinary_user_with_the_key_and_hostfile(slot: int) -> None:
    pod = build_pod(mpi_job(), slot, attempt=0, resume_from=None)
    context = trainer(pod)["securityContext"]
    assert (context["runAsNonRoot"], context["runAsUser"]) == (True, 1000)
    assert context["capabilities"] == {"drop": ["ALL"]}
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "mpi"]
    sources = volume["projected"]["sources"]
    assert sources[0] == {"configMap": {"name": "mnist-mpi"}}
    assert sources[1]["secret"]["name"] == "mnist-mpi-ssh"
    assert {"name": "mpi", "mountPath": "/etc/trainingjob-mpi", "readOnly": True} in trainer(pod)[
        "volumeMounts"
    ]


def test_a_template_user_wins() -> None:
    template = {"spec": {"securityContext": {"runAsUser": 2000}}}
    pod = build_pod(mpi_job({"spec.podTemplate": template}), WORKER0, attempt=0, resume_from=None)
    assert "runAsUser" not in trainer(pod)["securityContext"]
    assert pod["spec"]["securityContext"]["runAsUser"] == 2000


def test_the_environment_names_the_hostfile_and_ssh_and_counts_slots() -> None:
    job = mpi_job()
    env = {entry["name"]: entry.get("value") for entry in distributed_env(job, LAUNCHER)}
    assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/trainingjob-mpi/hostfile"
    assert env["OMPI_MCA_plm_rsh_agent"] == "ssh"
    assert env["OMPI_MCA_plm_rsh_args"] == "-F /dev/shm/.trainingjob-mpi/ssh_config"
    assert env["OMPI_MCA_btl_vader_single_copy_mechanism"] == "none"
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["TRAININGJOB_MPI_SLOTS"]) == ("4", "2", "2")
    assert env["MASTER_ADDR"] == "mnist-master"  # worker 0, where mpirun puts rank 0
    assert "RANK" not in env  # each rank's is OpenMPI's OMPI_COMM_WORLD_RANK


def test_slots_default_to_the_gpus_or_one() -> None:
    assert mpi_job({"spec.mpi": None}).spec.processes_per_pod == 1
    gpus = mpi_job({"spec.gpusPerWorker": 4, "spec.mpi": None})
    assert (gpus.spec.processes_per_pod, gpus.spec.world_size) == (4, 8)


def test_the_user_may_tune_openmpi() -> None:
    job = mpi_job({"spec.env": [{"name": "OMPI_MCA_plm_rsh_args", "value": "-F /my/ssh_config"}]})
    env = {entry["name"]: entry.get("value") for entry in distributed_env(job, LAUNCHER)}
    assert env["OMPI_MCA_plm_rsh_args"] == "-F /my/ssh_config"


def test_the_hostfile_lists_the_workers_with_their_slots() -> None:
    job = mpi_job({"spec.numWorkers": 3, "spec.mpi": {"slotsPerWorker": 4}})
    config = mpi.build_config_map(job)
    assert config["metadata"]["name"] == "mnist-mpi"
    assert config["data"]["hostfile"] == "".join(
        f"mnist-worker-{i}.mnist-headless slots=4\n" for i in range(3)
    )


@pytest.mark.parametrize("script", [mpi.WORKER_SCRIPT_TEXT, mpi.LAUNCHER_SCRIPT_TEXT])
def test_the_scripts_are_valid_shell(script: str, tmp_path: Path) -> None:
    path = tmp_path / "script.sh"
    path.write_text(script)
    assert subprocess.run(["sh", "-n", str(path)], check=False).returncode == 0


def test_the_gang_counts_the_launcher_in_kueue_but_not_in_the_pod_groups_minimum() -> None:
    job = mpi_job()
    assert pod_set(job)["count"] == 3
    # The launcher waits for Ready workers: a group that needs it would never place them.
    assert build_pod_group(job, "coscheduling")["spec"]["minMember"] == 2


def test_the_key_is_an_openssh_ed25519_pair(tmp_path: Path) -> None:
    key = new_ssh_key("job-mpi")
    assert key.private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert key.public.startswith("ssh-ed25519 ")
    assert key.public.endswith(" job-mpi\n")
    assert new_ssh_key().private != key.private
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        return
    private = tmp_path / "key"
    private.write_text(key.private)
    private.chmod(0o600)
    derived = subprocess.run([keygen, "-y", "-f", str(private)], capture_output=True, text=True, check=True)
    assert derived.stdout.split()[:2] == key.public.split()[:2]


def test_the_secret_holds_the_pair_and_is_the_jobs() -> None:
    secret = mpi.build_secret(mpi_job(), mpi.SshKey(private="PRIVATE", public="PUBLIC\n"))
    assert secret["metadata"]["name"] == "mnist-mpi-ssh"
    assert secret["stringData"] == {"key": "PRIVATE", "key.pub": "PUBLIC\n", "authorized_keys": "PUBLIC\n"}
    assert secret["metadata"]["ownerReferences"][0]["controller"] is True
