"""An MPI job's objects and pod settings: the hostfile, the SSH server of the workers, the launcher.

Why: an MPI program is started by `mpirun` from one pod, the launcher, which logs into every worker
over SSH and starts the ranks there (Kubeflow's MPIJob). So the operator gives the job what that
needs, the way Kubeflow's MPI Operator v2 does, and nothing the image must know about:

* a Secret `<job>-mpi-ssh` with an SSH key made for the job (by the operator's shell: the builder
  takes the key material as input), which the launcher logs in with and the workers accept and serve
  as their host key. Owned by the job, so deleted with it;
* a ConfigMap `<job>-mpi` with the hostfile (a line per worker, `<worker>.<job>-headless slots=N`)
  and the two scripts below, mounted with the key at /etc/trainingjob-mpi;
* workers that run `worker.sh`: sshd as the pod's (non-root) user on mpi.sshPort, with the job's key,
  no passwords, and the worker's own environment for the sessions mpirun opens (SetEnv), so ranks see
  POD_NAME and the token of the pod they run in (progress reports from rank 0, on worker 0). A worker is
  Ready once its sshd accepts connections (a TCP readiness probe); the planner creates the launcher
  only then, so mpirun never races the SSH servers;
* a launcher that runs `launcher.sh <spec.command...>`: it writes an ssh_config with the key and
  without host-key questions, then execs the user's command, for which OpenMPI's variables
  (OMPI_MCA_*; builders/env.py) name the hostfile and that ssh_config.

Everything runs as the pod's user: sshd started by root would need capabilities (to change user and
chroot) that the pods drop; started by an ordinary user on a port above 1023 it needs none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from builders.meta import object_meta
from builders.names import pod_dns_name
from crd import contract
from crd.contract import ReplicaType
from crd.spec import TrainingJob

JsonDict = dict[str, Any]

HOSTFILE: Final = "hostfile"
WORKER_SCRIPT: Final = "worker.sh"
LAUNCHER_SCRIPT: Final = "launcher.sh"
KEY_FILE: Final = "key"
PUBLIC_KEY_FILE: Final = "key.pub"
AUTHORIZED_KEYS_FILE: Final = "authorized_keys"
SSH_DIR: Final = "ssh"
# Where the scripts copy the key (ssh and sshd refuse a key others may read, and a Secret's files are
# root's) and write their configurations: the pod's memory-backed /dev/shm, writable whatever the image.
PRIVATE_DIR: Final = f"{contract.SHM_MOUNT_PATH}/.trainingjob-mpi"
SSH_CONFIG: Final = f"{PRIVATE_DIR}/ssh_config"
HOSTFILE_PATH: Final = f"{contract.MPI_MOUNT_PATH}/{HOSTFILE}"
# Mode of the mounted files: readable by the pod's non-root user (the scripts copy the key to a
# private file before ssh or sshd reads it).
FILE_MODE: Final = 0o444
READINESS_PERIOD_SECONDS: Final = 2
# Variables of the container besides the spec's env that a session on a worker gets too: the image's
# PATH, the API server's address (the progress helper's).
SESSION_EXTRA_ENV: Final = ("PATH", "LD_LIBRARY_PATH", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")


@dataclass(frozen=True)
class SshKey:
    """A job's SSH key pair: the private key in OpenSSH's format and the public key's line."""

    private: str
    public: str


def config_name(job: TrainingJob) -> str:
    return f"{job.name}{contract.MPI_CONFIG_SUFFIX}"


def secret_name(job: TrainingJob) -> str:
    return f"{job.name}{contract.MPI_SSH_SUFFIX}"


def is_launcher(job: TrainingJob, slot: int) -> bool:
    return job.spec.replicas.at(slot).type == ReplicaType.LAUNCHER


def hostfile(job: TrainingJob) -> str:
    """OpenMPI's hostfile: each worker by its stable DNS name, with its slots; worker 0 first, where
    mpirun puts rank 0."""
    slots = job.spec.processes_per_pod
    workers = job.spec.replicas.slots(ReplicaType.WORKER)
    return "".join(f"{pod_dns_name(job, slot)} slots={slots}\n" for slot in workers)


_PREPARE = f"""set -eu
dir={PRIVATE_DIR}
mkdir -p "$dir"
chmod 700 "$dir"
cp {contract.MPI_MOUNT_PATH}/{SSH_DIR}/{KEY_FILE} "$dir/key"
chmod 600 "$dir/key"
if ! user=$(id -un 2>/dev/null); then
  echo "MPI: uid $(id -u) has no entry in the image's /etc/passwd; OpenSSH needs one (add a user)" >&2
  exit 1
fi
"""

WORKER_SCRIPT_TEXT: Final = f"""#!/bin/sh
# An MPI worker (written by trainingjob-operator): an SSH server for the launcher's mpirun, run as
# the pod's user on $TRAININGJOB_MPI_SSH_PORT with the job's key.
sshd=$(command -v sshd || echo /usr/sbin/sshd)
if [ ! -x "$sshd" ]; then
  echo "MPI: no sshd in the image (OpenSSH's server, e.g. Debian's openssh-server):" \\
    "the launcher's mpirun cannot reach this worker" >&2
  exit 127
fi
{_PREPARE}cp {contract.MPI_MOUNT_PATH}/{SSH_DIR}/{AUTHORIZED_KEYS_FILE} "$dir/authorized_keys"
chmod 600 "$dir/authorized_keys"
session=""
for name in $TRAININGJOB_MPI_SESSION_ENV; do
  eval "value=\\${{$name-}}"
  case "$value" in ''|*'"'*|*'\\'*) continue ;; esac
  session="$session \\"$name=$value\\""
done
cat > "$dir/sshd_config" <<EOF
Port $TRAININGJOB_MPI_SSH_PORT
HostKey $dir/key
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/sshd.pid
AllowUsers $user
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
EOF
if [ -n "$session" ]; then echo "SetEnv$session" >> "$dir/sshd_config"; fi
echo "MPI worker: sshd on port $TRAININGJOB_MPI_SSH_PORT as $user"
exec "$sshd" -D -e -f "$dir/sshd_config"
"""

LAUNCHER_SCRIPT_TEXT: Final = f"""#!/bin/sh
# An MPI launcher (written by trainingjob-operator): ssh settings for mpirun, then the job's command.
{_PREPARE}cat > {SSH_CONFIG} <<EOF
Host *
  Port $TRAININGJOB_MPI_SSH_PORT
  User $user
  IdentityFile $dir/key
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
  ConnectTimeout 10
  ConnectionAttempts 3
EOF
exec "$@"
"""


def build_config_map(job: TrainingJob) -> JsonDict:
    """`<job>-mpi`: the hostfile and the workers' and the launcher's scripts."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(job, config_name(job)),
        "data": {
            HOSTFILE: hostfile(job),
            WORKER_SCRIPT: WORKER_SCRIPT_TEXT,
            LAUNCHER_SCRIPT: LAUNCHER_SCRIPT_TEXT,
        },
    }


def build_secret(job: TrainingJob, key: SshKey) -> JsonDict:
    """`<job>-mpi-ssh`: the job's key pair; the public key is also the workers' authorized_keys."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(job, secret_name(job)),
        "type": "Opaque",
        "stringData": {
            KEY_FILE: key.private,
            PUBLIC_KEY_FILE: key.public,
            AUTHORIZED_KEYS_FILE: key.public,
        },
    }


def volume(job: TrainingJob) -> JsonDict:
    """The hostfile, the scripts and the key, in one read-only volume."""
    secret_items = [
        {"key": KEY_FILE, "path": f"{SSH_DIR}/{KEY_FILE}"},
        {"key": AUTHORIZED_KEYS_FILE, "path": f"{SSH_DIR}/{AUTHORIZED_KEYS_FILE}"},
    ]
    return {
        "name": contract.MPI_VOLUME,
        "projected": {
            "defaultMode": FILE_MODE,
            "sources": [
                {"configMap": {"name": config_name(job)}},
                {"secret": {"name": secret_name(job), "items": secret_items}},
            ],
        },
    }


def mount() -> JsonDict:
    return {"name": contract.MPI_VOLUME, "mountPath": contract.MPI_MOUNT_PATH, "readOnly": True}


def session_env_names(env: list[JsonDict]) -> str:
    """The variables a worker's SSH sessions get (the container's, by name)."""
    names = [str(entry["name"]) for entry in env if entry["name"] != "TRAININGJOB_MPI_SESSION_ENV"]
    return " ".join(dict.fromkeys([*names, *SESSION_EXTRA_ENV]))


def with_mpi(job: TrainingJob, slot: int, pod: JsonDict) -> JsonDict:
    """`pod` (the operator's, before the template's merge; changed in place) as an MPI launcher or
    worker: its command, the volume, and for a worker the SSH port, its readiness and the sessions'
    environment."""
    spec = pod["spec"]
    trainer = next(c for c in spec["containers"] if c["name"] == contract.CONTAINER_NAME)
    spec["volumes"].append(volume(job))
    trainer["volumeMounts"].append(mount())
    script = f"{contract.MPI_MOUNT_PATH}/"
    if is_launcher(job, slot):
        trainer["command"] = ["sh", script + LAUNCHER_SCRIPT, *job.spec.command]
        return pod
    trainer["command"] = ["sh", script + WORKER_SCRIPT]
    trainer.pop("args", None)
    if job.spec.mpi is None:
        raise ValueError(f"{job.name} is not an MPI job")
    port = job.spec.mpi.ssh_port
    trainer["ports"].append({"name": contract.SSH_PORT_NAME, "containerPort": port, "protocol": "TCP"})
    trainer["readinessProbe"] = {
        "tcpSocket": {"port": contract.SSH_PORT_NAME},
        "periodSeconds": READINESS_PERIOD_SECONDS,
        "failureThreshold": 1,
    }
    trainer["env"].append({"name": "TRAININGJOB_MPI_SESSION_ENV", "value": session_env_names(trainer["env"])})
    return pod
