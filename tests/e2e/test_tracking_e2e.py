"""Exact accounting on the real local cluster: the tracking finalizer keeps a pod's end until the job's
status has it, whatever happens to the pod while the operator is down (docs/accounting.md).

Each test stops the operator with SIGKILL (what a crash or a lost leader does), makes the pods end
the way the scheduler, a user or a kubelet would, shows that the API server still holds them, and
starts an operator again: the job's status must count each end once and by the right cause, and no
pod may stay behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import UTC, datetime
from typing import Any

from crd import contract
from testbed import Kubectl, add_disruption_condition, end_pod, wait_for
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import job_manifest, pods_of, status_of
from tests.e2e.lifecycle_support import running_pods, wait_state, wait_status
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]
BACKOFF = {"initialDelaySeconds": 1, "maxDelaySeconds": 2}


def running_job(cluster: Kubectl, namespace: str, name: str, backoff_limit: int = 3) -> list[JsonDict]:
    policy = {"backoffLimit": backoff_limit, "restartBackoff": BACKOFF}
    cluster.apply(job_manifest(name, failurePolicy=policy), "-n", namespace)
    wait_state(cluster, namespace, name, "Running")
    return running_pods(cluster, namespace, name, 0, 2)


def crash(operator: OperatorProcess) -> None:
    operator.signal(signal.SIGKILL)
    operator.wait_exit()


def held(cluster: Kubectl, namespace: str, pod: str) -> JsonDict:
    """The pod, deleted but kept by the tracking finalizer."""
    found = cluster.get_json("pod", pod, "-n", namespace)
    assert found["metadata"].get("deletionTimestamp"), found["metadata"]
    assert contract.TRACKING_FINALIZER in found["metadata"]["finalizers"]
    return found


def gone(cluster: Kubectl, namespace: str, pod: str, uid: str) -> bool:
    found = cluster.get_or_none("pod", pod, "-n", namespace)
    return found is None or found["metadata"]["uid"] != uid


def deleted_while_down(
    cluster: Kubectl, namespace: str, start_operator: StartOperator, name: str
) -> list[JsonDict]:
    """A running job deleted while its operator is down: the garbage collector deletes the pods, and
    their finalizer holds them. Returns the pods as they ran."""
    operator = start_operator()
    pods = running_job(cluster, namespace, name)
    crash(operator)
    cluster.run("delete", "trainingjob", name, "-n", namespace, "--wait=false")
    wait_for(
        "the garbage collector to delete the pods",
        lambda: all(pod["metadata"].get("deletionTimestamp") for pod in pods_of(cluster, namespace, name)),
    )
    assert len(pods_of(cluster, namespace, name)) == 2
    return pods


def next_second(moment: str) -> None:
    """Waits until the clock is past the whole second of `moment` (status times have whole seconds)."""
    stamp = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    wait_for(f"the second after {moment}", lambda: datetime.now(UTC).replace(microsecond=0) > stamp, 5, 0.05)


def test_a_preemption_while_the_operator_is_down_restarts_as_a_disruption(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    # The scenario of issue 15: backoffLimit 0; the leader is killed; rank 1 is preempted
    # (DisruptionTarget) and deleted; rank 0 exits 1 a second later (its peer is lost).
    operator = start_operator()
    rank0, rank1 = running_job(cluster, namespace, "preempted", backoff_limit=0)
    crash(operator)
    add_disruption_condition(cluster, namespace, rank1["metadata"]["name"], "PreemptionByScheduler")
    cluster.run("delete", "pod", rank1["metadata"]["name"], "-n", namespace, "--wait=false")
    held(cluster, namespace, rank1["metadata"]["name"])
    end_pod(cluster, namespace, rank0["metadata"]["name"], exit_code=1, message="peer lost")

    start_operator()

    status = wait_status(
        cluster, namespace, "preempted", "restarted once", lambda status: status.get("restartCount") == 1
    )
    assert status["restarts"] == {"disruption": 1}, status
    assert status["lastRestartReason"] == "PreemptionByScheduler", status
    wait_state(cluster, namespace, "preempted", "Running")
    assert status_of(cluster, namespace, "preempted")["restarts"] == {"disruption": 1}
    for old in (rank0, rank1):
        assert gone(cluster, namespace, old["metadata"]["name"], old["metadata"]["uid"])


def test_a_force_deleted_pod_waits_for_the_operator_and_counts_once(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator()
    _, rank1 = running_job(cluster, namespace, "forced")
    crash(operator)
    name = rank1["metadata"]["name"]
    cluster.run("delete", "pod", name, "-n", namespace, "--force", "--grace-period=0", "--wait=false")
    held(cluster, namespace, name)

    start_operator()

    status = wait_status(
        cluster, namespace, "forced", "restarted once", lambda status: status.get("restartCount") == 1
    )
    assert status["restarts"] == {"disruption": 1}, status
    assert status["lastRestartReason"] == "PodDeleted", status
    wait_for(f"{name} to go", lambda: gone(cluster, namespace, name, rank1["metadata"]["uid"]))


def test_a_pod_that_failed_before_it_was_deleted_counts_as_its_failure(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator()
    _, rank1 = running_job(cluster, namespace, "failed")
    crash(operator)
    name = rank1["metadata"]["name"]
    ended = end_pod(cluster, namespace, name, exit_code=1, message="CUDA error")
    next_second(ended["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"])
    cluster.run("delete", "pod", name, "-n", namespace, "--wait=false")
    held(cluster, namespace, name)

    start_operator()

    status = wait_status(
        cluster, namespace, "failed", "restarted once", lambda status: status.get("restartCount") == 1
    )
    assert status["restarts"] == {"failure": 1}, status
    assert status["lastRestartReason"] == "PodFailed", status


def test_pods_of_a_job_deleted_while_the_operator_is_down_go_once_it_is_back(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    pods = deleted_while_down(cluster, namespace, start_operator, "deleted")

    start_operator()

    wait_for("the pods to go", lambda: pods_of(cluster, namespace, "deleted") == [])
    assert all(gone(cluster, namespace, pod["metadata"]["name"], pod["metadata"]["uid"]) for pod in pods)


def test_a_completed_jobs_pods_are_kept_without_the_finalizer(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    start_operator()
    pods = running_job(cluster, namespace, "done")
    for pod in pods:
        end_pod(cluster, namespace, pod["metadata"]["name"], exit_code=0)
    wait_state(cluster, namespace, "done", "Completed")

    def released() -> bool:
        kept = pods_of(cluster, namespace, "done")
        return len(kept) == 2 and all(not pod["metadata"].get("finalizers") for pod in kept)

    wait_for("the finished pods to be released", released)
    # Nothing holds them now: deleting one takes it away at once.
    name = pods[0]["metadata"]["name"]
    cluster.run("delete", "pod", name, "-n", namespace, "--wait=true", "--timeout=60s")


def test_the_documented_manual_release_lets_held_pods_go(
    cluster: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    # docs/accounting.md's loop for pods left held without an operator, run as written.
    pods = deleted_while_down(cluster, namespace, start_operator, "orphaned")
    text = (REPO / "docs" / "accounting.md").read_text()
    script = text[text.index("kubectl get pods -A -l") : text.index("\ndone\n") + len("\ndone\n")]
    env = {
        **os.environ,
        "PATH": f"{cluster.binary.parent}:{os.environ['PATH']}",
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    subprocess.run(["bash", "-euo", "pipefail", "-c", script], check=True, env=env, timeout=120)
    wait_for("the pods to go", lambda: pods_of(cluster, namespace, "orphaned") == [])
    assert all(gone(cluster, namespace, pod["metadata"]["name"], pod["metadata"]["uid"]) for pod in pods)
