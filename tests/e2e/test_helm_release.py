"""The Helm chart installed for real: `helm install`, `helm upgrade`, `helm uninstall` on a local cluster,
and a working operator after each step.

Runs on a throwaway control plane of its own (like tests/e2e/test_make_deploy.py), because a release
installs and removes the CRD and the operator's cluster-wide RBAC, which the other tests share. The
cluster starts without the TrainingJob CRD, as a new one would.

The local cluster runs no container images: kwok marks the Deployment's pods Running and Ready, so
`helm install --wait` and the rollout behave as on a real cluster, but no operator runs inside them.
So, as tests/e2e/conftest.py does for every end-to-end test, the operator runs here as a process with
the release's identity: a token of the ServiceAccount the release created, and the arguments and
environment of the Deployment as the API server holds it (only the metrics address is moved to
127.0.0.1 and a free port). A TrainingJob it brings to Running proves the release's RBAC, its leader
election Role and its flags work; after an upgrade, the new flags are the ones that run.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from crd import contract
from crd.render import CRD_FILE_NAME
from testbed import Kubectl, throwaway_cluster, wait_for
from tests.cluster import REPO
from tests.e2e.jobs import job_manifest, wait_for_state
from tests.e2e.operator import OperatorProcess
from tests.e2e.operator_identity import token_kubeconfig
from tests.helmchart import CHART, NAMESPACE, RELEASE, Helm, expanded, load_all

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

Manifest = dict[str, Any]
CRD_NAME: Final = f"{contract.PLURAL}.{contract.GROUP}"
JOBS_NAMESPACE: Final = "ml-team"
# Everything a release creates besides the CRD, as `kubectl get` names them.
RELEASE_OBJECTS: Final = (
    ("serviceaccount", RELEASE, NAMESPACE),
    ("clusterrole", RELEASE, ""),
    ("clusterrolebinding", RELEASE, ""),
    ("role", f"{RELEASE}-leader-election", NAMESPACE),
    ("rolebinding", f"{RELEASE}-leader-election", NAMESPACE),
    ("deployment", RELEASE, NAMESPACE),
    ("service", f"{RELEASE}-metrics", NAMESPACE),
    ("poddisruptionbudget", RELEASE, NAMESPACE),
)
RELEASE_SECRET_LIMIT: Final = 1024 * 1024  # what the API server stores in one Secret


@dataclass(frozen=True)
class Site:
    """The throwaway cluster, helm pointed at it, and a directory for logs and kubeconfigs."""

    cluster: Kubectl
    helm: Helm
    scratch: Path


@pytest.fixture(scope="module")
def site(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    with throwaway_cluster(tmp_path_factory.mktemp("helm-cluster")) as cluster:
        # The dev cluster installs crd/ (the CRD, the trainers' ClusterRole, the admission policies) as it
        # starts; a new cluster has none of it.
        cluster.run("delete", "customresourcedefinition", CRD_NAME, "--wait=true")
        cluster.run("delete", "clusterrole", contract.TRAINER_CLUSTER_ROLE, "--wait=true")
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            for name in contract.CRD_POLICIES:
                cluster.run("delete", kind, name, "--wait=true")
        # deploy/README.md: the namespace first, with its Pod Security labels (the chart does not own it).
        cluster.run("apply", "-f", str(REPO / "deploy" / "base" / "namespace.yaml"))
        cluster.run("create", "namespace", JOBS_NAMESPACE)
        wait_for(
            f"default ServiceAccount in {JOBS_NAMESPACE}",
            lambda: cluster.get_or_none("serviceaccount", "default", "-n", JOBS_NAMESPACE),
            timeout=60,
        )
        helm_home = tmp_path_factory.mktemp("helm-home")
        yield Site(
            cluster, Helm(helm, helm_home, cluster.kubeconfig), tmp_path_factory.mktemp("helm-scratch")
        )


# --------------------------------------------------------------------------------------- helpers


# The Deployment's flags of the metrics and probe servers, which OperatorProcess sets itself.
SERVING_FLAGS = (
    "--metrics-bind-address=",
    "--health-probe-bind-address=",
    "--metrics-secure=",
    "--metrics-cert-path=",
)


def live_operator_args(deployment: Manifest, namespace: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """The operator's command-line arguments and environment as the kubelet would give them to the
    Deployment's container: fieldRefs to the pod's namespace resolved, `$(VAR)` expanded, and the metrics
    and probe servers left to OperatorProcess (127.0.0.1, free ports, plain HTTP)."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace", item
            env[item["name"]] = namespace
    args = tuple(expanded(arg, env) for arg in container["args"] if not arg.startswith(SERVING_FLAGS))
    return args, env


def start_deployed_operator(site: Site, name: str) -> OperatorProcess:
    """The operator as the release deployed it: its ServiceAccount's token, its flags and env."""
    deployment = site.cluster.get_json("deployment", RELEASE, "-n", NAMESPACE)
    service_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    kubeconfig = token_kubeconfig(
        site.cluster, service_account, NAMESPACE, site.scratch / f"{name}.kubeconfig"
    )
    args, env = live_operator_args(deployment, NAMESPACE)
    operator = OperatorProcess(kubeconfig, site.scratch / f"{name}.log", args, env=env).start()
    try:
        operator.wait_ready(timeout=120)
    except BaseException:
        operator.stop()
        raise
    return operator


def the_deployed_operator_works(site: Site, job: str, *, workers: int) -> None:
    """The operator, run as the release deployed it, leads, runs `workers` workers (its --workers)
    and brings a new TrainingJob `job` in the jobs' namespace to Running (kwok runs its pods)."""
    operator = start_deployed_operator(site, job)
    try:
        site.cluster.run("create", "-n", JOBS_NAMESPACE, "-f", "-", stdin=json.dumps(job_manifest(job)))
        try:
            wait_for_state(site.cluster, JOBS_NAMESPACE, job, "Running", timeout=120)
        except AssertionError as error:
            raise AssertionError(f"{error}\noperator log:\n{operator.tail(60)}") from None
        assert operator.is_leader()
        assert operator.metric("controller_runtime_max_concurrent_reconciles") == float(workers)
    finally:
        operator.stop()


def can_i(kubectl: Kubectl, *args: str) -> bool:
    answer = kubectl.attempt("auth", "can-i", *args).stdout.strip()
    assert answer in ("yes", "no"), f"can-i {' '.join(args)}: {answer}"
    return answer == "yes"


def gone(site: Site, kind: str, name: str, namespace: str) -> bool:
    return site.cluster.get_or_none(kind, name, *(["-n", namespace] if namespace else [])) is None


def release_secrets(site: Site) -> list[Manifest]:
    return site.cluster.items("secrets", "-n", NAMESPACE, "-l", f"owner=helm,name={RELEASE}")


def history(site: Site) -> list[Manifest]:
    entries: list[Manifest] = json.loads(site.helm.run("history", RELEASE, "-n", NAMESPACE, "-o", "json"))
    return entries


def the_rollout_is_done(site: Site, replicas: int) -> Manifest:
    site.cluster.run("rollout", "status", f"deployment/{RELEASE}", "-n", NAMESPACE, "--timeout=180s")
    deployment = site.cluster.get_json("deployment", RELEASE, "-n", NAMESPACE)
    status = deployment["status"]
    assert status["observedGeneration"] == deployment["metadata"]["generation"]
    assert status.get("updatedReplicas") == replicas, status
    assert status.get("readyReplicas") == replicas, status
    return deployment


# ----------------------------------------------------------------------------------------- tests


def test_install_upgrade_uninstall(site: Site) -> None:
    cluster, helm = site.cluster, site.helm
    chart = str(CHART)
    install = ("install", RELEASE, chart, "--namespace", NAMESPACE, "--wait", "--timeout=3m")

    # Refused values and a server-side dry run change nothing.
    refused = helm.attempt(*install, "--set", "replicas=-1")
    assert refused.returncode != 0
    assert "replicas" in refused.stderr
    dry_run = helm.run(*install[:5], "--dry-run=server")
    assert "kind: Deployment" in dry_run
    assert "kind: CustomResourceDefinition" in dry_run
    assert gone(site, "customresourcedefinition", CRD_NAME, "")
    assert gone(site, "deployment", RELEASE, NAMESPACE)
    assert release_secrets(site) == []

    # Install: the CRD and every object, Established and rolled out.
    notes = helm.run(*install)
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{RELEASE}" in notes, notes
    cluster.run(
        "wait", "--for=condition=Established", "--timeout=60s", f"customresourcedefinition/{CRD_NAME}"
    )
    for kind, name, namespace in RELEASE_OBJECTS:
        assert not gone(site, kind, name, namespace), f"{kind} {name} missing after helm install"
    deployment = the_rollout_is_done(site, replicas=2)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "trainingjob-operator:0.1.0"
    (secret,) = release_secrets(site)
    size = len(base64.b64decode(secret["data"]["release"]))
    assert size < RELEASE_SECRET_LIMIT / 2, f"the release Secret holds {size} bytes"

    the_deployed_operator_works(site, "after-install", workers=4)

    # Upgrade: more replicas and another flag value roll out as a new ReplicaSet.
    helm.run(
        "upgrade", RELEASE, chart, "--namespace", NAMESPACE, "--wait", "--timeout=3m",
        "--reuse-values", "--set", "replicas=3", "--set", "operator.workers=6",
    )  # fmt: skip
    deployment = the_rollout_is_done(site, replicas=3)
    assert "--workers=6" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    sets = cluster.items("replicasets", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=controller")
    by_revision = {rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]: rs for rs in sets}
    assert by_revision["2"]["status"].get("replicas") == 3
    assert "--workers=6" in by_revision["2"]["spec"]["template"]["spec"]["containers"][0]["args"]
    old_replicas = cluster.get_json("replicaset", by_revision["1"]["metadata"]["name"], "-n", NAMESPACE)
    assert not old_replicas["status"].get("replicas"), "the old ReplicaSet is scaled to 0"
    assert [(entry["revision"], entry["status"]) for entry in history(site)] == [
        (1, "superseded"),
        (2, "deployed"),
    ]
    the_deployed_operator_works(site, "after-upgrade", workers=6)

    # Upgrade to single-namespace mode: the rights move to a Role in the watched namespace.
    helm.run(
        "upgrade", RELEASE, chart, "--namespace", NAMESPACE, "--wait", "--timeout=3m",
        "--reuse-values", "--set", f"watchNamespace={JOBS_NAMESPACE}",
    )  # fmt: skip
    the_rollout_is_done(site, replicas=3)
    kubeconfig = token_kubeconfig(cluster, RELEASE, NAMESPACE, site.scratch / "service-account.kubeconfig")
    identity = Kubectl(cluster.binary, kubeconfig)
    assert can_i(identity, "create", "pods", "-n", JOBS_NAMESPACE)
    assert not can_i(identity, "create", "pods", "-n", "default")
    assert not can_i(identity, "list", "pods", "--all-namespaces")
    assert can_i(identity, "list", "nodes")
    the_deployed_operator_works(site, "single-namespace", workers=6)

    # Uninstall: everything goes but crd/'s objects and the TrainingJobs (crds.keep).
    result = helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=3m")
    assert "kept due to the resource policy" in result, result
    assert CRD_NAME in result
    for kind, name, namespace in (*RELEASE_OBJECTS, ("role", RELEASE, JOBS_NAMESPACE)):
        assert gone(site, kind, name, namespace), f"{kind} {name} left after helm uninstall --wait"
    assert release_secrets(site) == []
    assert not gone(site, "customresourcedefinition", CRD_NAME, "")
    # The trainers' ClusterRole and the admission policies stay with the CRD: they guard the jobs kept.
    # The policies on the operator's own writes go with it.
    assert not gone(site, "clusterrole", contract.TRAINER_CLUSTER_ROLE, "")
    for kind in ("validatingadmissionpolicy", "validatingadmissionpolicybinding"):
        for name in contract.CRD_POLICIES:
            assert not gone(site, kind, name, ""), (kind, name)
        for name in (f"{RELEASE}-writes", f"{RELEASE}-rolebindings"):
            assert gone(site, kind, name, ""), (kind, name)
    jobs = [job["metadata"]["name"] for job in cluster.items("trainingjobs", "-n", JOBS_NAMESPACE)]
    assert sorted(jobs) == ["after-install", "after-upgrade", "single-namespace"]


def older_chart(directory: Path) -> Path:
    """A copy of the chart as an earlier version of it: version 0.0.9, its CRD without the Epoch column."""
    copy = shutil.copytree(CHART, directory / "trainingjob-operator")
    metadata = yaml.safe_load((copy / "Chart.yaml").read_text(encoding="utf-8"))
    metadata["version"] = "0.0.9"
    (copy / "Chart.yaml").write_text(yaml.safe_dump(metadata), encoding="utf-8")
    crd_file = copy / "files" / CRD_FILE_NAME
    column = (
        "    - name: Epoch\n      type: integer\n      jsonPath: .status.currentEpoch\n"
        "      description: Current epoch\n"
    )
    text = crd_file.read_text(encoding="utf-8")
    assert column in text
    crd_file.write_text(text.replace(column, ""), encoding="utf-8")
    return copy


def printer_columns(site: Site) -> list[str]:
    crd = site.cluster.get_json("customresourcedefinition", CRD_NAME)
    (version,) = crd["spec"]["versions"]
    return [column["name"] for column in version["additionalPrinterColumns"]]


def test_upgrade_updates_the_crd_and_keep_false_removes_it(site: Site) -> None:
    """The CRD is a template, so `helm upgrade` brings the new chart's schema (crds/ would not); a CRD
    kept by an earlier uninstall is taken over again by a new install of the same release."""
    cluster, helm = site.cluster, site.helm
    old = older_chart(site.scratch)
    helm.run("install", RELEASE, str(old), "--namespace", NAMESPACE, "--wait", "--timeout=3m")
    assert "Epoch" not in printer_columns(site)
    cluster.run("create", "-n", JOBS_NAMESPACE, "-f", "-", stdin=json.dumps(job_manifest("kept-job")))

    helm.run("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--wait", "--timeout=3m")
    assert "Epoch" in printer_columns(site)
    (source,) = load_all((REPO / "crd" / CRD_FILE_NAME).read_text(encoding="utf-8"))
    live = cluster.get_json("customresourcedefinition", CRD_NAME)
    assert live["spec"]["versions"] == source["spec"]["versions"]
    assert live["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert cluster.get_or_none("trainingjob", "kept-job", "-n", JOBS_NAMESPACE) is not None, (
        "an upgrade keeps jobs"
    )
    secret = max(release_secrets(site), key=lambda item: int(item["metadata"]["labels"]["version"]))
    size = len(base64.b64decode(secret["data"]["release"]))
    assert size < RELEASE_SECRET_LIMIT / 2, f"the release Secret holds {size} bytes"

    # Without crds.keep, uninstall deletes the CRD, and with it every TrainingJob.
    upgrade = ("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--reuse-values")
    helm.run(*upgrade, "--set", "crds.keep=false")
    annotations = cluster.get_json("customresourcedefinition", CRD_NAME)["metadata"].get("annotations", {})
    assert "helm.sh/resource-policy" not in annotations
    helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=3m")
    assert wait_for(
        "the CRD deleted", lambda: gone(site, "customresourcedefinition", CRD_NAME, ""), timeout=120
    )


def test_a_crd_installed_without_helm_is_refused_then_taken_over(site: Site) -> None:
    """A cluster with the CRD from `make install` or `kubectl apply -k deploy/`: helm refuses to take an
    object it does not own, and `--take-ownership` (deploy/README.md) makes the release its owner."""
    cluster, helm = site.cluster, site.helm
    cluster.run("delete", "customresourcedefinition", CRD_NAME, "--ignore-not-found", "--wait=true")
    cluster.run("apply", "--server-side", "-f", str(REPO / "crd" / CRD_FILE_NAME))
    install = ("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--wait", "--timeout=3m")
    refused = helm.attempt(*install)
    assert refused.returncode != 0
    assert f'CustomResourceDefinition "{CRD_NAME}"' in refused.stderr, refused.stderr
    assert "invalid ownership metadata" in refused.stderr, refused.stderr
    assert gone(site, "deployment", RELEASE, NAMESPACE)

    helm.run(*install, "--take-ownership")
    crd = cluster.get_json("customresourcedefinition", CRD_NAME)
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    helm.run("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout=3m")
    assert not gone(site, "customresourcedefinition", CRD_NAME, "")
