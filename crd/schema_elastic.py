"""The schema of TrainingJob.spec.elastic: torchrun's elastic launch, and the rules that keep it sound.

Why a part of its own: an elastic job is a PyTorch job whose world may change while it runs, and that
touches several other fields (numWorkers is the desired count within [minWorkers, maxWorkers], the
framework, gang scheduling, the ports). Those cross-field rules are CEL on the spec, written here next
to the section they guard, so the API server refuses a job that cannot work, naming the field.

The values map one to one onto torchrun's flags (docs/env.md, "Elastic PyTorch"): minWorkers and
maxWorkers are `--nnodes=MIN:MAX`, maxRestarts `--max-restarts`, the rendezvous block `--rdzv-endpoint`'s
port and `--rdzv-conf`'s timeouts.
"""

from __future__ import annotations

from crd import contract
from crd.openapi import Rule, Schema, integer, obj, rule


def rendezvous() -> Schema:
    return obj(
        "torchrun's c10d rendezvous. Its store is hosted by worker 0's torchrun agent and reached through "
        f"<job>{contract.MASTER_SUFFIX} (PET_RDZV_ENDPOINT).",
        {
            "port": integer(
                "Port of the rendezvous store on worker 0 (PET_RDZV_ENDPOINT, container port "
                f"{contract.RDZV_PORT_NAME}).",
                minimum=1024,
                maximum=65535,
                default=contract.DEFAULT_RDZV_PORT,
            ),
            "joinTimeoutSeconds": integer(
                "How long a torchrun agent waits for a rendezvous round to complete (at least minWorkers "
                "agents) before it gives up and its pod fails (rdzv-conf join_timeout).",
                minimum=1,
                maximum=86400,
                default=600,
            ),
            "lastCallTimeoutSeconds": integer(
                "Once minWorkers agents have joined a round, how long it stays open for more before it "
                "completes with fewer than maxWorkers (rdzv-conf last_call_timeout). After a lost worker "
                "the survivors train again this long after they noticed it.",
                minimum=1,
                maximum=3600,
                default=30,
            ),
        },
        default_empty=True,
    )


def elastic() -> Schema:
    return obj(
        "Elastic training with torchrun (framework pytorch only): the job starts once minWorkers workers "
        "run, a worker lost to a disruption (preemption, eviction, node loss, a deleted pod) makes the "
        "others continue without it while the operator recreates it, instead of a gang restart, and "
        "numWorkers (kubectl scale) may change between minWorkers and maxWorkers without a restart. The "
        "training code must run under torchrun and resume from its checkpoints when torchrun restarts it "
        "(docs/env.md). Immutable; needs scheduling.gangScheduling false.",
        {
            "minWorkers": integer(
                "Fewest workers the job trains with (torchrun --nnodes MIN, PET_NNODES). Losing a worker "
                "when fewer would be left restarts the whole gang instead.",
                minimum=1,
                maximum=contract.MAX_WORKERS,
            ),
            "maxWorkers": integer(
                "Most workers the job may be scaled to (torchrun --nnodes MAX, PET_NNODES).",
                minimum=1,
                maximum=contract.MAX_WORKERS,
            ),
            "maxRestarts": integer(
                "Times each worker's torchrun agent restarts its processes after they fail, before its pod "
                "fails (torchrun --max-restarts, PET_MAX_RESTARTS). A lost peer costs every surviving "
                "agent one; a worker joining costs none.",
                minimum=0,
                maximum=1000,
                default=3,
            ),
            "rendezvous": rendezvous(),
        },
        required=["minWorkers", "maxWorkers"],
        rules=[
            rule(
                "self.minWorkers <= self.maxWorkers",
                message="elastic.minWorkers must not exceed elastic.maxWorkers",
                field_path=".minWorkers",
            )
        ],
    )


_GANG_REASON = (
    "gang scheduling holds every worker until all numWorkers can be placed together, while an elastic "
    "job starts with minWorkers and replaces lost workers one at a time"
)
_FRAMEWORK_REASON = (
    "TensorFlow's TF_CONFIG and jax.distributed fix the set of processes when they start and have no "
    "rendezvous a worker can rejoin; torchrun's has"
)


def elastic_rules() -> list[Rule]:
    """Spec-level rules of an elastic job (each names the field it is about)."""
    frameworks = " || ".join(f"self.framework == '{name}'" for name in contract.ELASTIC_FRAMEWORKS)
    return [
        rule(
            "!has(self.elastic) || (self.numWorkers >= self.elastic.minWorkers && "
            "self.numWorkers <= self.elastic.maxWorkers)",
            # A static message: the API server cannot bound the cost of string() in a messageExpression.
            message=(
                "numWorkers must be within [elastic.minWorkers, elastic.maxWorkers] (kubectl scale sets "
                "numWorkers)"
            ),
            field_path=".numWorkers",
        ),
        rule(
            f"!has(self.elastic) || !has(self.framework) || {frameworks}",
            message=(
                f"elastic needs framework {' or '.join(contract.ELASTIC_FRAMEWORKS)}: {_FRAMEWORK_REASON}"
            ),
            field_path=".elastic",
        ),
        rule(
            "!has(self.elastic) || !has(self.scheduling) || !has(self.scheduling.gangScheduling) || "
            "!self.scheduling.gangScheduling",
            message=f"elastic cannot be combined with scheduling.gangScheduling: {_GANG_REASON}",
            field_path=".scheduling.gangScheduling",
        ),
        rule(
            "!has(self.elastic) || !has(self.elastic.rendezvous) || !has(self.elastic.rendezvous.port) || "
            "!has(self.networking) || !has(self.networking.masterPort) || "
            "self.elastic.rendezvous.port != self.networking.masterPort",
            message="elastic.rendezvous.port must differ from networking.masterPort",
            field_path=".elastic.rendezvous.port",
        ),
        rule(
            "!has(self.elastic) || !has(self.elastic.rendezvous) || !has(self.elastic.rendezvous.port) || "
            "!has(self.monitoring) || !has(self.monitoring.enabled) || !self.monitoring.enabled || "
            "!has(self.monitoring.metricsPort) || "
            "self.elastic.rendezvous.port != self.monitoring.metricsPort",
            message="elastic.rendezvous.port must differ from monitoring.metricsPort",
            field_path=".elastic.rendezvous.port",
        ),
    ]
