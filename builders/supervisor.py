"""The trainer container's command for a job restarted in place (spec.failurePolicy.restartStrategy
InPlace): the user's command run under the supervisor, which keeps the container alive across attempts.

Why: an in-place gang restart keeps every pod (its name, IP, node, volumes, pulled image) and restarts
only the training process; the pods' restartPolicy is Never, so the process that ends must not be the
container's. The supervisor (trainer/trainingjob_progress/supervise.py, in the trainer sources' mount
like the progress helper) runs the command as its child, reports the child's state on its pod's run
annotation and starts the next attempt's child when the operator orders it (status.inPlaceRestart).
Only the training cluster's containers are wrapped (not an evaluator's), and never where in-place
cannot work: an MPI job's launcher drives its workers over SSH, and an elastic job's torchrun restarts
its workers by its own rendezvous rules; those jobs recreate their pods (`unsupported` says why, and
the planner says it in an Event). Every other job's pods are what they were without the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from crd import contract
from crd.spec import Spec, TrainingJob

# Where the operator records that the job's image cannot run the supervisor (controller/planner/inplace.py).
UNAVAILABLE_FIELD: Final = "inPlaceUnavailable"
# The supervisor runs as a module with the mount first on its own path only (not in PYTHONPATH, which
# the child would inherit); runpy gives it the argv `-m` would: [its file, "--", command...].
BOOTSTRAP: Final = (
    "import runpy, sys; "
    f"sys.path.insert(0, {contract.CONFIG_MOUNT_PATH!r}); "
    f"runpy.run_module({contract.SUPERVISOR_MODULE!r}, run_name='__main__', alter_sys=True)"
)


def unsupported(spec: Spec) -> str | None:
    """Why a job that asks for in-place restarts has its pods recreated at every restart; None when it
    can restart in place."""
    if spec.mpi is not None:
        return "an MPI job's launcher drives its workers over SSH, so its restarts recreate the pods"
    if spec.elastic is not None:
        return (
            "an elastic job's torchrun restarts its workers by its own rendezvous rules, so its restarts "
            "recreate the pods"
        )
    if not spec.command:
        return "the trainer container has no spec.command for the supervisor to run"
    return None


def supervised(job: TrainingJob, slot: int) -> bool:
    """Whether the trainer container of the pod in `slot` runs under the supervisor: not once the
    operator found that the job's image cannot run it (status.inPlaceUnavailable)."""
    spec = job.spec
    return (
        spec.failure_policy.restart_strategy == "InPlace"
        and unsupported(spec) is None
        and not (job.manifest.get("status") or {}).get(UNAVAILABLE_FIELD)
        and slot in spec.replicas.training
    )


def runs_supervisor(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's trainer container was built to start under the supervisor (its annotation:
    the operator's pod cache keeps no spec)."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    return annotations.get(contract.SUPERVISED_ANNOTATION) == "true"


def supervised_command(command: tuple[str, ...]) -> list[str]:
    """`command` run by the supervisor (the container's args, if any, still follow it)."""
    return ["python3", "-c", BOOTSTRAP, "--", *command]
