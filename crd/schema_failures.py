"""The schema of spec.failurePolicy: which failures restart a job, how often, after what delay, and how a
gang restart restarts the workers (recreated, or in place).

Apart from crd/schema_spec.py because the section grew its own concern (restartStrategy and its
fallbacks) and that module holds the rest of the spec close to its size bar.
"""

from __future__ import annotations

from crd import contract
from crd.openapi import Schema, array, integer, number, obj, rule, string


def failure_policy() -> Schema:
    exit_code = {"type": "integer", "minimum": 0, "maximum": 255}
    return obj(
        "How failures restart the job. A restart always restarts every worker (gang restart).",
        {
            "restartPolicy": string(
                "Never: the first failure fails the job. OnFailure: every failure restarts the workers, up "
                "to backoffLimit. ExitCode: exit codes >= 128 (signals, OOM kill) restart, 1-127 fail the "
                "job, unless listed in retryableExitCodes or permanentExitCodes.",
                max_length=16,
                enum=["Never", "OnFailure", "ExitCode"],
                default="OnFailure",
            ),
            "backoffLimit": integer(
                "Restarts after worker failures before the job fails.", minimum=0, maximum=100, default=3
            ),
            "activeDeadlineSeconds": integer(
                "Maximum time the job may run, not counting time suspended; then it fails "
                "(DeadlineExceeded).",
                minimum=1,
            ),
            "retryableExitCodes": array(
                "With restartPolicy ExitCode: exit codes that restart the job.",
                exit_code,
                max_items=256,
                list_type="set",
            ),
            "permanentExitCodes": array(
                "With restartPolicy ExitCode: exit codes that fail the job.",
                exit_code,
                max_items=256,
                list_type="set",
            ),
            "restartBackoff": obj(
                "Delay before each restart: initialDelaySeconds * multiplier^(restarts so far), capped at "
                "maxDelaySeconds, with jitter.",
                {
                    "initialDelaySeconds": integer("Delay before the first restart.", minimum=0, default=10),
                    "maxDelaySeconds": integer("Longest delay.", minimum=0, default=360),
                    "multiplier": number("Growth factor per restart.", minimum=1, maximum=10, default=2),
                },
                default_empty=True,
                rules=[
                    rule(
                        "!has(self.maxDelaySeconds) || !has(self.initialDelaySeconds) || "
                        "self.maxDelaySeconds >= self.initialDelaySeconds",
                        message="restartBackoff.maxDelaySeconds must be at least initialDelaySeconds",
                        field_path=".maxDelaySeconds",
                    )
                ],
            ),
            "maxDisruptionRestarts": integer(
                "Restarts caused by preemption, eviction or node loss before the job fails; counted apart "
                "from backoffLimit.",
                minimum=0,
                default=20,
            ),
            "restartStrategy": string(
                "How a gang restart restarts the workers. Recreate (the default): every pod is deleted and "
                "created again. InPlace: the pods stay (names, IPs, nodes, volumes) and a supervisor in "
                "each trainer container restarts the training process for the next attempt; the operator "
                "recreates the pods instead when that cannot work (a pod lost, evicted or deleted, a "
                "supervisor that does not answer, a changed spec) and always for MPI and elastic jobs. "
                "status.lastRestartKind says which kind of restart happened.",
                max_length=16,
                enum=list(contract.RESTART_STRATEGIES),
                default="Recreate",
            ),
        },
        default_empty=True,
        rules=[
            rule(
                "!has(self.retryableExitCodes) || !has(self.permanentExitCodes) || "
                "!self.retryableExitCodes.exists(c, c in self.permanentExitCodes)",
                message=(
                    "failurePolicy: an exit code is listed in both retryableExitCodes and permanentExitCodes"
                ),
                field_path=".permanentExitCodes",
            ),
            rule(
                "(has(self.restartPolicy) && self.restartPolicy == 'ExitCode') || "
                "(!has(self.retryableExitCodes) && !has(self.permanentExitCodes))",
                message="failurePolicy: retryableExitCodes and permanentExitCodes need restartPolicy "
                "ExitCode",
                field_path=".restartPolicy",
            ),
        ],
    )
