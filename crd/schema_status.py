"""The OpenAPI schema of TrainingJob.status: what users read, and what the controller persists.

The controller is crash-only and may be replaced by a standby at any moment, so everything its
lifecycle decisions depend on over time lives here rather than in memory: when the next gang start
is allowed (restart backoff), how much deadline time was used before the current run (deadlines stop
while suspended), which attempt is running, the best metric seen (early stopping) and when progress
was last reported (stall detection). The schema is fully structural (every field declared; the API
server does not accept `x-kubernetes-preserve-unknown-fields: false`, undeclared fields are pruned):
a field the controller writes must be added here first.
"""

from __future__ import annotations

from crd import contract
from crd.contract import Condition, State
from crd.openapi import Schema, array, integer, map_of, number, obj, string, string_map

STATES = tuple(str(state) for state in State)
MESSAGE_LENGTH = 32768
REASON_LENGTH = 1024
URL_LENGTH = 2048


def _timestamp(description: str) -> Schema:
    return string(description, max_length=64, fmt="date-time")


def _count(description: str) -> Schema:
    return integer(description, minimum=0)


def condition() -> Schema:
    return obj(
        "An observation of one aspect of the job (Kubernetes condition conventions).",
        {
            "type": string(
                f"Condition type: {', '.join(Condition)}.",
                max_length=316,
            ),
            "status": string("Whether the condition holds.", max_length=8, enum=["True", "False", "Unknown"]),
            "reason": string(
                "Machine-readable CamelCase reason of the last transition.", max_length=REASON_LENGTH
            ),
            "message": string(
                "Human-readable details, naming what blocks the job.", max_length=MESSAGE_LENGTH
            ),
            "lastTransitionTime": _timestamp("When status last changed."),
            "observedGeneration": _count("metadata.generation the condition was computed from."),
        },
        required=["type", "status"],
    )


def queue() -> Schema:
    return obj(
        "Kueue queueing of a job labelled kueue.x-k8s.io/queue-name (docs/shared-clusters.md).",
        {
            "name": string(
                "The LocalQueue the job waits in (its kueue.x-k8s.io/queue-name label).", max_length=253
            ),
            "workload": string("The Workload that stands for the job in Kueue.", max_length=253),
            "clusterQueue": string(
                "The ClusterQueue that admitted the current run; unset while the job waits.", max_length=253
            ),
            "flavors": string_map(
                "The ResourceFlavor Kueue assigned to each resource of the current run.",
                max_properties=64,
                value_max_length=253,
            ),
            "admissions": _count("Times Kueue admitted the job."),
            "evictions": _count(
                "Times Kueue took the admission back (preemption, deactivation, a queue stopped) or the "
                "Workload was deleted while the job ran; not counted as restarts."
            ),
        },
    )


def pod_counts(description: str) -> Schema:
    return obj(
        description,
        {
            "pending": _count("Pods not yet running."),
            "active": _count("Pods running."),
            "succeeded": _count("Pods that exited 0."),
            "failed": _count("Pods that failed."),
        },
    )


def roles() -> Schema:
    return obj(
        "The pods of the current attempt by role and phase, for a job with roles besides its workers "
        "(spec.tensorflow's, an xgboost job's master).",
        {
            role: pod_counts(f"The {role} pods by phase.")
            for role in ("chief", "master", "worker", "ps", "evaluator")
        },
    )


def status() -> Schema:
    return obj(
        "Observed state of the training job, written by the operator.",
        {
            "state": string("Lifecycle state.", max_length=16, enum=list(STATES)),
            "message": string("Why the job is in its state, in one sentence.", max_length=MESSAGE_LENGTH),
            "conditions": array(
                "Standard conditions, one per type.",
                condition(),
                max_items=32,
                list_type="map",
                map_keys=["type"],
            ),
            "observedGeneration": _count("metadata.generation the status was computed from."),
            "progress": string('Training progress as a percentage, e.g. "45%".', max_length=8),
            "currentEpoch": _count("Epoch the trainer last reported."),
            "totalEpochs": _count("Epochs planned (spec.hyperparameters.epochs)."),
            "step": _count("Global step the trainer last reported."),
            "metrics": map_of(
                "Latest metrics reported by rank 0, e.g. loss and accuracy.",
                {"type": "number"},
                max_properties=64,
            ),
            "bestMetric": obj(
                "Best value of successPolicy.metric so far (early stopping).",
                {
                    "value": number("The best value."),
                    "epoch": _count("Epoch it was reported in."),
                },
            ),
            "lastProgressTime": _timestamp("When the trainer last reported progress (stall detection)."),
            "workers": pod_counts(
                "Pods of the current attempt by phase (every role's, for a job with TensorFlow roles)."
            ),
            "roles": roles(),
            "roleSummary": string(
                "Running pods per role of a job with TensorFlow roles, running/expected, e.g. "
                '"chief 1/1, worker 2/2, ps 1/1" (the Roles column of kubectl get -o wide).',
                max_length=128,
            ),
            "checkpoint": obj(
                "Checkpoints reported by the trainer.",
                {
                    "latest": string(
                        "Path or URL of the latest checkpoint; restarts resume from it.", max_length=1024
                    ),
                    "count": _count("Checkpoints written so far."),
                    "time": _timestamp("When the latest checkpoint was written."),
                    "interrupted": string(
                        "Set when rank 0's trainer was killed at the end of its pod's grace period "
                        "(terminationGracePeriodSeconds) after the pod's deletion began, without having "
                        "reported a checkpoint since: a checkpoint it was saving on SIGTERM was not "
                        "reported, and the job resumes from latest. Cleared when a newer checkpoint is "
                        "reported.",
                        max_length=REASON_LENGTH,
                    ),
                },
            ),
            "tracking": obj(
                "The experiment-tracking run rank 0 reported (spec.monitoring): one run for the whole job, "
                "which every attempt continues.",
                {
                    "mlflowRunId": string("The job's MLflow run.", max_length=64),
                    "mlflowExperimentId": string("The MLflow experiment the run is in.", max_length=64),
                    "mlflowRunUrl": string(
                        "The run's page on the tracking server (spec.monitoring.mlflowTrackingUri).",
                        max_length=URL_LENGTH,
                    ),
                    "wandbRunId": string(
                        "The job's Weights & Biases run (spec.monitoring.wandbProject).", max_length=64
                    ),
                    "wandbMode": string(
                        "How the trainer logs to W&B: online, or offline into the run directory on the "
                        "checkpoint claim (wandb/, for `wandb sync`).",
                        max_length=16,
                    ),
                    "wandbRunUrl": string(
                        "The run's page on the W&B server, when online.", max_length=URL_LENGTH
                    ),
                    "unavailable": string(
                        "Why the trainer's last call to the tracking server failed; unset once one "
                        "succeeds. Training goes on meanwhile.",
                        max_length=MESSAGE_LENGTH,
                    ),
                },
            ),
            "resources": obj(
                "Resources allocated to the current attempt.",
                {
                    "gpus": _count("GPUs requested by the job's pods."),
                    "workers": _count("Worker pods of the current attempt."),
                },
            ),
            "attempt": _count("Number of the current gang attempt (pod label attempt); 0 for the first."),
            "attemptStartTime": _timestamp(
                "When the current attempt's pods were created (scheduling.scheduleTimeoutSeconds)."
            ),
            "restartAt": _timestamp(
                "Earliest time the next attempt may start (restart backoff); absent when the backoff is zero."
            ),
            "activeSeconds": _count(
                "Seconds the job ran before the current run (failurePolicy.activeDeadlineSeconds excludes "
                "time suspended)."
            ),
            "runningSince": _timestamp(
                "Start of the current run of the deadline clock; unset while stopped."
            ),
            "startTime": _timestamp("When the job first started running."),
            "completionTime": _timestamp("When the job Completed or Failed (ttlSecondsAfterFinished)."),
            "duration": string(
                "Wall time from startTime to completion (or now), e.g. 1h2m3s.", max_length=32
            ),
            "failureReason": string("Why the job failed, when it did.", max_length=REASON_LENGTH),
            "restartCount": _count("Gang restarts of any cause."),
            "lastRestartReason": string("Reason of the latest restart.", max_length=REASON_LENGTH),
            "lastRestartKind": string(
                "How the latest restart of a job with failurePolicy.restartStrategy InPlace restarted the "
                "workers: InPlace (the pods stayed) or Recreate (they were created again).",
                max_length=16,
                enum=["InPlace", "Recreate"],
            ),
            "inPlaceUnavailable": string(
                "Why a job with failurePolicy.restartStrategy InPlace has its pods recreated at every "
                "restart for the rest of its life: its image could not run the trainers' supervisor "
                "(python3, 3.9 or later). Its pods run the command directly.",
                max_length=MESSAGE_LENGTH,
            ),
            "inPlaceRestart": obj(
                "The operator's latest order to the trainers' supervisors of a job restarted in place "
                "(failurePolicy.restartStrategy InPlace); they watch the job and act on it.",
                {
                    "attempt": _count("The attempt the order is for: the one after the stopped one."),
                    "phase": string(
                        "Stopping: stop the training processes. Starting: start the attempt's processes.",
                        max_length=16,
                        enum=["Stopping", "Starting"],
                    ),
                    "resumeFrom": string(
                        "Checkpoint the attempt's processes resume from (RESUME_FROM).", max_length=1024
                    ),
                    "since": _timestamp("When the order was given (its deadlines run from it)."),
                },
            ),
            "replicas": _count(
                "Worker pods of the current attempt that exist and are not being deleted (the scale "
                "subresource's status replicas)."
            ),
            "selector": string(
                "Label selector of the job's worker pods (the scale subresource's, for a "
                "HorizontalPodAutoscaler).",
                max_length=1024,
            ),
            "elastic": obj(
                "What happened to an elastic job's world (spec.elastic) without a gang restart.",
                {
                    "shrinks": _count(
                        "Workers lost to a disruption (preemption, eviction, node loss, a deleted pod) "
                        "while the others carried on: not failures, not counted in restarts."
                    ),
                    "grows": _count("Lost workers whose replacement runs and rejoined the others."),
                    "replacing": array(
                        "Replica indices of lost workers whose replacement does not run yet.",
                        {"type": "integer", "minimum": 0},
                        max_items=contract.MAX_WORKERS,
                        list_type="set",
                    ),
                    "lastShrinkReason": string("Why the last worker was lost.", max_length=REASON_LENGTH),
                },
            ),
            "queue": queue(),
            "restarts": obj(
                "Gang restarts by cause.",
                {
                    "failure": _count("After worker failures (bounded by failurePolicy.backoffLimit)."),
                    "disruption": _count(
                        "After preemption, eviction or node loss (bounded by "
                        "failurePolicy.maxDisruptionRestarts)."
                    ),
                    "scheduling": _count("After scheduling.scheduleTimeoutSeconds expired."),
                    "stall": _count("After a stall (monitoring.restartOnStall)."),
                },
            ),
        },
    )
