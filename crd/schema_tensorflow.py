"""The schema of TrainingJob.spec.tensorflow: TensorFlow's replica roles besides the workers.

Why a part of its own: TensorFlow's distribution strategies give a job's processes roles that Kubeflow's
TFJob users rely on: a chief (ParameterServerStrategy's coordinator, or MultiWorkerMirroredStrategy's
task that checkpoints and reports), parameter servers that hold the variables, and a side-car
evaluator. numWorkers stays the number of workers; this block adds the other roles' counts. Which
combinations can work is a matter of the framework and of the other fields, so the cross-field rules
(the framework, a chief for parameter servers) are CEL on the spec, written here next to the section
they guard, and the API server refuses a job that cannot work, naming the field.

Semantics, after Kubeflow's TFJob (docs/api.md states them; controller/planner/roles.py decides them):
with a chief, the chief's success completes the job; without one, successPolicy does as for any job.
A worker's, a parameter server's or the chief's failure restarts the gang under failurePolicy; the
evaluator's does not (it is recorded). The role counts are immutable: they make TF_CONFIG's cluster.
"""

from __future__ import annotations

from crd import contract
from crd.openapi import Rule, Schema, integer, obj, rule

# What each role's pods are, and what their end does to the job: docs/api.md's table of the roles,
# decided by controller/planner/roles.py. Columns: role, pod names, in TF_CONFIG's cluster, its success,
# its failure (or loss to a disruption).
ROLE_RULES = (
    (
        "chief",
        "`<job>-chief-0`",
        "yes; slot 0: MASTER_ADDR names it, its progress reports count",
        "completes the job (ChiefSucceeded); the pods still running are stopped, whatever cleanPodPolicy",
        "restarts the gang under failurePolicy",
    ),
    (
        "worker",
        "`<job>-worker-<i>`",
        "yes",
        "without a chief, successPolicy: every worker (AllWorkers) or worker 0 (RankZero); with a chief, "
        "nothing",
        "restarts the gang under failurePolicy",
    ),
    (
        "ps",
        "`<job>-ps-<i>`",
        "yes",
        "nothing: parameter servers serve until the job ends, which stops them",
        "restarts the gang under failurePolicy",
    ),
    (
        "evaluator",
        "`<job>-evaluator-0`",
        "no (its task is evaluator 0)",
        "nothing; one still running when the job completes is stopped",
        "recorded (condition EvaluatorFailed, a Warning Event EvaluatorFailed); neither fails nor restarts "
        "the job; not replaced before the next gang attempt",
    ),
)

_PS_REASON = (
    "ParameterServerStrategy runs the training loop on a coordinator, the chief, which dispatches the "
    "steps to the workers and keeps the variables on the parameter servers"
)


def tensorflow() -> Schema:
    return obj(
        "TensorFlow's replica roles besides the workers (framework tensorflow only), as Kubeflow's TFJob "
        "has them: numWorkers is the number of workers, this block adds a chief, parameter servers and "
        "an evaluator. Each role's pods are named <job>-<role>-<index> and get TF_CONFIG with the "
        "cluster of chief, workers and parameter servers (stable DNS names through <job>-headless) and "
        "their own task. With a chief, the chief's success completes the job and stops the pods still "
        "running (parameter servers never exit by themselves); without one, successPolicy decides as "
        "for any job. A failure of the chief, a worker or a parameter server restarts the whole gang "
        "under failurePolicy; the evaluator's does not. Immutable.",
        {
            "chief": integer(
                "Chief replicas, 0 or 1: the coordinator of ParameterServerStrategy, or the task of "
                "MultiWorkerMirroredStrategy that saves checkpoints. It is rank 0: MASTER_ADDR names it, "
                "its progress reports count, and its success completes the job.",
                minimum=0,
                maximum=1,
                default=0,
            ),
            "ps": integer(
                "Parameter servers (ParameterServerStrategy), named <job>-ps-<i>. They serve until the "
                "job ends, which stops them. Need a chief.",
                minimum=0,
                maximum=contract.MAX_WORKERS,
                default=0,
            ),
            "evaluator": integer(
                "Evaluator replicas, 0 or 1: a side-car that evaluates the checkpoints the training "
                "writes. Not part of TF_CONFIG's cluster (its task is evaluator 0). Its failure neither "
                "fails nor restarts the job: condition EvaluatorFailed and a Warning Event record it, "
                "and the next gang attempt starts a new one.",
                minimum=0,
                maximum=1,
                default=0,
            ),
        },
        rules=[
            rule(
                "!has(self.ps) || self.ps == 0 || (has(self.chief) && self.chief == 1)",
                message=f"tensorflow.ps needs tensorflow.chief 1: {_PS_REASON}",
                field_path=".ps",
            )
        ],
    )


def tensorflow_rules() -> list[Rule]:
    """Spec-level rules of the TensorFlow roles (each names the field it is about)."""
    return [
        rule(
            "!has(self.tensorflow) || (has(self.framework) && self.framework == 'tensorflow')",
            message=(
                "tensorflow (chief, ps, evaluator) needs framework tensorflow: these replica roles are "
                "TensorFlow's tasks in TF_CONFIG"
            ),
            field_path=".tensorflow",
        ),
    ]
