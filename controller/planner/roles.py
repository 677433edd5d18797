"""What the end of each kind of pod means for the job: success per role, and the evaluator's failures.

A job's pods are its workers, and a TensorFlow job's chief, parameter servers and evaluator
(spec.tensorflow; crd/replicas.py). Kubeflow's TFJob gave those roles their meaning, which users rely
on, and docs/api.md's table of the roles (crd/schema_tensorflow.py ROLE_RULES) states it:

* with a chief, the chief's success completes the job; the pods still running are stopped whatever
  cleanPodPolicy says (parameter servers never exit by themselves, and workers of
  ParameterServerStrategy serve until they are told to stop);
* without one, successPolicy decides as for any job: every worker (AllWorkers) or worker 0 (RankZero),
  or in an elastic job worker 0, whose torchrun agent ends last;
* a failure of the chief, a worker or a parameter server breaks the training cluster: the gang
  restarts under failurePolicy (decide.py, as for any failure: they are among `Gang.failures`);
* an XGBoost job's master (Kubeflow's XGBoostJob; crd/schema_frameworks.py XGBOOST_ROLE_RULES) is as a
  chief: it runs the tracker and trains as rank 0, and its success completes the job (the workers end
  with it, and one that has not is stopped); a worker's success alone decides nothing;
* an MPI job's launcher (crd/schema_mpi.py ROLE_RULES) runs mpirun: its success completes the job and
  stops the workers, whose SSH servers serve until then; a worker's end decides nothing but a failure;
* the evaluator is not part of the training cluster: its failure (or loss) is recorded, as condition
  EvaluatorFailed and a Warning Event, and neither fails nor restarts the job; an evaluator still
  running when the job completes is stopped.

Pure functions of the typed spec, the gang and the status, so every rule is tested by calling them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controller.planner import conditions as cond
from controller.planner import podstate, texts
from controller.planner.failures import PodFailure
from controller.planner.gang import Gang
from crd.contract import Condition, ReplicaType
from crd.spec import Spec

JsonDict = dict[str, Any]


@dataclass(frozen=True)
class Completion:
    """The job completed because of how its pods ended: why, and the pods to stop now."""

    reason: str
    message: str
    stop: tuple[JsonDict, ...] = ()


def _succeeded(gang: Gang, slot: int) -> JsonDict | None:
    pod = gang.ranks.get(slot)
    return pod if pod is not None and podstate.worker_phase(pod) == "Succeeded" else None


def _launcher_completion(gang: Gang, slot: int) -> Completion | None:
    """An MPI job: mpirun's exit is the job's; the workers' SSH servers never end by themselves."""
    launcher = _succeeded(gang, slot)
    if launcher is None:
        return None
    message = f"launcher {launcher['metadata']['name']} succeeded"
    return Completion("LauncherSucceeded", message, tuple(gang.holding))


def completion(spec: Spec, gang: Gang) -> Completion | None:  # noqa: PLR0911 - a return per rule
    """Whether the pods' ends complete the job (the success policy's metric targets aside)."""
    replicas = spec.replicas
    if replicas.launcher_slot is not None:
        return _launcher_completion(gang, replicas.launcher_slot)
    if replicas.chief or replicas.master:
        # Slot 0 is the chief (TensorFlow) or the master (XGBoost): its success is the job's.
        leader = _succeeded(gang, 0)
        if leader is None:
            return None
        role = replicas.at(0).type
        reason = f"{str(role).capitalize()}Succeeded"
        return Completion(reason, f"{role} {leader['metadata']['name']} succeeded", tuple(gang.holding))
    rank0 = _succeeded(gang, 0)
    if spec.success_policy.mode == "RankZero" and rank0 is not None:
        # The other workers are stopped whatever cleanPodPolicy says (it keeps finished pods only).
        return Completion("RankZeroSucceeded", "rank 0 succeeded", tuple(gang.holding))
    if spec.elastic is not None and rank0 is not None:
        # torchrun's agents wait for each other before they exit: worker 0's agent ends after the whole
        # world finished. A replacement that did not make it into the last round never will.
        message = "worker 0 succeeded: the elastic world finished training"
        return Completion("AllWorkersSucceeded", message, tuple(gang.holding))
    workers = replicas.slots(ReplicaType.WORKER)
    if all(_succeeded(gang, slot) is not None for slot in workers):
        # What else still runs is not a worker (an evaluator): the job's end stops it.
        others = tuple(pod for pod in gang.holding if podstate.replica_type(pod) != ReplicaType.WORKER)
        return Completion("AllWorkersSucceeded", f"all {len(workers)} workers succeeded", others)
    return None


def expected(gang: Gang) -> list[int]:
    """The slots that should be running for the job to run: the training cluster's, and the evaluator
    while its pod exists and has not ended."""
    slots = list(gang.replicas.training)
    for slot in gang.replicas.slots(ReplicaType.EVALUATOR):
        pod = gang.ranks.get(slot)
        if pod is not None and podstate.worker_phase(pod) not in ("Succeeded", "Failed"):
            slots.append(slot)
    return sorted(slots)


def unrecorded_evaluator_failure(status: Mapping[str, Any], gang: Gang) -> PodFailure | None:
    """The evaluator's failure (or loss) that the status does not record yet: EvaluatorFailed says the
    last one it recorded, by its description."""
    recorded = cond.get(status.get("conditions"), Condition.EVALUATOR_FAILED)
    for failure in gang.evaluator_failures:
        said = texts.message(failure.describe())
        if recorded is None or recorded.get("status") != "True" or recorded.get("message") != said:
            return failure
    return None


def summary(gang: Gang) -> str | None:
    """status.roleSummary: running/expected pods per role of a job with TensorFlow roles, else None."""
    replicas = gang.replicas
    if not replicas.has_roles:
        return None
    parts = []
    for role in ReplicaType:
        slots = replicas.slots(role)
        if slots:
            running = sum(
                1 for slot in slots if slot in gang.ranks and podstate.phase(gang.ranks[slot]) == "Running"
            )
            parts.append(f"{role} {running}/{len(slots)}")
    return ", ".join(parts)
