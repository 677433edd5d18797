"""Admission cases of MPI jobs (framework mpi, spec.mpi): the launcher's command, MPI fields on another
framework, slots against GPUs, the implementations refused, the SSH port's bounds, and their
immutability (the layers are explained in tests/unit/crd_cases.py)."""

from __future__ import annotations

from typing import Any

from tests.unit.crd_case_model import DELETE, InvalidCase, case, job, transition

COMMAND = ["mpirun", "python3", "/etc/program/train.py"]
MPI = {"spec.framework": "mpi", "spec.gpusPerWorker": 0, "spec.command": COMMAND}
# A sidecar that reads the hostfile: the operator's volume `mpi` exists in MPI jobs only.
MOUNTS_MPI = {
    "spec": {
        "containers": [
            {"name": "side", "image": "busybox:1.36", "volumeMounts": [{"name": "mpi", "mountPath": "/mpi"}]}
        ]
    }
}


def mpi_job(changes: dict[str, Any] | None = None) -> dict[str, Any]:
    return job({**MPI, **(changes or {})})


def mpi_invalid_cases() -> list[InvalidCase]:
    return [
        case("mpi-without-command", {**MPI, "spec.command": DELETE}, "spec.command", "cel"),
        case("mpi-empty-command", {**MPI, "spec.command": []}, "spec.command", "cel"),
        case("mpi-block-pytorch", {"spec.mpi": {"slotsPerWorker": 2}}, "spec.mpi", "cel"),
        case(
            "mpi-block-tensorflow",
            {"spec.framework": "tensorflow", "spec.mpi": {"sshPort": 2222}},
            "spec.mpi",
            "cel",
        ),
        case(
            "mpi-slots-not-gpus",
            {**MPI, "spec.gpusPerWorker": 2, "spec.mpi": {"slotsPerWorker": 4}},
            "spec.mpi.slotsPerWorker",
            "cel",
        ),
        case(
            "mpi-slots-zero", {**MPI, "spec.mpi": {"slotsPerWorker": 0}}, "spec.mpi.slotsPerWorker", "schema"
        ),
        case(
            "mpi-slots-above-256",
            {**MPI, "spec.mpi": {"slotsPerWorker": 257}},
            "spec.mpi.slotsPerWorker",
            "schema",
        ),
        case("mpi-intel", {**MPI, "spec.mpi": {"implementation": "Intel"}}, "spec.mpi.implementation", "cel"),
        case("mpi-mpich", {**MPI, "spec.mpi": {"implementation": "MPICH"}}, "spec.mpi.implementation", "cel"),
        case(
            "mpi-unknown-implementation",
            {**MPI, "spec.mpi": {"implementation": "MVAPICH"}},
            "spec.mpi.implementation",
            "schema",
        ),
        case("mpi-privileged-port", {**MPI, "spec.mpi": {"sshPort": 22}}, "spec.mpi.sshPort", "schema"),
        case("mpi-workers-zero", {**MPI, "spec.numWorkers": 0}, "spec.numWorkers", "schema"),
        case("mpi-workers-above-100", {**MPI, "spec.numWorkers": 101}, "spec.numWorkers", "schema"),
        case("mpi-tensorflow-roles", {**MPI, "spec.tensorflow": {"chief": 1}}, "spec.tensorflow", "cel"),
        case(
            "mpi-elastic", {**MPI, "spec.elastic": {"minWorkers": 1, "maxWorkers": 2}}, "spec.elastic", "cel"
        ),
        case("mpi-unknown-field", {**MPI, "spec.mpi": {"slots": 2}}, "spec.mpi.slots", "unknown-field"),
        case(
            "mpi-volume-mounted-by-pytorch",
            {"spec.podTemplate": MOUNTS_MPI},
            "spec.podTemplate.spec.containers",
            "cel",
        ),
        transition(
            "mpi-slots-changed",
            {**MPI, "spec.mpi": {"slotsPerWorker": 2}},
            {**MPI, "spec.mpi": {"slotsPerWorker": 4}},
            "spec.mpi",
        ),
    ]


def mpi_valid_manifests() -> dict[str, dict[str, Any]]:
    return {
        "mpi-defaults": mpi_job(),
        "mpi-cpu-slots": mpi_job({"spec.mpi": {"slotsPerWorker": 4, "sshPort": 2022}}),
        "mpi-gpus-slots": mpi_job({"spec.gpusPerWorker": 8, "spec.mpi": {"slotsPerWorker": 8}}),
        "mpi-gpus-default-slots": mpi_job({"spec.gpusPerWorker": 2}),
        "mpi-volume-mounted-by-a-sidecar": mpi_job({"spec.podTemplate": MOUNTS_MPI}),
    }
