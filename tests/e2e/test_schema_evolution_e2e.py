"""A change to the CRD within v1, applied while jobs run, leaves them as they were.

Why: the schema evolves in place (docs/api.md, "Changing the API within v1"): a new release adds an
optional field, or a field with a default, and `make deploy`, `make install` or `helm upgrade` applies
the new CRD under running jobs. The API server then defaults the new field when it reads a stored job,
so every reader sees it, and nothing must take that for a change: no generation bump (the spec the user
wrote has not changed), no pod replaced, no restart counted, no status rewritten, no write loop in the
operator, which sees its watches restarted and every job again. Checked on the session's cluster (kwok
nodes) with jobs running, suspended and waiting out a restart backoff; the session's CRD is applied
again at the end, which takes the added fields out.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Final

from crd.schema import custom_resource_definition, open_api_schema_of
from testbed import Kubectl, end_pod, wait_for
from tests.cluster import REPO
from tests.e2e.jobs import get_job, job_manifest, pods_of, reconciled_versions, write_requests
from tests.e2e.lifecycle_support import backoff, running_attempt, wait_state, wait_status
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]
CRD_FILE: Final = REPO / "crd" / "trainingjobs.ml.example.com.yaml"
# What a later release might add: an optional field, and one with a default.
NEW_OPTIONAL: Final = "annotationNote"
NEW_DEFAULTED: Final = "priorityTier"
NEW_DEFAULT: Final = "standard"


def evolved_crd() -> JsonDict:
    """This tree's CRD with two fields more in spec: one optional, one with a default."""
    crd = copy.deepcopy(custom_resource_definition())
    spec = open_api_schema_of(crd)["properties"]["spec"]["properties"]
    spec[NEW_OPTIONAL] = {"type": "string", "maxLength": 256, "description": "A note (added later)."}
    spec[NEW_DEFAULTED] = {
        "type": "string",
        "maxLength": 32,
        "default": NEW_DEFAULT,
        "description": "A tier (added later, with a default).",
    }
    return crd


def settled(kubectl: Kubectl, operator: OperatorProcess, namespace: str, name: str) -> None:
    """Waits until the operator has reconciled the job's current version (a write of its own would
    have made a newer one)."""

    def probe() -> bool:
        version = str(get_job(kubectl, namespace, name)["metadata"]["resourceVersion"])
        return version in reconciled_versions(operator, namespace, name)

    wait_for(f"the operator done with {name}", probe, timeout=60)


def snapshot(kubectl: Kubectl, namespace: str, names: tuple[str, ...]) -> dict[str, JsonDict]:
    """What must not change, per job: its generation, its status, its pods' uids and restart counts."""
    found = {}
    for name in names:
        job = get_job(kubectl, namespace, name)
        pods = {
            pod["metadata"]["name"]: (
                pod["metadata"]["uid"],
                [c.get("restartCount", 0) for c in (pod.get("status") or {}).get("containerStatuses") or []],
            )
            for pod in pods_of(kubectl, namespace, name)
        }
        found[name] = {
            "generation": job["metadata"]["generation"],
            "status": job.get("status"),
            "pods": pods,
        }
    return found


def test_a_new_optional_field_and_default_leave_running_jobs_untouched(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    names = ("running", "suspended", "backing-off")
    kubectl.apply(job_manifest("running"), "-n", namespace)
    kubectl.apply(job_manifest("suspended", suspend=True), "-n", namespace)
    backing_off = job_manifest("backing-off", failurePolicy={"restartBackoff": backoff(600)})
    kubectl.apply(backing_off, "-n", namespace)
    wait_state(kubectl, namespace, "running", "Running")
    wait_state(kubectl, namespace, "suspended", "Suspended")
    wait_status(kubectl, namespace, "backing-off", "attempt 0 Running", running_attempt(0))
    end_pod(kubectl, namespace, "backing-off-worker-1", exit_code=1)
    wait_status(kubectl, namespace, "backing-off", "in its backoff", lambda s: s.get("restartCount") == 1)
    for name in names:
        settled(kubectl, operator, namespace, name)
    before = snapshot(kubectl, namespace, names)
    writes = write_requests(operator)
    try:
        kubectl.run("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(evolved_crd()))
        wait_for(
            "the new default served on a stored job",
            lambda: get_job(kubectl, namespace, "running")["spec"].get(NEW_DEFAULTED) == NEW_DEFAULT,
            timeout=60,
        )
        # A write by someone else (a label) stores the defaulted spec: still the same generation.
        kubectl.run("label", "trainingjob", "running", "-n", namespace, "team=vision")
        for name in names:
            settled(kubectl, operator, namespace, name)
        after = snapshot(kubectl, namespace, names)
        assert after == before
        assert write_requests(operator) == writes, "the operator wrote after the CRD changed"
        assert operator.alive(), operator.tail()
    finally:
        kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
        wait_for(
            "the session's CRD served again",
            lambda: NEW_DEFAULTED not in get_job(kubectl, namespace, "running")["spec"],
            timeout=60,
        )
