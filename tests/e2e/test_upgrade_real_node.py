"""An operator upgrade that no running job notices: `make deploy` and `helm upgrade` over the previous
version, with jobs in every state, on the real node.

Why: an upgrade replaces the operator's pods under jobs that keep running. Here the previous version
(the commit pinned in testbed/images/previous.py, its image built by the same recipe, its manifests
and chart from its own tree) runs as two replicas on the real node and owns jobs in every state: one
training on the real node (real torch, reporting progress), and on the kwok nodes one running, one
queued, one suspended, one waiting out a restart backoff, one elastic. Then this tree is deployed over
it, and each job must be as it was: the same pods (uids), no restart counted, every status field kept
(but the training's progress, which must go on; a message may be worded otherwise), and the Lease
held by a pod of the new version. Measured: 72 s for both upgrades (the session's cluster, its real
node and the images ready).

The rollout is held halfway (`minReadySeconds` keeps the new pod from counting as available, so the
old ones stay): pods of both versions run at once, and only the Lease's holder reconciles and writes
(the others' reconcile and PATCH/DELETE counters stay 0 while a new job is made); the holder's pod is
then deleted, as a node drain would, and the Lease passes to one pod, never two. Then the same upgrade
through Helm: the previous commit's chart installed (the previous version now reads what this one
wrote: a rollback), upgraded to this tree's chart.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import pytest

from crd import contract
from testbed import PREVIOUS_OPERATOR_COMMIT, REGISTRY, Image, Kubectl, end_pod, is_ready, wait_for
from tests.cluster import REPO
from tests.e2e.deployed_operator import (
    HELM_PLACEMENT_FLAGS,
    NODE_SELECTOR,
    TOLERATE,
    holder_pod,
    operator_pods,
    wait_lease_free,
    wait_ready_replicas,
)
from tests.e2e.jobs import get_job, job_manifest, pods_of, wait_for_state
from tests.e2e.lifecycle_support import backoff, running_attempt, wait_status
from tests.e2e.metrics_access import metrics_reader
from tests.e2e.operator_identity import NAMESPACE as OPERATOR_NAMESPACE
from tests.e2e.realnode import training_job
from tests.helmchart import CHART, RELEASE, Helm

pytestmark = [pytest.mark.slow, pytest.mark.images("operator-previous")]

JsonDict = dict[str, Any]
SELECTOR: Final = "app.kubernetes.io/name=trainingjob-operator,app.kubernetes.io/component=controller"
PULL_SECRET: Final = "registry-credentials"
DEPLOYMENT: Final = "trainingjob-operator"
# Status fields that move while a job trains, and the wall-clock duration.
PROGRESSING: Final = frozenset(
    {
        "progress",
        "currentEpoch",
        "step",
        "metrics",
        "bestMetric",
        "lastProgressTime",
        "checkpoint",
        "duration",
    }
)
TRAINING: Final = "trains"
KWOK_JOBS: Final = ("steady", "queued", "suspended", "backing-off", "elastic")

# Run inside an operator container: its reconcile and write counters, read from its own /metrics
# with the token on stdin (the certificate is self-signed).
COUNTERS = """
import json, ssl, sys, urllib.request
request = urllib.request.Request(
    "https://127.0.0.1:8443/metrics", headers={"Authorization": "Bearer " + sys.stdin.read().strip()}
)
text = urllib.request.urlopen(request, timeout=10, context=ssl._create_unverified_context()).read().decode()
found = {"reconciles": 0.0, "PATCH": 0.0, "DELETE": 0.0, "leader": 0.0}
for line in text.splitlines():
    if line.startswith("controller_runtime_reconcile_total{"):
        found["reconciles"] += float(line.split()[-1])
    elif line.startswith("rest_client_requests_total{"):
        for method in ("PATCH", "DELETE"):
            if 'method="%s"' % method in line:
                found[method] += float(line.split()[-1])
    elif line.startswith("leader_election_master_status"):
        found["leader"] = float(line.split()[-1])
print(json.dumps(found))
"""


def make_in(tree: Path, targets: str, cluster: Kubectl, **variables: str) -> None:
    """`make <targets>` in `tree` (this one or the previous version's) against `cluster`."""
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    args = ["make", "--no-print-directory", *targets.split(), f"KUBECTL={cluster.binary}"]
    args += [f"{key}={value}" for key, value in variables.items()]
    result = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, f"make {targets} in {tree}:\n{result.stdout}\n{result.stderr}"


def previous_tree(directory: Path, commit: str) -> Path:
    """The previous version's files (`git archive` of the pinned commit)."""
    archive = directory / "previous.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", f"--output={archive}", commit], check=True)
    tree = directory / "previous"
    tree.mkdir()
    subprocess.run(["tar", "-xf", str(archive), "-C", str(tree)], check=True)
    return tree


def pushed(image: Image, tag: str) -> str:
    """`image` pushed to the local registry under a tag of this test's own; its reference there."""
    path = f"trainingjob-operator:{tag}-{uuid.uuid4().hex[:8]}"
    REGISTRY.push(image, path)
    return REGISTRY.reference(path)


def pull_access(cluster: Kubectl, tree: Path) -> None:
    """The operator's namespace and the pull Secret in it (deploy/README.md's first steps)."""
    cluster.run("apply", "-f", str(tree / "deploy" / "base" / "namespace.yaml"))
    cluster.run("delete", "secret", PULL_SECRET, "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
    cluster.run(
        *("create", "secret", "generic", PULL_SECRET, "-n", OPERATOR_NAMESPACE),
        *("--type=kubernetes.io/dockerconfigjson", f"--from-file=.dockerconfigjson={REGISTRY.auth_file}"),
    )


def image_of(pod: JsonDict) -> str:
    return str(pod["spec"]["containers"][0]["image"])


def counters(cluster: Kubectl, pod: str, token: str) -> dict[str, float]:
    output = cluster.run(
        *("exec", "-i", "-n", OPERATOR_NAMESPACE, pod, "-c", "operator", "--", "python", "-c", COUNTERS),
        stdin=token,
    )
    found = json.loads(output.strip().splitlines()[-1])
    assert isinstance(found, dict)
    return {str(key): float(value) for key, value in found.items()}


def wait_holder(cluster: Kubectl, among: Callable[[JsonDict], bool], timeout: float = 90) -> str:
    """The name of the pod holding the Lease, once it is one of the Ready pods `among` accepts."""

    def probe() -> str | None:
        pods = [pod for pod in operator_pods(cluster, SELECTOR) if is_ready(pod) and among(pod)]
        return holder_pod(cluster, pods)

    return wait_for("the Lease held by the expected pods", probe, timeout=timeout)


# ------------------------------------------------------------------------------------------- jobs


def start_jobs(cluster: Kubectl, namespace: str) -> None:
    """A job in each state; returns once each is in it."""
    on_node = training_job(TRAINING, 1000, env={"TRAIN_STEP_SECONDS": "1"})
    queued = job_manifest("queued")
    queued["metadata"]["labels"] = {contract.QUEUE_NAME_LABEL: "no-such-queue"}
    elastic = job_manifest("elastic", numWorkers=3, elastic={"minWorkers": 2, "maxWorkers": 3})
    for manifest in (
        on_node,
        job_manifest("steady"),
        queued,
        job_manifest("suspended", suspend=True),
        job_manifest("backing-off", failurePolicy={"restartBackoff": backoff(3600)}),
        elastic,
    ):
        cluster.apply(manifest, "-n", namespace)
    for name in ("steady", "elastic"):
        wait_for_state(cluster, namespace, name, "Running", timeout=120)
    wait_for_state(cluster, namespace, "queued", "Queued", timeout=120)
    wait_for_state(cluster, namespace, "suspended", "Suspended", timeout=120)
    wait_status(cluster, namespace, "backing-off", "attempt 0 Running", running_attempt(0))
    end_pod(cluster, namespace, "backing-off-worker-1", exit_code=1)
    wait_status(cluster, namespace, "backing-off", "in its backoff", lambda s: s.get("restartCount") == 1)
    wait_status(cluster, namespace, TRAINING, "training", lambda s: int(s.get("step") or 0) > 0, timeout=240)


def worded(status: JsonDict) -> JsonDict:
    """`status` with its messages (its own and its conditions') as present or not: a newer version may
    word a message otherwise, and that is no field lost or reset."""
    kept = {key: value for key, value in status.items() if key not in PROGRESSING}
    if "message" in kept:
        kept["message"] = bool(kept["message"])
    kept["conditions"] = [
        {**condition, "message": bool(condition.get("message"))} for condition in kept.get("conditions") or []
    ]
    return kept


def snapshot(cluster: Kubectl, namespace: str) -> dict[str, JsonDict]:
    """Per job: its generation, its status but what progresses (messages as present or not), its
    pods' uids and restart counts."""
    found = {}
    for name in (TRAINING, *KWOK_JOBS):
        job = get_job(cluster, namespace, name)
        status = worded(job.get("status") or {})
        pods = {
            pod["metadata"]["name"]: (
                pod["metadata"]["uid"],
                [c.get("restartCount", 0) for c in (pod.get("status") or {}).get("containerStatuses") or []],
            )
            for pod in pods_of(cluster, namespace, name)
        }
        found[name] = {"generation": job["metadata"]["generation"], "status": status, "pods": pods}
    return found


def training_step(cluster: Kubectl, namespace: str) -> int:
    return int(get_job(cluster, namespace, TRAINING).get("status", {}).get("step") or 0)


def assert_undisturbed(cluster: Kubectl, namespace: str, before: dict[str, JsonDict], step: int) -> int:
    """Every job as `before` says, and the training's progress past `step` (waited for: the new
    leader applies the next report); returns the step it reached."""
    reached = wait_for(
        "the training's progress applied after the upgrade",
        lambda: (now := training_step(cluster, namespace)) > step and now,
        timeout=120,
    )
    after = snapshot(cluster, namespace)
    for name, was in before.items():
        assert after[name] == was, name
    return int(reached)


# ------------------------------------------------------------------------------------------- phases


@contextmanager
def rollout_held(cluster: Kubectl) -> Iterator[None]:
    """The Deployment's new pods count as available only after 9 minutes (below its progress deadline,
    10), so that its rollout stops halfway (maxSurge 1, maxUnavailable 0: one new pod beside the old
    two); released on exit."""

    def min_ready_seconds(seconds: int) -> None:
        patch = json.dumps({"spec": {"minReadySeconds": seconds}})
        cluster.run(
            *("patch", "deployment", DEPLOYMENT, "-n", OPERATOR_NAMESPACE, "--field-manager=upgrade-test"),
            *("--type=merge", "-p", patch),
        )

    min_ready_seconds(540)
    try:
        yield
    finally:
        min_ready_seconds(0)


def only_the_holder_writes(cluster: Kubectl, namespace: str, new_image: str, token: str) -> None:
    """Halfway through the rollout: both versions run, one pod holds the Lease and it alone
    reconciles and writes while a job is made; then its pod is deleted and one other pod takes the
    Lease."""

    def halfway() -> list[JsonDict] | None:
        pods = [pod for pod in operator_pods(cluster, SELECTOR) if is_ready(pod)]
        new = [pod for pod in pods if image_of(pod) == new_image]
        return pods if len(pods) == 3 and len(new) == 1 else None

    pods = wait_for("the rollout halfway: two old pods and one new, Ready", halfway, timeout=180)
    names = [pod["metadata"]["name"] for pod in pods]
    holder = wait_holder(cluster, lambda pod: image_of(pod) != new_image)
    before = {name: counters(cluster, name, token) for name in names}
    cluster.apply(job_manifest("halfway"), "-n", namespace)
    wait_for_state(cluster, namespace, "halfway", "Running", timeout=120)
    after = {name: counters(cluster, name, token) for name in names}
    for name in names:
        if name == holder:
            assert after[name]["leader"] == 1.0
            assert after[name]["reconciles"] > before[name]["reconciles"]
            assert after[name]["PATCH"] > before[name]["PATCH"], after[name]
        else:
            assert after[name] == {"reconciles": 0.0, "PATCH": 0.0, "DELETE": 0.0, "leader": 0.0}, name

    # The upgrade interrupted: the holder's pod goes (a drain, a crash); exactly one pod leads next.
    cluster.run("delete", "pod", holder, "-n", OPERATOR_NAMESPACE, "--wait=false")
    successor = wait_holder(cluster, lambda pod: pod["metadata"]["name"] != holder)
    cluster.run("delete", "trainingjob", "halfway", "-n", namespace, "--wait=true", "--timeout=60s")
    leaders = [
        name
        for name in (pod["metadata"]["name"] for pod in operator_pods(cluster, SELECTOR) if is_ready(pod))
        if counters(cluster, name, token)["leader"] == 1.0
    ]
    assert leaders == [successor]


def upgraded(cluster: Kubectl, new_image: str) -> str:
    """Both replicas of the new version Ready and one of them holding the Lease; returns its name."""

    def rolled_out() -> bool:
        pods = operator_pods(cluster, SELECTOR)
        return len(pods) == 2 and all(is_ready(pod) and image_of(pod) == new_image for pod in pods)

    wait_for("the rollout finished", rolled_out, timeout=240)
    return wait_holder(cluster, lambda pod: image_of(pod) == new_image)


# ------------------------------------------------------------------------------------------- test


def test_upgrades_by_make_deploy_and_helm_leave_running_jobs_as_they_were(
    registry: Kubectl,
    namespace: str,
    node_images: Callable[[str], Image],
    helm: Path,
    tmp_path: Path,
) -> None:
    cluster = registry
    previous = previous_tree(tmp_path, PREVIOUS_OPERATOR_COMMIT)
    old_image = pushed(node_images("operator-previous"), "previous")
    new_image = pushed(node_images("operator"), "upgrade")
    placement = {"IMAGE_PULL_SECRETS": PULL_SECRET, "NODE_SELECTOR": NODE_SELECTOR, "TOLERATE": TOLERATE}
    chart = Helm(helm, tmp_path / "helm", cluster.kubeconfig)
    wait_lease_free(cluster)
    began = time.monotonic()
    with metrics_reader(cluster, namespace) as token:
        try:
            # make deploy: the previous version, its jobs, then this tree over it, held halfway.
            pull_access(cluster, previous)
            make_in(previous, "deploy", cluster, IMG=old_image, **placement)
            wait_ready_replicas(cluster, SELECTOR, 2)
            start_jobs(cluster, namespace)
            before = snapshot(cluster, namespace)
            step = training_step(cluster, namespace)
            with rollout_held(cluster):
                make_in(REPO, "deploy", cluster, IMG=new_image, **placement)
                only_the_holder_writes(cluster, namespace, new_image, token)
            upgraded(cluster, new_image)
            step = assert_undisturbed(cluster, namespace, before, step)
            print(f"\nmake deploy upgrade: {time.monotonic() - began:.0f}s")

            # Helm: the previous chart (a rollback to the previous version, which reads what this
            # one wrote), then `helm upgrade` to this tree's chart.
            make_in(REPO, "undeploy", cluster)
            pull_access(cluster, REPO)
            old_repository, old_tag = old_image.rsplit(":", 1)
            new_repository, new_tag = new_image.rsplit(":", 1)
            common = (
                *("--namespace", OPERATOR_NAMESPACE, "--set", "crds.install=false"),
                *("--set", f"imagePullSecrets[0].name={PULL_SECRET}", *HELM_PLACEMENT_FLAGS),
                *("--wait", "--timeout=4m"),
            )
            old_chart = str(previous / CHART.relative_to(REPO))
            old_values = ("--set", f"image.repository={old_repository}", "--set", f"image.tag={old_tag}")
            chart.run("install", RELEASE, old_chart, *common, *old_values)
            wait_holder(cluster, lambda pod: image_of(pod) == old_image)
            assert_undisturbed(cluster, namespace, before, step)
            step = training_step(cluster, namespace)
            new_values = ("--set", f"image.repository={new_repository}", "--set", f"image.tag={new_tag}")
            chart.run("upgrade", RELEASE, str(CHART), *common, *new_values)
            upgraded(cluster, new_image)
            assert_undisturbed(cluster, namespace, before, step)
            print(f"with the helm upgrade: {time.monotonic() - began:.0f}s")
        finally:
            cluster.run("delete", "trainingjobs", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
            if chart.attempt("status", RELEASE, "--namespace", OPERATOR_NAMESPACE).returncode == 0:
                chart.attempt(
                    "uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout=3m"
                )
            elif cluster.get_or_none("deployment", DEPLOYMENT, "-n", OPERATOR_NAMESPACE):
                make_in(REPO, "undeploy", cluster)
            cluster.run("delete", "namespace", OPERATOR_NAMESPACE, "--ignore-not-found", "--timeout=120s")
