"""TensorFlow's replica roles (spec.tensorflow) on the real local cluster, as kubectl shows them: the pods,
Services and TF_CONFIG each role gets, and what each role's end does to the job (docs/api.md's table of
the roles): the chief's success completes it and stops the pods still running, a worker's failure
restarts the gang, an evaluator's failure is recorded and nothing more.

The nodes are kwok's; the test plays the kubelet with tests/cluster.py's `end_pod`. The admission
refusals of spec.tensorflow are tests/e2e/test_api.py's (tests/unit/crd_cases_tensorflow.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from crd import contract
from testbed import Kubectl, end_pod, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import condition, job_manifest, pods_of, wait_for_events
from tests.e2e.lifecycle_support import backoff, running_attempt, wait_state, wait_status
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]
pytestmark = pytest.mark.usefixtures("operator")

JOB = "ps-job"
CHIEF, WORKERS, PS, EVALUATOR = (
    f"{JOB}-chief-0",
    [f"{JOB}-worker-0", f"{JOB}-worker-1"],
    f"{JOB}-ps-0",
    f"{JOB}-evaluator-0",
)
EVERY_ROLE_RUNNING = "chief 1/1, worker 2/2, ps 1/1, evaluator 1/1"


@pytest.fixture
def operator(start_operator: StartOperator) -> OperatorProcess:
    return start_operator()


def parameter_server_job(**spec: Any) -> JsonDict:
    """A chief, two workers, a parameter server and an evaluator, without GPUs."""
    return job_manifest(
        JOB,
        framework="tensorflow",
        numWorkers=2,
        tensorflow={"chief": 1, "ps": 1, "evaluator": 1},
        networking={"masterPort": 2222},
        **spec,
    )


def run_to_running(kubectl: Kubectl, namespace: str, **spec: Any) -> dict[str, JsonDict]:
    """Applies the job and waits until every role's pod runs; its pods by name."""
    kubectl.apply(parameter_server_job(**spec), "-n", namespace)
    wait_status(
        kubectl, namespace, JOB, "every role running", lambda s: s.get("roleSummary") == EVERY_ROLE_RUNNING
    )
    return {str(pod["metadata"]["name"]): pod for pod in pods_of(kubectl, namespace, JOB)}


def env(pod: JsonDict) -> dict[str, str]:
    return {entry["name"]: entry.get("value", "") for entry in pod["spec"]["containers"][0]["env"]}


def test_every_role_gets_its_pods_services_and_tf_config(kubectl: Kubectl, namespace: str) -> None:
    pods = run_to_running(kubectl, namespace)
    assert sorted(pods) == sorted([CHIEF, *WORKERS, PS, EVALUATOR])
    labels = {name: pod["metadata"]["labels"] for name, pod in pods.items()}
    assert {
        name: (lb[contract.REPLICA_TYPE_LABEL], lb[contract.REPLICA_INDEX_LABEL])
        for name, lb in labels.items()
    } == {
        CHIEF: ("chief", "0"),
        WORKERS[0]: ("worker", "0"),
        WORKERS[1]: ("worker", "1"),
        PS: ("ps", "0"),
        EVALUATOR: ("evaluator", "0"),
    }
    # Every pod of the training cluster has a stable DNS name through the headless Service.
    assert {name: pod["spec"].get("hostname") for name, pod in pods.items()} == {
        **{name: name for name in (CHIEF, *WORKERS, PS)},
        EVALUATOR: None,
    }
    assert {pod["spec"]["subdomain"] for pod in pods.values()} == {f"{JOB}-headless"}
    cluster = {
        "chief": [f"{CHIEF}.{JOB}-headless:2222"],
        "ps": [f"{PS}.{JOB}-headless:2222"],
        "worker": [f"{name}.{JOB}-headless:2222" for name in WORKERS],
    }
    tasks = {name: json.loads(env(pod)["TF_CONFIG"]) for name, pod in pods.items()}
    assert all(config["cluster"] == cluster for config in tasks.values())
    assert {name: config["task"] for name, config in tasks.items()} == {
        CHIEF: {"type": "chief", "index": 0},
        WORKERS[0]: {"type": "worker", "index": 0},
        WORKERS[1]: {"type": "worker", "index": 1},
        PS: {"type": "ps", "index": 0},
        EVALUATOR: {"type": "evaluator", "index": 0},
    }
    assert env(pods[CHIEF])["RANK"] == "0"
    # <job>-master resolves to the chief, rank 0: its EndpointSlice holds the chief's address only.
    master = kubectl.get_json("service", f"{JOB}-master", "-n", namespace)
    assert master["spec"]["selector"][contract.REPLICA_TYPE_LABEL] == "chief"

    def master_endpoints() -> list[str] | None:
        slices = kubectl.items(
            "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={JOB}-master"
        )
        targets = [
            str(endpoint["targetRef"]["name"]) for item in slices for endpoint in item.get("endpoints") or []
        ]
        return targets or None

    assert wait_for("the master Service's endpoints", master_endpoints) == [CHIEF]
    job = kubectl.get_json("trainingjob", JOB, "-n", namespace)
    one = {"pending": 0, "active": 1, "succeeded": 0, "failed": 0}
    assert job["status"]["roles"] == {
        "chief": one,
        "worker": {**one, "active": 2},
        "ps": one,
        "evaluator": one,
    }
    assert job["status"]["replicas"] == 2
    # kubectl get -o wide shows the roles.
    wide = kubectl.run("get", "trainingjob", JOB, "-n", namespace, "-o", "wide")
    assert EVERY_ROLE_RUNNING in wide


def test_the_chiefs_success_completes_the_job_and_stops_the_other_roles(
    kubectl: Kubectl, namespace: str
) -> None:
    run_to_running(kubectl, namespace, cleanPodPolicy="None")
    end_pod(kubectl, namespace, CHIEF, exit_code=0)
    job = wait_state(kubectl, namespace, JOB, "Completed")
    succeeded = condition(job["status"], "Succeeded")
    assert succeeded is not None
    assert (succeeded["reason"], succeeded["message"]) == ("ChiefSucceeded", f"chief {CHIEF} succeeded")
    # The workers and the parameter server never exit by themselves: the job's end stops them, whatever
    # cleanPodPolicy says; the chief's pod stays.
    wait_for(
        "only the chief's pod left",
        lambda: [p["metadata"]["name"] for p in pods_of(kubectl, namespace, JOB)] == [CHIEF],
    )


def test_an_evaluators_failure_is_recorded_and_the_job_goes_on(kubectl: Kubectl, namespace: str) -> None:
    run_to_running(kubectl, namespace)
    end_pod(kubectl, namespace, EVALUATOR, exit_code=1, message="evaluation crashed")
    status = wait_status(
        kubectl,
        namespace,
        JOB,
        "EvaluatorFailed",
        lambda s: (condition(s, "EvaluatorFailed") or {}).get("status") == "True",
    )
    assert status["state"] == "Running"
    assert "restarts" not in status or status["restarts"] == {}
    recorded = condition(status, "EvaluatorFailed")
    assert recorded is not None
    assert f"pod {EVALUATOR}, container trainer, exit code 1" in recorded["message"]
    wait_for_events(kubectl, namespace, JOB, {"EvaluatorFailed": [f"evaluator pod {EVALUATOR}"]})
    assert EVALUATOR in {p["metadata"]["name"] for p in pods_of(kubectl, namespace, JOB)}, "kept for its logs"
    end_pod(kubectl, namespace, CHIEF, exit_code=0)
    job = wait_state(kubectl, namespace, JOB, "Completed")
    assert job["status"]["restartCount"] == 0


def test_a_workers_failure_restarts_the_gang(kubectl: Kubectl, namespace: str) -> None:
    run_to_running(kubectl, namespace, failurePolicy={"restartBackoff": backoff(1)})
    end_pod(kubectl, namespace, WORKERS[1], exit_code=1)
    status = wait_status(kubectl, namespace, JOB, "Running again in attempt 1", running_attempt(1))
    assert status["restarts"] == {"failure": 1}
    assert status["lastRestartReason"] == "PodFailed"
    pods = pods_of(kubectl, namespace, JOB)
    assert sorted(p["metadata"]["name"] for p in pods) == sorted([CHIEF, *WORKERS, PS, EVALUATOR])
    assert {p["metadata"]["labels"][contract.ATTEMPT_LABEL] for p in pods} == {"1"}
