"""A gang scheduler or Kueue installed while the operator runs is used without a restart.

The operator asks the API server's discovery again every --discovery-interval (1s here) which
optional APIs it serves (controller/discovery.py). Each test starts the operator on a cluster that
does not serve the API, shows what a job that asks for it gets then (documented behaviour: gang
scheduling falls back to the default scheduler with a Warning; a queued job waits, saying Kueue is not
installed), then adds the component to the running cluster with `hack/dev-cluster.sh up --with <name>`
and shows the operator using it. When the session's cluster runs the component already, its API is
withdrawn first (the PodGroup CRD deleted; Kueue's WorkloadPriorityClass CRD deleted, which no
instance holds a finalizer on, and without which the operator does not use Kueue), and `up --with`
puts it back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from crd import contract
from testbed import BUILDS, Kubectl, wait_for
from tests.cluster import dev_cluster, optional_api_withdrawn, require_optional
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import job_manifest, pods_of, status_of, wait_for_events
from tests.e2e.kueue_support import admitted_reason, gpu_queue, queued_job, workload_of
from tests.e2e.lifecycle_support import node_pool, pool_scheduling, running_pods, wait_state, wait_status
from tests.e2e.scheduling_support import POD_GROUP_CRD, pod_group_api_withdrawn, scheduled_by

WORKLOAD_PRIORITY_CLASS_CRD = "workloadpriorityclasses.kueue.x-k8s.io"
DISCOVERY = "--discovery-interval=1s"


@contextlib.contextmanager
def kueue_api_withdrawn(kubectl: Kubectl) -> Iterator[None]:
    """Kueue's API, as the operator needs it, not served at the start of the block; `up --with kueue`
    (in the block, and afterwards in any case when Kueue ran before) serves it again."""
    with optional_api_withdrawn(
        kubectl,
        "kueue",
        WORKLOAD_PRIORITY_CLASS_CRD,
        contract.KUEUE_API_VERSION,
        {"workloads", "resourceflavors", "workloadpriorityclasses"},
        restart=False,
    ):
        yield


@pytest.mark.components
@pytest.mark.builds(BUILDS["kueue"])
def test_kueue_installed_while_the_operator_runs_admits_the_job_that_waited_for_it(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    with kueue_api_withdrawn(kubectl), node_pool(kubectl, namespace, 1):
        start_operator(DISCOVERY)
        kubectl.apply(queued_job("early"), "-n", namespace)
        before = wait_status(
            kubectl,
            namespace,
            "early",
            "Queued (KueueNotInstalled)",
            lambda s: s.get("state") == "Queued" and admitted_reason(s) == "KueueNotInstalled",
        )
        warnings = wait_for_events(kubectl, namespace, "early", {"KueueNotInstalled": ["asks for Kueue"]})
        assert not pods_of(kubectl, namespace, "early")

        require_optional("kueue")  # `hack/dev-cluster.sh up --with kueue` while the operator runs
        with gpu_queue(kubectl, namespace, gpus=8):
            wait_state(kubectl, namespace, "early", "Running")
            workload = workload_of(kubectl, namespace, "early")
            after = status_of(kubectl, namespace, "early")

    assert before["message"] == (
        "label kueue.x-k8s.io/queue-name=team asks for Kueue, but the cluster does not serve its API "
        f"({contract.KUEUE_API_VERSION} Workloads); waiting until Kueue is installed"
    )
    assert [e["type"] for e in warnings if e["reason"] == "KueueNotInstalled"] == ["Warning"]
    assert workload is not None
    assert after["queue"]["admissions"] == 1


@pytest.mark.components
@pytest.mark.builds(BUILDS["coscheduling"])
def test_a_gang_scheduler_installed_while_the_operator_runs_gets_the_next_gang(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    with pod_group_api_withdrawn(kubectl), node_pool(kubectl, namespace, 2):
        start_operator(DISCOVERY)
        scheduling = pool_scheduling(namespace, gangScheduling=True)
        kubectl.apply(
            job_manifest("before", numWorkers=2, gpusPerWorker=4, scheduling=scheduling), "-n", namespace
        )
        wait_state(kubectl, namespace, "before", "Running")
        wait_for_events(
            kubectl, namespace, "before", {"GangSchedulingUnavailable": ["scheduling pods individually"]}
        )
        ungrouped = pods_of(kubectl, namespace, "before")

        require_optional("coscheduling")  # `hack/dev-cluster.sh up --with coscheduling` while it runs
        # A scheduler that outlived its CRD would wait out its PodGroup informer's relist backoff.
        dev_cluster("restart", "coscheduling")
        kubectl.apply(
            job_manifest("after", numWorkers=2, gpusPerWorker=4, scheduling=scheduling), "-n", namespace
        )
        group = wait_for(
            "PodGroup after", lambda: kubectl.get_or_none(POD_GROUP_CRD, "after", "-n", namespace)
        )
        pods = running_pods(kubectl, namespace, "after", 0, 2)
        binders = wait_for("four Scheduled events", lambda: scheduled_by(kubectl, namespace, 4))

    assert all(pod["spec"]["schedulerName"] == "default-scheduler" for pod in ungrouped)
    assert group["spec"]["minMember"] == 2
    for pod in pods:
        assert pod["spec"]["schedulerName"] == contract.COSCHEDULING_SCHEDULER_NAME
        assert pod["metadata"]["labels"][contract.COSCHEDULING_POD_GROUP_LABEL] == "after"
        assert binders[pod["metadata"]["name"]] == contract.COSCHEDULING_SCHEDULER_NAME
