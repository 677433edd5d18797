"""The rules of spec.framework for XGBoost, PaddlePaddle and the retired frameworks.

Why a part of its own: a framework is one word in the spec, but what it admits differs. An XGBoost job
is Kubeflow's XGBoostJob: a master (slot 0, rank 0) that runs the tracker, and numWorkers workers that
join it, one process per pod; a PaddlePaddle job is Kubeflow's PaddleJob in collective mode: workers
only, started by `python -m paddle.distributed.launch`. A framework retired upstream is named in the
enum so that its users get a one-line reason and what to use instead instead of "unsupported value".
These are CEL on the spec, next to the roles' table docs/api.md prints (crd/render.py), and
controller/planner/roles.py decides what each role's end does to the job.
"""

from __future__ import annotations

from crd import contract
from crd.openapi import Rule, rule

# What each role's pods are, and what their end does to the job: docs/api.md's tables of the roles,
# decided by controller/planner/roles.py. Columns: role, pod names, rank, its success, its failure.
XGBOOST_ROLE_RULES = (
    (
        "master",
        "`<job>-master-0`",
        "0: runs the tracker (RabitTracker) on MASTER_PORT, trains as rank 0, its progress reports count",
        "completes the job (MasterSucceeded); the pods still running are stopped, whatever cleanPodPolicy",
        "restarts the gang under failurePolicy",
    ),
    (
        "worker",
        "`<job>-worker-<i>`",
        "i + 1: joins the tracker at MASTER_ADDR:MASTER_PORT",
        "nothing: the master's success completes the job",
        "restarts the gang under failurePolicy",
    ),
)
PADDLE_ROLE_RULES = (
    (
        "worker",
        "`<job>-worker-<i>`",
        "i (PADDLE_RANK); worker 0 hosts paddle.distributed.launch's store at PADDLE_MASTER",
        "successPolicy: every worker (AllWorkers) or worker 0 (RankZero)",
        "restarts the gang under failurePolicy",
    ),
)

_XGBOOST_ONE_PROCESS = (
    "an xgboost job runs one process per pod, which trains on at most one GPU (device=cuda); give "
    "more pods instead"
)


def retired_framework_rules() -> list[Rule]:
    """The framework field's rules: each retired framework refused with its reason."""
    return [
        rule(f"self != '{name}'", message=f"framework {name} is not supported: {reason}")
        for name, reason in contract.RETIRED_FRAMEWORKS.items()
    ]


def framework_rules() -> list[Rule]:
    """Spec-level rules of the XGBoost and PaddlePaddle jobs (each names the field it is about)."""
    xgboost = "has(self.framework) && self.framework == 'xgboost'"
    return [
        rule(
            f"!({xgboost}) || self.numWorkers < {contract.MAX_WORKERS}",
            message=(
                f"numWorkers of an xgboost job must be at most {contract.MAX_WORKERS - 1}: with its master "
                f"the job has at most {contract.MAX_WORKERS} pods"
            ),
            field_path=".numWorkers",
        ),
        rule(
            f"!({xgboost}) || !has(self.gpusPerWorker) || self.gpusPerWorker <= 1",
            message=f"gpusPerWorker must be 0 or 1 with framework xgboost: {_XGBOOST_ONE_PROCESS}",
            field_path=".gpusPerWorker",
        ),
    ]
