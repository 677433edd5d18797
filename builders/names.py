"""The names of every object the operator creates for a TrainingJob.

Names are deterministic so that a create after a crash finds the existing object (409) instead of
making a second one, and so that pods can find each other (hostname + subdomain) without lookups.
The admission rules cap job names at crd.contract.MAX_JOB_NAME characters, which keeps every name
that must be a DNS label (pod hostnames, Services) within 63 characters.
"""

from __future__ import annotations

from crd import contract
from crd.spec import TrainingJob


def job_name(job: TrainingJob) -> str:
    return job.name


def pod_name(job: TrainingJob, slot: int) -> str:
    """The pod in `slot` of the job (crd/replicas.py): <job>-<role>-<index within the role>, which for a
    job of workers only is <job>-worker-<slot>."""
    replica = job.spec.replicas.at(slot)
    return f"{job_name(job)}-{replica.type}-{replica.index}"


def pod_names(job: TrainingJob) -> list[str]:
    return [pod_name(job, slot) for slot in range(job.spec.replicas.size)]


def headless_service_name(job: TrainingJob) -> str:
    return f"{job_name(job)}{contract.HEADLESS_SUFFIX}"


def master_service_name(job: TrainingJob) -> str:
    return f"{job_name(job)}{contract.MASTER_SUFFIX}"


def service_account_name(job: TrainingJob) -> str:
    """The workers' account: spec.serviceAccountName, else the namespace's shared trainer account."""
    return job.spec.service_account_name or contract.TRAINER_ACCOUNT


def pvc_name(job: TrainingJob) -> str:
    return f"{job_name(job)}{contract.CHECKPOINTS_SUFFIX}"


def pod_group_name(job: TrainingJob) -> str:
    return job_name(job)


def pod_dns_name(job: TrainingJob, slot: int) -> str:
    """The pod's stable DNS name within the namespace: <hostname>.<subdomain>."""
    return f"{pod_name(job, slot)}.{headless_service_name(job)}"
