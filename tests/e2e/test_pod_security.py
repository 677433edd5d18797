"""Pod Security admission on the real API server: what the operator's pods pass, and what happens when
a namespace refuses them.

The operator's pods pass the "baseline" Pod Security Standard by default (no host namespaces, ports
or paths, no capabilities, no privilege escalation, the runtime's seccomp profile), and "restricted"
where the operator knows the trainer runs as a non-root user: the reference trainer in a framework's
default image (builders/podsecurity.py). In a namespace enforcing "restricted", the default job runs,
and so does examples/trainingjob-restricted.yaml, whose sidecar states its own user; a job on an image
of its own, whose user the operator cannot choose, is blocked, with a condition and an Event quoting
the PodSecurity refusal (the user alone: the other defaults pass), and its pod creates are retried
with the rate limiter's growing backoff, not in a loop. In a namespace enforcing "baseline", a job
asking for what baseline forbids (IPC_LOCK, which RDMA needs; a hostPath volume) is blocked the same
way.

A job the namespace's level would refuse is refused when it is applied (the admission policy
`trainingjob-escalation`, tests/e2e/test_tenant_escalation.py): the jobs here are blocked because the
namespace was labelled after they were stored, before the operator started.
"""

from __future__ import annotations

import collections
import itertools
from datetime import datetime
from typing import Any

import pytest
import yaml

from crd import contract
from testbed import Kubectl
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    PatientKubectl,
    assert_healthy,
    condition,
    get_job,
    job_manifest,
    pods_of,
    wait,
    wait_for_events,
    wait_for_state,
    wait_until_quiet,
)
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]
RESTRICTED_EXAMPLE = REPO / "examples" / "trainingjob-restricted.yaml"
ENFORCE = "pod-security.kubernetes.io/enforce"


@pytest.fixture
def kubectl(cluster: Kubectl) -> Kubectl:
    return PatientKubectl.of(cluster)


def enforce(kubectl: Kubectl, namespace: str, level: str) -> None:
    kubectl.run("label", "namespace", namespace, f"{ENFORCE}={level}", "--overwrite")


def blocked(kubectl: Kubectl, namespace: str, name: str, fragment: str) -> JsonDict:
    """Waits until the job is blocked (Created=False, FailedCreate) with `fragment` in its message."""

    def probe() -> JsonDict | None:
        job = get_job(kubectl, namespace, name)
        created = condition(job.get("status") or {}, "Created")
        if created and created.get("reason") == "FailedCreate" and fragment in created.get("message", ""):
            return job
        return None

    return wait(f"{name} blocked by {fragment!r}", probe, timeout=90)


def failed_create_attempts(operator: OperatorProcess, name: str) -> list[tuple[float, int]]:
    """Each reconcile of job `name` that failed to create its pods: when it logged its first refusal,
    and how many refusals it logged, in order."""
    first: dict[str, float] = {}
    refusals: collections.Counter[str] = collections.Counter()
    for line in operator.logs():
        if line.get("action") == "create-failed" and line.get("name") == name:
            stamp = datetime.fromisoformat(str(line["time"]).replace("Z", "+00:00")).timestamp()
            first.setdefault(str(line["reconcile_id"]), stamp)
            refusals[str(line["reconcile_id"])] += 1
    return sorted((stamp, refusals[reconcile]) for reconcile, stamp in first.items())


def test_restricted_namespace_runs_the_default_job_and_blocks_one_on_an_image_of_its_own(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    kubectl.apply(job_manifest("default"), "-n", namespace)
    kubectl.apply(job_manifest("own-image", image="myteam/train:1.4"), "-n", namespace)
    result = kubectl.attempt("apply", "-n", namespace, "-f", str(RESTRICTED_EXAMPLE))
    assert result.returncode == 0, result.stderr
    enforce(kubectl, namespace, "restricted")
    operator = start_operator("--leader-elect=false", "--log-level=DEBUG")

    refusal = 'violates PodSecurity "restricted:latest"'
    job = blocked(kubectl, namespace, "own-image", refusal)
    message = job["status"]["message"]
    # What the defaults cannot give (a user for an image the operator does not know) is refused; what
    # they give (no capabilities, no privilege escalation, the runtime's seccomp profile) is not.
    assert "runAsNonRoot != true" in message, message
    for satisfied in ("capabilities", "allowPrivilegeEscalation", "seccompProfile"):
        assert satisfied not in message, message
    assert job["status"]["state"] == "Pending"
    events = wait_for_events(kubectl, namespace, "own-image", {"FailedCreate": [refusal]})
    assert all(e["type"] == "Warning" for e in events if e["reason"] == "FailedCreate")
    assert not pods_of(kubectl, namespace, "own-image")

    # The default job runs beside it: the reference trainer in the default image is restricted as
    # built, its pods were admitted and kwok runs them.
    wait_for_state(kubectl, namespace, "default", "Running", timeout=120)
    assert len(pods_of(kubectl, namespace, "default")) == 2

    # So does the example, whose sidecar states its own user.
    example = yaml.safe_load(RESTRICTED_EXAMPLE.read_text())
    name, workers = example["metadata"]["name"], int(example["spec"]["numWorkers"])
    wait_for_state(kubectl, namespace, name, "Running", timeout=120)
    pods = pods_of(kubectl, namespace, name)
    assert len(pods) == workers
    assert all(pod["status"]["phase"] == "Running" for pod in pods)
    for pod in pods:
        containers = pod["spec"]["containers"] + pod["spec"]["initContainers"]
        assert [c["name"] for c in containers] == [contract.CONTAINER_NAME, "log-shipper"]
        assert all(c["securityContext"]["capabilities"] == {"drop": ["ALL"]} for c in containers)
        assert containers[0]["securityContext"]["runAsUser"] == contract.NON_ROOT_USER

    # No hot loop: the blocked job's creates are retried with the rate limiter's growing pauses
    # (per-key exponential backoff from 5 ms, doubling: the first pauses hide behind the reconcile's own
    # duration, from the tenth attempt on the pause dominates); the first attempt tries both pods (nothing
    # said the job was blocked), every later one a single pod (slow start: a refusal every pod shares
    # stops the batch), and an unchanged refusal writes no status.
    wait(
        "twelve refused attempts",
        lambda: len(failed_create_attempts(operator, "own-image")) >= 12,
        timeout=90,
    )
    attempts = failed_create_attempts(operator, "own-image")
    assert attempts[0][1] == 2, attempts
    assert {count for _, count in attempts[1:-1]} == {1}, attempts  # the last one may be under way
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(attempts)]
    assert gaps[-1] >= 2.0, gaps
    assert gaps[-1] > 1.5 * gaps[-2] > 1.5 * 1.5 * gaps[-3], gaps
    quiet = wait_until_quiet(kubectl, operator, namespace, "own-image")
    assert quiet["status"]["message"] == message
    assert_healthy(operator)


def test_baseline_namespace_runs_the_default_job(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    # An image of its own: the trainer may run as root, which baseline allows.
    kubectl.apply(job_manifest("default", image="myteam/train:1.4"), "-n", namespace)
    # RDMA needs IPC_LOCK, a capability "baseline" does not allow: enforcement is on.
    kubectl.apply(job_manifest("rdma", networking={"rdmaEnabled": True}), "-n", namespace)
    # A volume type the namespace refuses: a node's own directory.
    host_data = {
        "volumes": [{"name": "cache", "hostPath": {"path": "/var/cache/datasets"}}],
        "containers": [{"name": "trainer", "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
    }
    kubectl.apply(job_manifest("host-data", podTemplate={"spec": host_data}), "-n", namespace)
    enforce(kubectl, namespace, "baseline")
    operator = start_operator("--leader-elect=false")

    wait_for_state(kubectl, namespace, "default", "Running", timeout=120)
    assert len(pods_of(kubectl, namespace, "default")) == 2
    job = blocked(kubectl, namespace, "rdma", 'violates PodSecurity "baseline:latest"')
    assert "IPC_LOCK" in job["status"]["message"]
    job = blocked(kubectl, namespace, "host-data", 'violates PodSecurity "baseline:latest"')
    assert 'hostPath volumes (volume "cache")' in job["status"]["message"]
    assert job["status"]["state"] == "Pending"
    wait_for_events(kubectl, namespace, "host-data", {"FailedCreate": ['hostPath volumes (volume "cache")']})
    assert_healthy(operator)
