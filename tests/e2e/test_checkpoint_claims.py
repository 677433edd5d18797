"""The checkpoint claim against the real API server and garbage collector: retained or deleted with its
job as checkpoint.storage.pvc.create.whenDeleted says, reused by a job created again with the same
name, released when it is still owned by a job that retains it.

No kubelet is needed: the claims stay Pending (no volume), which nothing here waits for. That a new job
reads the checkpoints a retained claim holds is tests/e2e/test_examples.py's resume test.
"""

from __future__ import annotations

import json
from typing import Any

from crd import contract
from testbed import Kubectl
from tests.e2e.jobs import condition, get_job, job_manifest, pods_of, wait
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]


def checkpoint_job(name: str, **create: str) -> JsonDict:
    storage = {"type": "pvc", "pvc": {"create": {"size": "1Gi", **create}}}
    return job_manifest(name, checkpoint={"enabled": True, "storage": storage})


def claim_of(kubectl: Kubectl, namespace: str, job: str) -> JsonDict | None:
    return kubectl.get_or_none("pvc", f"{job}{contract.CHECKPOINTS_SUFFIX}", "-n", namespace)


def wait_for_claim(kubectl: Kubectl, namespace: str, job: str) -> JsonDict:
    return wait(f"the claim of {job}", lambda: claim_of(kubectl, namespace, job))


def wait_until_created(kubectl: Kubectl, namespace: str, job: str) -> JsonDict:
    """The job's pods all exist (Created True): nothing blocked it."""

    def created() -> JsonDict | None:
        found = get_job(kubectl, namespace, job)
        entry = condition(found.get("status") or {}, "Created")
        return found if entry is not None and entry["status"] == "True" else None

    return wait(f"{job} Created", created)


def wait_until_collected(kubectl: Kubectl, namespace: str, job: str) -> None:
    """The garbage collector has deleted what the deleted job owned (its Services and pods)."""

    def collected() -> bool:
        service = kubectl.get_or_none("service", f"{job}{contract.HEADLESS_SUFFIX}", "-n", namespace)
        return service is None and not pods_of(kubectl, namespace, job)

    wait(f"the objects of the deleted job {job} collected", collected, 90)


def test_a_retained_claim_survives_its_job_and_serves_the_next_job_of_that_name(
    cluster: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(checkpoint_job("keep"), "-n", namespace)
    wait_until_created(cluster, namespace, "keep")
    claim = wait_for_claim(cluster, namespace, "keep")
    assert "ownerReferences" not in claim["metadata"]
    assert claim["metadata"]["labels"][contract.JOB_NAME_LABEL] == "keep"

    cluster.run("delete", "trainingjob", "keep", "-n", namespace)
    wait_until_collected(cluster, namespace, "keep")
    kept = claim_of(cluster, namespace, "keep")
    assert kept is not None
    assert kept["metadata"]["uid"] == claim["metadata"]["uid"]
    assert "deletionTimestamp" not in kept["metadata"]

    # The same manifest again: the job uses the claim it finds, and is not blocked by it.
    cluster.apply(checkpoint_job("keep"), "-n", namespace)
    job = wait_until_created(cluster, namespace, "keep")
    assert "FailedCreate" not in str(job["status"])
    again = claim_of(cluster, namespace, "keep")
    assert again is not None
    assert again["metadata"]["uid"] == claim["metadata"]["uid"]
    assert "ownerReferences" not in again["metadata"]
    volumes = {v["name"]: v for v in pods_of(cluster, namespace, "keep")[0]["spec"]["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "keep-checkpoints"}


def test_a_claim_to_delete_goes_with_its_job(
    cluster: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(checkpoint_job("drop", whenDeleted="Delete"), "-n", namespace)
    claim = wait_for_claim(cluster, namespace, "drop")
    job = get_job(cluster, namespace, "drop")
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        contract.KIND,
        "drop",
        job["metadata"]["uid"],
        True,
    )
    cluster.run("delete", "trainingjob", "drop", "-n", namespace)
    wait(
        "the garbage collector to delete the claim", lambda: claim_of(cluster, namespace, "drop") is None, 90
    )


def test_a_claim_owned_by_a_job_that_retains_it_is_released(
    cluster: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    # As a claim created by an operator that knew no whenDeleted: owned by its job.
    cluster.apply(checkpoint_job("older"), "-n", namespace)
    claim = wait_for_claim(cluster, namespace, "older")
    uid = get_job(cluster, namespace, "older")["metadata"]["uid"]
    owner = {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": "older", "uid": uid}
    patch = json.dumps({"metadata": {"ownerReferences": [{**owner, "controller": True}]}})
    cluster.run("patch", "pvc", "older-checkpoints", "-n", namespace, "--type=merge", "-p", patch)

    def released() -> JsonDict | None:
        found = claim_of(cluster, namespace, "older")
        return found if found is not None and not found["metadata"].get("ownerReferences") else None

    wait("the operator to take the job's owner reference off", released)
    cluster.run("delete", "trainingjob", "older", "-n", namespace)
    wait_until_collected(cluster, namespace, "older")
    kept = claim_of(cluster, namespace, "older")
    assert kept is not None
    assert kept["metadata"]["uid"] == claim["metadata"]["uid"]
