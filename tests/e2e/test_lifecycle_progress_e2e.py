"""Progress reporting end to end: the trainer's identity, stall detection, the success policy, metrics.

The trainer reports progress by patching an annotation on rank 0's pod with the token of the
namespace's ServiceAccount `trainingjob-trainer`, bound to that pod (docs/progress.md). These tests
report exactly like that, with that token alone, and check what the operator makes of it:
`status.currentEpoch`, `metrics`, `checkpoint`, the Stalled condition and its restarts, completion by
target metric or early stopping; and that the token reaches nothing else. The last test reads the
operator's /metrics after restarts and completions of each kind.
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from controller.runtime.clock import parse_time
from crd import contract
from crd.schema_status import STATES
from testbed import Kubectl, end_pod, wait_for
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import (
    condition,
    events_of,
    get_job,
    job_manifest,
    pods_of,
    wait_for_events,
)
from tests.e2e.lifecycle_support import (
    NO_WORKERS,
    Trainer,
    progress_patch,
    report_progress,
    running_pods,
    trainer_kubectl,
    wait_state,
    wait_status,
    wait_workers,
    when,
)
from tests.e2e.operator import OperatorProcess

JsonDict = dict[str, Any]
BACKOFF = {"initialDelaySeconds": 1, "maxDelaySeconds": 2}


@pytest.fixture
def operator(start_operator: StartOperator) -> OperatorProcess:
    """The operator, applying progress reports at most once a second (the default is 5)."""
    return start_operator("--progress-interval=1")


def report_and_wait(
    trainer: Trainer, kubectl: Kubectl, namespace: str, job: str, report: JsonDict
) -> JsonDict:
    """Reports `report` on rank 0 and waits until the operator has taken its epoch into status (or the
    job finished because of it). One report at a time: the operator reads only the latest annotation."""
    report_progress(trainer, namespace, f"{job}-worker-0", report)
    return wait_status(
        kubectl,
        namespace,
        job,
        f"epoch {report['epoch']} in status",
        lambda s: s.get("currentEpoch") == report["epoch"] or s.get("state") == "Completed",
    )


# ------------------------------------------------------------------------------- trainer identity


@pytest.mark.usefixtures("operator")
def test_the_trainer_token_may_patch_only_the_progress_and_run_annotations_of_its_own_pod(
    cluster: Kubectl, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """RBAC lets the namespace's trainer account patch pods and read TrainingJobs; the admission policy
    (crd/trainer-progress-policy.yaml) narrows the patch to the progress and run annotations of the pod
    its token is bound to. Proven with real requests against the real API server."""
    for name in ("alpha", "beta"):
        kubectl.apply(job_manifest(name), "-n", namespace)
    for name in ("alpha", "beta"):
        wait_state(kubectl, namespace, name, "Running")
    trainer = trainer_kubectl(cluster, namespace, "alpha", tmp_path)

    whoami = json.loads(trainer.kubectl.run("auth", "whoami", "-o", "json"))
    user = whoami["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{namespace}:{contract.TRAINER_ACCOUNT}"
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["alpha-worker-0"]

    def can_i(*args: str) -> str:
        result = trainer.kubectl.attempt("auth", "can-i", *args, "-n", namespace)
        return result.stdout.strip()

    assert can_i("patch", "pod/alpha-worker-0") == "yes"
    # An in-place restart's supervisor watches its job: the namespace's TrainingJobs are readable.
    for verb in ("get", "list", "watch"):
        assert can_i(verb, "trainingjobs") == "yes", verb
    refused = [
        ("get", "pod/alpha-worker-0"),
        ("get", "pod/beta-worker-0"),
        ("delete", "pod/alpha-worker-0"),
        ("update", "pod/alpha-worker-0"),
        ("patch", "pod/alpha-worker-0", "--subresource=status"),
        ("create", "pods/exec"),
        ("list", "pods"),
        ("create", "pods"),
        ("get", "secrets"),
        ("get", "configmaps"),
        ("patch", "trainingjob/alpha"),
        ("patch", "trainingjob/alpha", "--subresource=status"),
        ("delete", "trainingjob/alpha"),
    ]
    for args in refused:
        assert can_i(*args) == "no", args

    # Real requests: the report on its own rank 0 is accepted and reaches status.
    report_progress(trainer, namespace, "alpha-worker-0", {"epoch": 1, "metrics": {"accuracy": 0.5}})
    status = wait_status(kubectl, namespace, "alpha", "epoch 1", lambda s: s.get("currentEpoch") == 1)
    assert status["metrics"] == {"accuracy": 0.5}
    job = json.loads(trainer.kubectl.run("get", "trainingjob", "alpha", "-n", namespace, "-o", "json"))
    assert job["metadata"]["name"] == "alpha"
    # The run annotation of its own pod too (an in-place restart's supervisor reports on it).
    run = json.dumps({"attempt": 0, "state": "Running", "at": "2026-03-01T12:00:00.000Z"})
    code, message = trainer.patch_pod(
        namespace, "alpha-worker-0", json.dumps({"metadata": {"annotations": {contract.RUN_ANNOTATION: run}}})
    )
    assert code == 200, message
    # Anything else is refused by the admission policy: another pod's annotation (of this job or
    # another), its own labels, another annotation of its own.
    before = {pod["metadata"]["name"]: pod["metadata"] for pod in pods_of(kubectl, namespace, "alpha")}
    attempts = [
        ("beta-worker-0", progress_patch({"epoch": 9})),
        ("alpha-worker-1", progress_patch({"epoch": 9})),
        ("alpha-worker-1", json.dumps({"metadata": {"annotations": {contract.RUN_ANNOTATION: "{}"}}})),
        ("alpha-worker-0", json.dumps({"metadata": {"labels": {contract.REPLICA_INDEX_LABEL: "7"}}})),
        ("alpha-worker-0", json.dumps({"metadata": {"annotations": {"other": "x"}}})),
        ("alpha-worker-0", json.dumps({"metadata": {"finalizers": ["example.com/hold"]}})),
        # nor take the operator's tracking finalizer off (docs/accounting.md)
        ("alpha-worker-0", json.dumps({"metadata": {"finalizers": None}})),
    ]
    for pod, body in attempts:
        code, message = trainer.patch_pod(namespace, pod, body)
        assert code == 403, (pod, body, code, message)
        assert contract.TRAINER_POLICY in message, message
    after = {pod["metadata"]["name"]: pod["metadata"] for pod in pods_of(kubectl, namespace, "alpha")}
    for name, metadata in after.items():
        assert metadata["labels"] == before[name]["labels"]
        assert "other" not in (metadata.get("annotations") or {})
        assert metadata.get("finalizers") == before[name].get("finalizers") == [contract.TRACKING_FINALIZER]
    for args in (("delete", "pod", "alpha-worker-1", "-n", namespace, "--wait=false"),):
        result = trainer.kubectl.attempt(*args)
        assert result.returncode != 0, args
        assert "Forbidden" in result.stderr, (args, result.stderr)
    assert len(pods_of(kubectl, namespace, "alpha")) == 2
    beta = get_job(kubectl, namespace, "beta")
    assert "currentEpoch" not in beta["status"]

    # Another rank's token reports on its own pod only.
    second = trainer_kubectl(cluster, namespace, "alpha", tmp_path, rank=1)
    assert second.patch_pod(namespace, "alpha-worker-1", progress_patch({"epoch": 1}))[0] == 200
    assert second.patch_pod(namespace, "alpha-worker-0", progress_patch({"epoch": 1}))[0] == 403


# ------------------------------------------------------------------------------------------ stalls


@pytest.mark.usefixtures("operator")
def test_a_job_that_reports_no_progress_is_stalled_until_it_reports_again(
    cluster: Kubectl, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    deadline = 4
    kubectl.apply(job_manifest("quiet", monitoring={"progressDeadlineSeconds": deadline}), "-n", namespace)
    wait_state(kubectl, namespace, "quiet", "Running")
    trainer = trainer_kubectl(cluster, namespace, "quiet", tmp_path)

    status = wait_status(
        kubectl,
        namespace,
        "quiet",
        "Stalled",
        lambda s: (condition(s, "Stalled") or {}).get("status") == "True",
    )
    stalled = condition(status, "Stalled")
    running = condition(status, "Running")
    assert stalled is not None
    assert running is not None
    assert stalled["reason"] == "ProgressDeadlineExceeded"
    assert "no progress reported for" in stalled["message"]
    assert f"over monitoring.progressDeadlineSeconds ({deadline}s) (no report yet)" in stalled["message"]
    assert (
        when(stalled["lastTransitionTime"]) - when(running["lastTransitionTime"])
    ).total_seconds() >= deadline
    # A stall is reported, not acted on: the job keeps running.
    assert status["state"] == "Running"
    assert status["restartCount"] == 0
    events = wait_for_events(kubectl, namespace, "quiet", {"Stalled": ["no progress reported for"]})
    assert {e["type"] for e in events if e["reason"] == "Stalled"} == {"Warning"}

    report_progress(trainer, namespace, "quiet-worker-0", {"epoch": 1})
    status = wait_status(
        kubectl,
        namespace,
        "quiet",
        "Stalled False",
        lambda s: (condition(s, "Stalled") or {}).get("status") == "False",
    )
    resumed = condition(status, "Stalled")
    assert resumed is not None
    assert resumed["reason"] == "ProgressResumed"
    assert status["currentEpoch"] == 1
    assert status["state"] == "Running"


@pytest.mark.slow
@pytest.mark.usefixtures("operator")
def test_restart_on_stall_restarts_the_gang_within_the_backoff_limit(
    kubectl: Kubectl, namespace: str
) -> None:
    deadline = 3
    manifest = job_manifest(
        "stuck",
        monitoring={"progressDeadlineSeconds": deadline, "restartOnStall": True},
        failurePolicy={"backoffLimit": 1, "restartBackoff": BACKOFF},
    )
    kubectl.apply(manifest, "-n", namespace)
    wait_state(kubectl, namespace, "stuck", "Running")

    during = wait_status(kubectl, namespace, "stuck", "Restarting", lambda s: s.get("state") == "Restarting")
    assert during["restarts"] == {"stall": 1}
    assert during["lastRestartReason"] == "Stalled"
    stalled = condition(during, "Stalled")
    assert stalled is not None
    assert (stalled["status"], stalled["reason"]) == ("True", "ProgressDeadlineExceeded")
    status = wait_status(
        kubectl,
        namespace,
        "stuck",
        "attempt 1 Running",
        lambda s: (s.get("state"), s.get("attempt")) == ("Running", 1),
    )
    stalled = condition(status, "Stalled")
    assert stalled is not None
    assert (stalled["status"], stalled["reason"]) == ("False", "GangRestarted")

    # The new gang stalls too; a stall restart counts against backoffLimit (1), so now the job fails.
    status = wait_state(kubectl, namespace, "stuck", "Failed")["status"]
    assert status["failureReason"] == "BackoffLimitExceeded"
    assert "backoffLimit exhausted" in status["message"]
    assert status["restarts"] == {"stall": 1}


@pytest.mark.slow
def test_reports_held_back_by_the_progress_interval_are_not_a_stall(
    cluster: Kubectl, kubectl: Kubectl, namespace: str, tmp_path: Path, start_operator: StartOperator
) -> None:
    """The operator copies reports into status at most every --progress-interval (5 s by default), so
    lastProgressTime lags behind a trainer that reports every second. With progressDeadlineSeconds
    shorter than that interval the job must still not count as stalled while new reports arrive."""
    start_operator()  # the default --progress-interval of 5 s
    # Shorter than the interval, but several times the cadence: status times have whole seconds (the
    # operator may see up to a second more quiet time than there was), and on a busy machine one
    # kubectl call may take a second.
    deadline = 4
    manifest = job_manifest(
        "chatty",
        monitoring={"progressDeadlineSeconds": deadline, "restartOnStall": True},
        failurePolicy={"backoffLimit": 1, "restartBackoff": BACKOFF},
        hyperparameters={"epochs": 100},
    )
    kubectl.apply(manifest, "-n", namespace)
    wait_state(kubectl, namespace, "chatty", "Running")
    trainer = trainer_kubectl(cluster, namespace, "chatty", tmp_path)

    # The trainer's own cadence (one report a second for ~9 s), not a wait for the operator.
    cadence = threading.Event()
    start = time.monotonic()
    for epoch in range(1, 10):
        before_report = datetime.now(UTC)
        report_progress(trainer, namespace, "chatty-worker-0", {"epoch": epoch})
        cadence.wait(max(0.0, start + epoch - time.monotonic()))

    # Reports stop: now it is a stall, and the gang restarts. That restart is the first and only one,
    # and it came no earlier than the deadline after the last report (less the second whole-second
    # status times may lose): no stall was seen while reports arrived, even though status held them
    # back for longer than the deadline.
    status = wait_status(kubectl, namespace, "chatty", "Restarting", lambda s: s.get("state") == "Restarting")
    assert status["restarts"] == {"stall": 1}
    restarting = condition(status, "Restarting")
    assert restarting is not None
    assert (restarting["status"], restarting["reason"]) == ("True", "Stalled")
    assert "(last report: epoch 9)" in restarting["message"]
    stalled_at = parse_time(restarting["lastTransitionTime"])
    assert stalled_at >= before_report + timedelta(seconds=deadline - 1), (stalled_at, before_report)


# ---------------------------------------------------------------------------------- success policy


@pytest.mark.usefixtures("operator")
def test_reaching_the_target_accuracy_completes_the_job_and_stops_the_workers(
    cluster: Kubectl, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    manifest = job_manifest("target", successPolicy={"targetAccuracy": 0.9}, hyperparameters={"epochs": 10})
    kubectl.apply(manifest, "-n", namespace)
    wait_state(kubectl, namespace, "target", "Running")
    trainer = trainer_kubectl(cluster, namespace, "target", tmp_path)

    status = report_and_wait(
        trainer, kubectl, namespace, "target", {"epoch": 1, "metrics": {"accuracy": 0.5}}
    )
    assert status["state"] == "Running"
    assert (status["progress"], status["totalEpochs"]) == ("10%", 10)
    report_progress(trainer, namespace, "target-worker-0", {"epoch": 2, "metrics": {"accuracy": 0.93}})

    status = wait_state(kubectl, namespace, "target", "Completed")["status"]
    succeeded = condition(status, "Succeeded")
    assert succeeded is not None
    assert (succeeded["status"], succeeded["reason"]) == ("True", "TargetReached")
    assert status["message"] == "accuracy 0.93 reached the target 0.9"
    assert status["metrics"] == {"accuracy": 0.93}
    assert "failureReason" not in status
    wait_for("the workers stopped", lambda: pods_of(kubectl, namespace, "target") == [])
    # status.workers (the Workers column) follows: no worker of a finished job is shown running.
    wait_workers(kubectl, namespace, "target", NO_WORKERS)
    wait_for_events(kubectl, namespace, "target", {"TargetReached": ["Completed: accuracy 0.93 reached"]})


@pytest.mark.usefixtures("operator")
def test_no_improvement_for_the_patience_stops_the_job_early(
    cluster: Kubectl, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    policy = {"earlyStoppingPatience": 2, "metric": "loss", "metricMode": "min", "minDelta": 0.01}
    kubectl.apply(job_manifest("patience", successPolicy=policy), "-n", namespace)
    wait_state(kubectl, namespace, "patience", "Running")
    trainer = trainer_kubectl(cluster, namespace, "patience", tmp_path)

    # 0.8 at epoch 2 is the best; 0.795 is not better by more than minDelta, 0.81 is worse.
    for epoch, loss in ((1, 1.0), (2, 0.8), (3, 0.795)):
        status = report_and_wait(
            trainer, kubectl, namespace, "patience", {"epoch": epoch, "metrics": {"loss": loss}}
        )
        assert status["state"] == "Running", status
    assert status["bestMetric"] == {"value": 0.8, "epoch": 2}
    report_progress(trainer, namespace, "patience-worker-0", {"epoch": 4, "metrics": {"loss": 0.81}})

    status = wait_state(kubectl, namespace, "patience", "Completed")["status"]
    succeeded = condition(status, "Succeeded")
    assert succeeded is not None
    assert (succeeded["status"], succeeded["reason"]) == ("True", "EarlyStopped")
    assert status["message"] == "loss has not improved on 0.8 (epoch 2) for 2 epochs (patience 2)"
    assert status["currentEpoch"] == 4
    wait_for("the workers stopped", lambda: pods_of(kubectl, namespace, "patience") == [])


# ----------------------------------------------------------------------------------------- metrics

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    parsed = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if line.startswith("#") or match is None:
            continue
        labels = {m["key"]: m["value"] for m in LABEL.finditer(match["labels"] or "")}
        parsed.append((match["name"], labels, float(match["value"])))
    return parsed


@pytest.mark.slow
def test_metrics_count_restarts_by_cause_and_time_jobs_to_running_and_completion(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator("--progress-interval=1")
    quick = {"restartBackoff": BACKOFF}
    jobs = {
        "m-ok": job_manifest("m-ok", failurePolicy=quick),
        "m-preempted": job_manifest("m-preempted", failurePolicy={**quick, "backoffLimit": 0}),
        "m-stalled": job_manifest(
            "m-stalled",
            failurePolicy={**quick, "backoffLimit": 1},
            monitoring={"progressDeadlineSeconds": 2, "restartOnStall": True},
        ),
    }
    for manifest in jobs.values():
        kubectl.apply(manifest, "-n", namespace)
    for name in jobs:
        wait_state(kubectl, namespace, name, "Running")

    # m-ok: a failure restart, then success. m-preempted: a disruption restart, then a failure with
    # backoffLimit 0. m-stalled: a stall restart, then a second stall fails it.
    end_pod(kubectl, namespace, "m-ok-worker-1", exit_code=1)
    end_pod(kubectl, namespace, "m-preempted-worker-0", exit_code=143, disruption="PreemptionByScheduler")
    for name in ("m-ok", "m-preempted"):
        wait_status(
            kubectl,
            namespace,
            name,
            "attempt 1 Running",
            lambda s: (s.get("state"), s.get("attempt")) == ("Running", 1),
        )
        running_pods(kubectl, namespace, name, 1, 2)
    for index in range(2):
        end_pod(kubectl, namespace, f"m-ok-worker-{index}", exit_code=0)
    end_pod(kubectl, namespace, "m-preempted-worker-1", exit_code=1)
    wait_state(kubectl, namespace, "m-ok", "Completed")
    wait_state(kubectl, namespace, "m-preempted", "Failed")
    wait_state(kubectl, namespace, "m-stalled", "Failed")

    def value(name: str, **labels: str) -> float | None:
        return operator.metric(name, namespace=namespace, **labels)

    assert value("trainingjob_restarts_total", reason="failure") == 1
    assert value("trainingjob_restarts_total", reason="disruption") == 1
    assert value("trainingjob_restarts_total", reason="stall") == 1
    assert value("trainingjob_restarts_total", reason="scheduling") in (None, 0)
    # Each job reached Running once before any restart; each finished once.
    assert value("trainingjob_time_to_running_seconds_count") == 3
    running_sum = value("trainingjob_time_to_running_seconds_sum")
    assert running_sum is not None
    assert running_sum > 0
    assert value("trainingjob_time_to_complete_seconds_count", result="succeeded") == 1
    assert value("trainingjob_time_to_complete_seconds_count", result="failed") == 2
    wait_for(
        "trainingjob_jobs by state",
        lambda: (
            value("trainingjob_jobs", state="Completed") == 1
            and value("trainingjob_jobs", state="Failed") == 2
        ),
    )
    assert value("trainingjob_jobs", state="Running") in (None, 0)

    # Labels are bounded: no pod names, restart reasons from the fixed set.
    every = samples(operator.metrics())
    for name, labels, _ in every:
        for key, label in labels.items():
            assert "-worker-" not in label, (name, key, label)
    reasons = {labels["reason"] for name, labels, _ in every if name == "trainingjob_restarts_total"}
    assert reasons <= {"failure", "disruption", "scheduling", "stall", "other"}, reasons
    states = {labels["state"] for name, labels, _ in every if name == "trainingjob_jobs"}
    assert states <= set(STATES), states
    assert events_of(kubectl, namespace, "m-ok")


def test_metrics_count_a_resize_restart_as_other(
    kubectl: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator()
    kubectl.apply(job_manifest("grow"), "-n", namespace)
    wait_state(kubectl, namespace, "grow", "Running")
    kubectl.run(
        "patch", "trainingjob", "grow", "-n", namespace, "--type=merge", "-p", '{"spec":{"numWorkers":3}}'
    )
    status = wait_status(
        kubectl,
        namespace,
        "grow",
        "3 workers running",
        lambda s: s.get("state") == "Running" and s.get("workers", {}).get("active") == 3,
    )
    assert (status["restartCount"], status["lastRestartReason"]) == (1, "Resized")
    # sum(trainingjob_restarts_total) agrees with status.restartCount.
    assert operator.metric("trainingjob_restarts_total", namespace=namespace, reason="other") == 1
