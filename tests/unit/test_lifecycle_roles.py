"""controller.planner.plan through the lives of TensorFlow jobs with replica roles (spec.tensorflow) in
a fake cluster (tests.unit.lifecycle_world): the pods each role gets, the chief's success, a failure of
any role of the training cluster restarting the gang, and the evaluator's failures recorded without
failing or restarting the job (docs/api.md's table of the roles; controller/planner/roles.py).

Slots (crd/replicas.py) of the job most tests use, ParameterServerStrategy with an evaluator: 0 the
chief, 1 and 2 the workers, 3 the parameter server, 4 the evaluator.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from controller.planner import roles
from controller.planner.facts import Facts
from controller.planner.model import Settings
from crd import contract
from crd.spec import parse
from tests.unit.lifecycle_steps import assert_steady, created_pod_names
from tests.unit.lifecycle_world import World, env_of, names, world

ROLES = {
    "spec.framework": "tensorflow",
    "spec.gpusPerWorker": 0,
    "spec.tensorflow": {"chief": 1, "ps": 1, "evaluator": 1},
}
CHIEF, WORKER0, WORKER1, PS, EVALUATOR = range(5)
PODS = ["mnist-chief-0", "mnist-evaluator-0", "mnist-ps-0", "mnist-worker-0", "mnist-worker-1"]


def tf_world(changes: dict[str, Any] | None = None, **kwargs: Any) -> World:
    return world({**ROLES, **(changes or {})}, **kwargs)


def test_every_role_gets_its_pods_and_the_status_counts_them_by_role() -> None:
    w = tf_world()
    first = w.step()
    assert created_pod_names(first) == PODS
    w.run_to_running()
    status = w.status
    assert status["message"] == "5/5 pods running"
    assert status["workers"] == {"pending": 0, "active": 5, "succeeded": 0, "failed": 0}
    one = {"pending": 0, "active": 1, "succeeded": 0, "failed": 0}
    assert status["roles"] == {
        "chief": one,
        "worker": {**one, "active": 2},
        "ps": one,
        "evaluator": one,
    }
    assert status["roleSummary"] == "chief 1/1, worker 2/2, ps 1/1, evaluator 1/1"
    # The scale subresource counts the workers, what numWorkers (kubectl scale) sets.
    assert status["replicas"] == 2
    assert_steady(w)


def test_a_job_of_workers_only_has_no_role_status() -> None:
    w = world({"spec.framework": "tensorflow", "spec.gpusPerWorker": 0})
    w.run_to_running()
    assert "roles" not in w.status
    assert "roleSummary" not in w.status
    assert w.status["message"] == "2/2 workers running"


@pytest.mark.parametrize("policy", ["Running", "None"])
def test_the_chiefs_success_completes_the_job_and_stops_the_others(policy: str) -> None:
    w = tf_world({"spec.cleanPodPolicy": policy})
    w.run_to_running()
    w.succeed(CHIEF)
    result = w.step()
    assert w.state == "Completed"
    succeeded = w.condition("Succeeded")
    assert succeeded is not None
    assert (succeeded["reason"], succeeded["message"]) == ("ChiefSucceeded", "chief mnist-chief-0 succeeded")
    # Parameter servers (and ParameterServerStrategy's workers) serve until they are stopped: the job's
    # end stops them, whatever cleanPodPolicy says.
    assert names(result.deletes) == ["mnist-evaluator-0", "mnist-ps-0", "mnist-worker-0", "mnist-worker-1"]


def test_the_workers_success_alone_does_not_complete_a_job_with_a_chief() -> None:
    w = tf_world()
    w.run_to_running()
    w.succeed(WORKER0, WORKER1)
    w.step()
    assert w.state == "Running"


@pytest.mark.parametrize(
    ("slot", "pod"), [(CHIEF, "mnist-chief-0"), (WORKER1, "mnist-worker-1"), (PS, "mnist-ps-0")]
)
def test_a_failure_in_the_training_cluster_restarts_the_gang(slot: int, pod: str) -> None:
    w = tf_world()
    w.run_to_running()
    w.exit(slot, 1, message="boom")
    result = w.step()
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"failure": 1}
    assert f"pod {pod}, container trainer, exit code 1" in w.status["message"]
    # The whole gang goes, every role's pods (the failed one too: its pod is replaced).
    assert names(result.deletes) == PODS


def test_a_failure_in_the_training_cluster_counts_against_the_backoff_limit() -> None:
    w = tf_world({"spec.failurePolicy.backoffLimit": 0})
    w.run_to_running()
    w.exit(PS, 1)
    w.step()
    assert (w.state, w.status["failureReason"]) == ("Failed", "BackoffLimitExceeded")


def test_the_evaluators_failure_is_recorded_and_neither_fails_nor_restarts_the_job() -> None:
    w = tf_world()
    w.run_to_running()
    w.exit(EVALUATOR, 1, message="evaluation crashed")
    result = w.step()
    assert w.state == "Running"
    assert result.deletes == []
    assert result.creates == []
    assert "restarts" not in w.status
    recorded = w.condition("EvaluatorFailed")
    assert recorded is not None
    assert (recorded["status"], recorded["reason"]) == ("True", "Error")
    assert recorded["message"] == (
        "pod mnist-evaluator-0, container trainer, exit code 1, reason Error: evaluation crashed"
    )
    assert [(event.type, event.reason) for event in result.events] == [("Warning", "EvaluatorFailed")]
    assert "the job goes on without it" in result.events[0].message
    assert w.status["message"] == "4/4 pods running"
    assert w.status["roles"]["evaluator"]["failed"] == 1
    assert w.status["roleSummary"] == "chief 1/1, worker 2/2, ps 1/1, evaluator 0/1"
    # Recorded once: the next reconciles write nothing, and the failed pod stays for its logs.
    assert_steady(w)
    # The chief still completes the job.
    w.succeed(CHIEF)
    w.step()
    assert w.state == "Completed"


def test_a_lost_evaluator_is_recorded_and_not_replaced_within_the_attempt() -> None:
    w = tf_world()
    w.run_to_running()
    w.disrupt(EVALUATOR, "EvictionByEvictionAPI")
    result = w.step()
    assert w.state == "Running"
    assert "restarts" not in w.status
    recorded = w.condition("EvaluatorFailed")
    assert recorded is not None
    assert recorded["reason"] == "EvictionByEvictionAPI"
    assert [event.reason for event in result.events] == ["EvaluatorFailed"]
    # Its pod goes; no new one is made before the next gang attempt.
    w.finish_terminating()
    assert "mnist-evaluator-0" not in w.pods
    after = w.settle()
    assert after.creates == []
    assert w.status["message"] == "4/4 pods running"
    scheduled = w.condition("Scheduled")
    assert scheduled is not None
    assert scheduled["status"] == "True"


def test_a_lost_parameter_server_restarts_the_gang() -> None:
    w = tf_world()
    w.run_to_running()
    w.disrupt(PS, "PreemptionByScheduler")
    w.step()
    assert w.state == "Restarting"
    assert w.status["restarts"] == {"disruption": 1}


def test_the_next_attempt_starts_a_new_evaluator_and_clears_the_record() -> None:
    w = tf_world({"spec.failurePolicy.restartBackoff": {"initialDelaySeconds": 0}})
    w.run_to_running()
    w.exit(EVALUATOR, 1)
    w.step()
    w.exit(WORKER0, 1)
    w.step()
    assert w.state == "Restarting"
    w.finish_terminating()
    w.settle()
    assert sorted(w.pods) == PODS
    assert {pod["metadata"]["labels"][contract.ATTEMPT_LABEL] for pod in w.pods.values()} == {"1"}
    recorded = w.condition("EvaluatorFailed")
    assert recorded is not None
    assert (recorded["status"], recorded["reason"]) == ("False", "GangRestarted")


def test_without_a_chief_every_worker_completes_the_job_and_the_evaluator_is_stopped() -> None:
    w = tf_world({"spec.tensorflow": {"evaluator": 1}, "spec.cleanPodPolicy": "None"})
    w.run_to_running()
    w.succeed(0)
    w.step()
    assert w.state == "Running"
    w.succeed(1)
    result = w.step()
    assert w.state == "Completed"
    succeeded = w.condition("Succeeded")
    assert succeeded is not None
    assert (succeeded["reason"], succeeded["message"]) == ("AllWorkersSucceeded", "all 2 workers succeeded")
    assert names(result.deletes) == ["mnist-evaluator-0"]


def test_without_a_chief_rank_zero_is_worker_zero() -> None:
    w = tf_world({"spec.tensorflow": {"evaluator": 1}, "spec.successPolicy.mode": "RankZero"})
    w.run_to_running()
    w.succeed(0)
    result = w.step()
    assert w.state == "Completed"
    assert names(result.deletes) == ["mnist-evaluator-0", "mnist-worker-1"]


def test_the_chiefs_progress_reports_count() -> None:
    w = tf_world()
    w.run_to_running()
    w.report(WORKER0, epoch=9, totalEpochs=10)
    w.report(CHIEF, epoch=2, totalEpochs=10, checkpoint="/checkpoints/epoch-2")
    w.step()
    assert (w.status["currentEpoch"], w.status["checkpoint"]["latest"]) == (2, "/checkpoints/epoch-2")


def test_a_deleted_parameter_server_restarts_the_gang() -> None:
    w = tf_world()
    w.run_to_running()
    del w.pods["mnist-ps-0"]
    w.step()
    assert w.state == "Restarting"
    assert w.status["lastRestartReason"] == "PodDeleted"
    assert "mnist-ps-0" in w.status["message"]


def test_completion_is_a_pure_function_of_the_spec_and_the_gang() -> None:
    w = tf_world()
    w.run_to_running()
    facts = Facts(parse(w.job), w.observed(), Settings(), ())
    gang = facts.gang(w.status)
    assert roles.completion(facts.spec, gang) is None
    assert roles.expected(gang) == [0, 1, 2, 3, 4]
    assert roles.unrecorded_evaluator_failure(w.status, gang) is None
    w.succeed(CHIEF)
    done = Facts(parse(w.job), w.observed(), Settings(), ())
    ended = roles.completion(done.spec, done.gang(w.status))
    assert ended is not None
    assert ended.reason == "ChiefSucceeded"
    assert sorted(pod["metadata"]["name"] for pod in ended.stop) == [
        "mnist-evaluator-0",
        "mnist-ps-0",
        "mnist-worker-0",
        "mnist-worker-1",
    ]


def test_scaling_the_workers_rebuilds_every_role_with_the_new_cluster() -> None:
    """kubectl scale sets numWorkers: TF_CONFIG's cluster changes for every role, so the whole gang
    (chief, parameter server and evaluator too) is replaced, counted against no limit."""
    w = tf_world()
    w.run_to_running()
    w.update_spec(numWorkers=3)
    w.step()
    assert (w.state, w.status["lastRestartReason"]) == ("Restarting", "Resized")
    assert w.status["restarts"] == {}
    w.finish_terminating()
    w.step()
    w.settle()
    assert sorted(w.pods) == sorted([*PODS, "mnist-worker-2"])
    chief = env_of(w.pod(CHIEF))
    assert json.loads(chief["TF_CONFIG"])["cluster"]["worker"] == [
        f"mnist-worker-{i}.mnist-headless:29500" for i in range(3)
    ]
