"""The schema of TrainingJob.spec.mpi, and the rules of a job with framework mpi.

Why a part of its own: an MPI program is started differently from the other frameworks. One pod, the
launcher, runs the user's command (`mpirun ...`), which reaches the workers over SSH and starts the
processes there; the workers only serve SSH. That is Kubeflow's MPIJob (v2beta1), whose users move
their jobs here: numWorkers counts the workers, this block says how many processes each takes
(slotsPerWorker, the hostfile's `slots=`) and which MPI implementation the image has. The cross-field
rules (the framework, the launcher's command, slots against GPUs) are CEL on the spec, written here
next to the section they guard, so the API server refuses a job that cannot work, naming the field.

Semantics (docs/api.md's table of the roles, decided by controller/planner/roles.py): the launcher is
created once every worker is Ready (their SSH server answers), so mpirun never races the workers; the
launcher's success completes the job and stops the workers; a failure of the launcher or of a worker
restarts the gang under failurePolicy. Immutable, as the roles are (they make the hostfile).
"""

from __future__ import annotations

from crd.openapi import Rule, Schema, integer, obj, rule, string

# Why networking.backend mpi is named in the enum (it is torch.distributed's third backend) but refused.
MPI_REFUSAL = (
    "torch.distributed's mpi backend needs a torch built with MPI, which the PyPI wheels are not; to run "
    "an MPI program (mpirun, Horovod, DeepSpeed's MPI discovery) use framework mpi, whose launcher "
    "starts it on the workers, with gloo or nccl inside torch"
)
OPENMPI = "OpenMPI"
IMPLEMENTATIONS = (OPENMPI, "Intel", "MPICH")
DEFAULT_SSH_PORT = 2222
# What each MPI role's pods are, and what their end does to the job (docs/api.md, beside TensorFlow's).
ROLE_RULES = (
    (
        "launcher",
        "`<job>-launcher-0`",
        "none (no hostfile line); created only once every worker is Ready (its SSH server answers); "
        "runs spec.command",
        "completes the job (LauncherSucceeded); the workers are stopped, whatever cleanPodPolicy",
        "restarts the gang under failurePolicy; its log's last lines (mpirun's or ssh's error, naming the "
        "worker) are in the failure's message",
    ),
    (
        "worker (mpi)",
        "`<job>-worker-<i>`",
        "slotsPerWorker ranks each (its hostfile line's `slots=`), in hostfile order: worker 0 has rank 0, "
        "is MASTER_ADDR and the pod whose progress reports count",
        "nothing (its SSH server serves until the launcher ends)",
        "restarts the gang under failurePolicy (counted as a failure; a lost or evicted one as a disruption)",
    ),
)

_HYDRA_REASON = (
    "Intel MPI and MPICH start their processes through Hydra, whose hostfile and variables differ "
    "from OpenMPI's, and no image here proves them; use OpenMPI, or set the Hydra variables "
    "(docs/env.md) in spec.env of a job whose launcher runs mpiexec"
)


def mpi() -> Schema:
    return obj(
        "MPI settings (framework mpi only), as Kubeflow's MPIJob has them: numWorkers workers run an SSH "
        "server (started by the operator, on sshPort, with a key it generates per job into the Secret "
        "<job>-mpi-ssh), and one launcher pod, <job>-launcher-0, created once every worker is Ready, "
        "runs spec.command (mpirun ...) with the hostfile /etc/trainingjob-mpi/hostfile (a line per "
        "worker: <worker>.<job>-headless slots=<slotsPerWorker>). The launcher's success completes the "
        "job and stops the workers; a failure of either restarts the gang under failurePolicy. "
        "Immutable.",
        {
            "slotsPerWorker": integer(
                "MPI processes per worker (the hostfile's slots=). Unset: gpusPerWorker, or 1 without "
                "GPUs. With GPUs it must equal gpusPerWorker (one process per GPU).",
                minimum=1,
                maximum=256,
            ),
            "implementation": string(
                "The MPI implementation of the image: OpenMPI (Intel and MPICH are refused: their "
                "launcher, Hydra, reads another hostfile and other variables; docs/env.md says which).",
                max_length=8,
                enum=list(IMPLEMENTATIONS),
                default=OPENMPI,
                rules=[
                    rule(
                        f"self == '{OPENMPI}'",
                        message=f"mpi.implementation {OPENMPI} only: {_HYDRA_REASON}",
                    )
                ],
            ),
            "sshPort": integer(
                "The port of the workers' SSH server, which runs as the pod's user (a port above 1023 "
                "needs no privilege).",
                minimum=1024,
                maximum=65535,
                default=DEFAULT_SSH_PORT,
            ),
        },
    )


def mpi_rules() -> list[Rule]:
    """Spec-level rules of MPI jobs (each names the field it is about)."""
    is_mpi = "has(self.framework) && self.framework == 'mpi'"
    return [
        rule(
            f"!has(self.mpi) || ({is_mpi})",
            message="mpi needs framework mpi: it configures the launcher and the workers' SSH servers",
            field_path=".mpi",
        ),
        rule(
            f"!({is_mpi}) || (has(self.command) && size(self.command) > 0)",
            message=(
                "framework mpi needs command: the launcher runs it (mpirun ... with the program); the "
                "workers run the operator's SSH server"
            ),
            field_path=".command",
        ),
        rule(
            "!has(self.mpi) || !has(self.mpi.slotsPerWorker) || !has(self.gpusPerWorker) || "
            "self.gpusPerWorker == 0 || self.mpi.slotsPerWorker == self.gpusPerWorker",
            message="mpi.slotsPerWorker must equal gpusPerWorker: one MPI process per GPU of the worker",
            field_path=".mpi.slotsPerWorker",
        ),
    ]
