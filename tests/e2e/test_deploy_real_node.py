"""`make deploy` and `helm install` for real: the operator from its own image, as pods on the real node.

Why: every other test runs the operator as a process on the machine, and kwok fakes the pods of the
Deployment that `make deploy` and the chart install. Here the Deployment's two pods run on the local
cluster's real node (testbed/node/realnode.py) from the image this tree's Dockerfile builds
(testbed/images), pushed to the local cluster's registry (testbed/node/registry.py) and pulled from it
with an imagePullSecret, as deploy/README.md says: `make docker-build docker-push deploy IMG=...
IMAGE_PULL_SECRETS=...`, and the chart's image and imagePullSecrets values; placed there with `make
deploy`'s NODE_SELECTOR and TOLERATE and with the chart's nodeSelector and tolerations values. So what
only a real cluster exercises is proven: the pull from a registry that asks for credentials, the image's
entry point, the probes answered by the real process, the deployed ServiceAccount and RBAC through
the in-cluster configuration (no kubeconfig anywhere), restricted Pod Security with a read-only root
filesystem, leader election between two pods and its handover when the leader's pod is deleted (a
real SIGTERM from the kubelet), the probes on their own port, /metrics over HTTPS refusing a request
without a token and scraped by a real Prometheus through the Service's ClusterIP (kube-proxy) with a
ServiceAccount token bound to the shipped metrics-reader ClusterRole, and the JSON logs as `kubectl
logs` shows them. The jobs it reconciles are ordinary
TrainingJobs whose pods run on the kwok nodes.

The deployed operator uses the Lease the session's other operators use (tests/e2e/conftest.py), so
each test waits until no one holds it, and removes what it installed before it ends. `make undeploy`
and `helm uninstall` delete the operator's ServiceAccount and RBAC, which the session's operators
run as: the next test that needs them applies them again and mints a new token
(tests/e2e/operator_identity.py, `SessionIdentity`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest

from crd import contract
from testbed import REAL_NODE, REGISTRY, Image, Kubectl, wait_for
from tests.cluster import REPO
from tests.e2e.deployed_operator import (
    HELM_PLACEMENT_FLAGS,
    LEASE,
    NODE_SELECTOR,
    TOLERATE,
    holder_pod,
    json_log,
    lease_spec,
    look_inside,
    master_status,
    operator_pods,
    reconciled,
    wait_leader,
    wait_lease_free,
    wait_ready_replicas,
)
from tests.e2e.metrics_access import metrics_reader, token_file
from tests.e2e.operator_identity import DEPLOY, identity_objects, render
from tests.e2e.operator_identity import NAMESPACE as OPERATOR_NAMESPACE
from tests.e2e.prometheus import PROMETHEUS, Prometheus, running_prometheus, scrape_config
from tests.helmchart import CHART, RELEASE, Helm

pytestmark = pytest.mark.slow

JsonDict = dict[str, Any]
SELECTOR: Final = "app.kubernetes.io/name=trainingjob-operator,app.kubernetes.io/component=controller"
# The pull Secret deploy/README.md makes in the operator's namespace from the registry's credentials.
PULL_SECRET: Final = "registry-credentials"
METRICS_SERVICE: Final = "trainingjob-operator-metrics"
# What `make undeploy` removes besides the namespace (and with it the Lease), as `kubectl get` names them.
INSTALLED: Final = (
    ("deployment", "trainingjob-operator", OPERATOR_NAMESPACE),
    ("service", METRICS_SERVICE, OPERATOR_NAMESPACE),
    ("poddisruptionbudget", "trainingjob-operator", OPERATOR_NAMESPACE),
    ("serviceaccount", "trainingjob-operator", OPERATOR_NAMESPACE),
    ("role", "trainingjob-operator-leader-election", OPERATOR_NAMESPACE),
    ("rolebinding", "trainingjob-operator-leader-election", OPERATOR_NAMESPACE),
    ("clusterrole", "trainingjob-operator", ""),
    ("clusterrolebinding", "trainingjob-operator", ""),
    ("clusterrole", "trainingjob-operator-metrics-auth", ""),
    ("clusterrolebinding", "trainingjob-operator-metrics-auth", ""),
    ("clusterrole", "trainingjob-operator-metrics-reader", ""),
)


def make(targets: str, cluster: Kubectl, **variables: str) -> subprocess.CompletedProcess[str]:
    """`make <targets...>` (separated by spaces) against `cluster`, with `variables`."""
    env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
    args = ["make", "--no-print-directory", *targets.split(), f"KUBECTL={cluster.binary}"]
    args += [f"{key}={value}" for key, value in variables.items()]
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


def present(cluster: Kubectl) -> list[tuple[str, str, str]]:
    """The installed objects that still exist."""
    return [
        (kind, name, namespace)
        for kind, name, namespace in INSTALLED
        if cluster.get_or_none(kind, name, *(["-n", namespace] if namespace else [])) is not None
    ]


def crd_objects_present(cluster: Kubectl) -> bool:
    """crd/'s objects, which an uninstall keeps: the CRD and the admission policies."""
    policies = [
        (kind, name)
        for kind in ("validatingadmissionpolicy", "validatingadmissionpolicybinding")
        for name in contract.CRD_POLICIES
    ]
    return all(
        cluster.get_or_none(kind, name) is not None
        for kind, name in (("customresourcedefinition", f"{contract.PLURAL}.{contract.GROUP}"), *policies)
    )


def image_in_the_registry(tag: str) -> str:
    """IMG for the operator's image under `tag` in the local cluster's registry: a tag of the test's own,
    so that the node pulls it (an image the node holds already under its reference is not pulled)."""
    return REGISTRY.reference(f"trainingjob-operator:{tag}-{uuid.uuid4().hex[:8]}")


def pull_access(cluster: Kubectl) -> None:
    """deploy/README.md's first steps for a registry that asks for credentials: the operator's
    namespace, then the pull Secret in it, made from the registry's docker config file (again, when
    an earlier test left one)."""
    cluster.run("apply", "-f", str(DEPLOY / "base" / "namespace.yaml"))
    cluster.run("delete", "secret", PULL_SECRET, "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
    cluster.run(
        *("create", "secret", "generic", PULL_SECRET, "-n", OPERATOR_NAMESPACE),
        *("--type=kubernetes.io/dockerconfigjson", f"--from-file=.dockerconfigjson={REGISTRY.auth_file}"),
    )


def pulled_image_id(image: Image, img: str) -> str:
    """The image ID the node reports for `img` pulled from the local registry: its repository digest
    there. The manifest the registry holds is of the image this tree builds (its config's digest)."""
    digest, manifest = REGISTRY.manifest(img)
    assert manifest["config"]["digest"] == image.config_digest
    return f"{img.rsplit(':', 1)[0]}@{digest}"


def assert_runs_as_deployed(
    cluster: Kubectl, image_id: str, began: float, metrics_token: str
) -> tuple[list[JsonDict], str]:
    """Both replicas Ready on the real node from the image `image_id` names, each process as the
    restricted namespace and the Deployment make it, its probes plain and its /metrics HTTPS for
    `metrics_token` only, exactly one leading; returns the pods and the leader's name."""
    pods = wait_ready_replicas(cluster, SELECTOR, 2)
    seconds_to_ready = time.monotonic() - began
    namespace = cluster.get_json("namespace", OPERATOR_NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for pod in pods:
        spec, status = pod["spec"], pod["status"]
        assert spec["nodeName"] == REAL_NODE.name
        assert spec["serviceAccountName"] == "trainingjob-operator"
        # Pulled from the registry with the pull Secret: the image this tree's Dockerfile builds.
        assert spec["imagePullSecrets"] == [{"name": PULL_SECRET}]
        (container,) = status["containerStatuses"]
        assert container["imageID"] == image_id
        assert container["restartCount"] == 0
        # In-cluster configuration: no kubeconfig among the volumes, only the emptyDir and the token.
        token, tmp = sorted(volume["name"] for volume in spec["volumes"])
        assert (token.startswith("kube-api-access-"), tmp) == (True, "tmp"), spec["volumes"]
    leader = wait_leader(cluster, pods)
    statuses = {}
    for pod in pods:
        name = pod["metadata"]["name"]
        found = look_inside(cluster, name, metrics_token)
        assert found["readyz"] == [200, "ok"]
        assert found["without_token"] == [401, "Unauthorized\n"]
        assert found["metrics_status"] == 200
        assert (found["uid"], found["gid"]) == (65532, 65532)
        assert found["/written-by-a-test"] == "Read-only file system"
        assert found["/tmp/written-by-a-test"] == "written"
        # The image's entry point, with the Deployment's arguments and no --kubeconfig.
        assert found["command"][1:2] == ["/opt/venv/bin/trainingjob-operator"], found["command"]
        assert {"--leader-elect", "--leader-elect=true"} & set(found["command"]), found["command"]
        assert not any(arg.startswith("--kubeconfig") for arg in found["command"])
        assert found["KUBECONFIG"] is None
        assert found["KUBERNETES_SERVICE_HOST"] == REAL_NODE.api_service_ip
        assert {"ca.crt", "namespace", "token"} <= set(found["service_account"])
        statuses[name] = master_status(found)
    assert statuses == {pod["metadata"]["name"]: float(pod["metadata"]["name"] == leader) for pod in pods}
    print(f"\nfrom install to both replicas Ready: {seconds_to_ready:.1f}s; leader {leader}")
    return pods, leader


# --------------------------------------------------------------------------------------- Prometheus


def free_port_on_the_node() -> int:
    with REAL_NODE.listen() as probe:
        port = probe.getsockname()[1]
    assert isinstance(port, int)
    return port


def scraped_through_the_service(cluster: Kubectl, workdir: Path, metrics_token: str) -> None:
    """A real Prometheus inside the node's network namespace scrapes the metrics Service's ClusterIP
    (kube-proxy's rules send it to a replica) as the ServiceMonitor makes it, HTTPS with a token; the
    test queries it at the node's address."""
    service = cluster.get_json("service", METRICS_SERVICE, "-n", OPERATOR_NAMESPACE)
    target = f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"
    config = scrape_config(METRICS_SERVICE, [target], token_file=token_file(metrics_token, workdir))
    launcher = ["/usr/bin/nsenter", f"--net={REAL_NODE.netns}", "--"]
    port = free_port_on_the_node()
    with running_prometheus(config, workdir, host=REAL_NODE.ip, port=port, launcher=launcher) as server:

        def up(prometheus: Prometheus = server) -> list[float] | None:
            values = prometheus.values(f'up{{job="{METRICS_SERVICE}"}}')
            return values if values == [1.0] else None

        wait_for(f"Prometheus scraping {target}", up, timeout=90)
        (scraped,) = server.targets()
        assert scraped["scrapeUrl"] == f"https://{target}/metrics"
        # The Deployment's --workers=4, as the scraped process exports it.
        workers = server.values('controller_runtime_max_concurrent_reconciles{controller="trainingjob"}')
        assert workers == [4.0]


def hand_over(cluster: Kubectl, pods: list[JsonDict], leader: str) -> str:
    """Deletes the leader's pod: the kubelet sends SIGTERM, the operator releases the Lease, and
    another replica takes it within the lease duration: the standby, or the pod the Deployment starts
    in the deleted one's place, whichever asks first. Returns the new leader's name."""
    (standby,) = [str(pod["metadata"]["name"]) for pod in pods if pod["metadata"]["name"] != leader]
    duration = float(lease_spec(cluster)["leaseDurationSeconds"])
    deleted_at = time.monotonic()
    cluster.run("delete", "pod", leader, "-n", OPERATOR_NAMESPACE, "--wait=false")
    try:
        # The deleted pod is no longer among the operator's pods (operator_pods leaves it out).
        successor = wait_for(
            f"another replica holding the Lease after {leader} was deleted",
            lambda: holder_pod(cluster, operator_pods(cluster, SELECTOR)),
            timeout=duration,
            interval=0.1,
        )
    except AssertionError as error:
        lines = cluster.run("logs", "-n", OPERATOR_NAMESPACE, standby, check=False).splitlines()
        log = "\n".join(lines[-15:])
        raise AssertionError(f"{error}\nlease: {lease_spec(cluster)}\n{standby}'s log:\n{log}") from None
    print(
        f"leader handover: {time.monotonic() - deleted_at:.1f}s to {successor}"
        f" ({'the standby' if successor == standby else 'the replacement'}; lease duration {duration:.0f}s)"
    )
    return successor


# ------------------------------------------------------------------------------------------- tests


@pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus package is not installed")
def test_make_deploy_runs_the_operator_from_its_image_on_the_real_node(
    registry: Kubectl,
    namespace: str,
    node_images: Callable[[str], Image],
    tmp_path: Path,
) -> None:
    real_node = registry
    image = node_images("operator")
    img = image_in_the_registry("make")
    variables = {
        "IMG": img,
        "IMAGE_PULL_SECRETS": PULL_SECRET,
        "NODE_SELECTOR": NODE_SELECTOR,
        "TOLERATE": TOLERATE,
    }
    wait_lease_free(real_node)
    scraper = contextlib.ExitStack()
    try:
        pull_access(real_node)
        began = time.monotonic()
        deployed = make("docker-build docker-push deploy", real_node, **variables)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert f"pushed {img} (operator, " in deployed.stdout
        token = scraper.enter_context(metrics_reader(real_node, namespace))
        pods, leader = assert_runs_as_deployed(real_node, pulled_image_id(image, img), began, token)
        reconciled(real_node, namespace, "first")
        scraped_through_the_service(real_node, tmp_path, token)

        successor = hand_over(real_node, pods, leader)
        reconciled(real_node, namespace, "second")
        # The Deployment has replaced the deleted pod: two replicas again, one of them new.
        replaced = wait_ready_replicas(real_node, SELECTOR, 2)
        assert leader not in {pod["metadata"]["name"] for pod in replaced}

        log = json_log(real_node, successor)
        messages = [str(entry.get("message")) for entry in log]
        assert {"time", "level", "logger", "message"} <= set(log[0])
        assert (
            f"acquired lease {OPERATOR_NAMESPACE}/{LEASE} as {lease_spec(real_node)['holderIdentity']}"
            in messages
        )
        assert any(entry.get("name") == "second" and entry.get("namespace") == namespace for entry in log)

        real_node.run("delete", "trainingjobs", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
        removed = make("undeploy", real_node, **variables)
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert present(real_node) == []
        assert real_node.get_or_none("namespace", OPERATOR_NAMESPACE) is None
        assert real_node.items("pods", "-A", "-l", SELECTOR) == []
        assert crd_objects_present(real_node)
    finally:
        scraper.close()
        if real_node.get_or_none("deployment", "trainingjob-operator", "-n", OPERATOR_NAMESPACE):
            make("undeploy", real_node, **variables)


def set_aside_identity(cluster: Kubectl) -> None:
    """Deletes the ServiceAccount and RBAC the session's operators run as (the kustomize install's,
    not owned by a Helm release), so that the release creates them as on a new cluster."""
    objects = [obj for obj in identity_objects(render(DEPLOY)) if obj["kind"] != "Namespace"]
    listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    cluster.run("delete", "-f", "-", "--ignore-not-found", "--wait=true", stdin=listing)


def test_helm_install_runs_the_operator_from_its_image_on_the_real_node(
    registry: Kubectl,
    namespace: str,
    node_images: Callable[[str], Image],
    helm: Path,
    tmp_path: Path,
) -> None:
    real_node = registry
    image = node_images("operator")
    img = image_in_the_registry("helm")
    repository, tag = img.rsplit(":", 1)
    REGISTRY.push(image, img.removeprefix(f"{REGISTRY.host}/"))
    # deploy/README.md's command: the CRD and the trainers' admission policy are the session's (crd/,
    # applied without Helm), so the release leaves them alone; a registry host with its port in
    # image.repository, the pull Secret in imagePullSecrets.
    install = (
        *("install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE),
        *("--set", f"image.repository={repository}", "--set", f"image.tag={tag}"),
        *("--set", "crds.install=false", "--set", f"imagePullSecrets[0].name={PULL_SECRET}"),
        *HELM_PLACEMENT_FLAGS,
    )
    chart = Helm(helm, tmp_path / "helm", real_node.kubeconfig)
    wait_lease_free(real_node)
    # deploy/README.md: the namespace first (the chart does not own it); removed after if made here.
    namespace_existed = real_node.get_or_none("namespace", OPERATOR_NAMESPACE) is not None
    pull_access(real_node)
    set_aside_identity(real_node)
    began = time.monotonic()
    scraper = contextlib.ExitStack()
    try:
        chart.run(*install)
        token = scraper.enter_context(metrics_reader(real_node, namespace))
        assert_runs_as_deployed(real_node, pulled_image_id(image, img), began, token)
        reconciled(real_node, namespace, "charted")
        real_node.run("delete", "trainingjobs", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
        chart.run("uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout=3m")
        assert present(real_node) == []
        assert crd_objects_present(real_node)
        wait_for(
            "the operator's pods gone",
            lambda: not real_node.items("pods", "-n", OPERATOR_NAMESPACE, "-l", SELECTOR),
            timeout=120,
        )
    finally:
        scraper.close()
        if real_node.get_or_none("deployment", "trainingjob-operator", "-n", OPERATOR_NAMESPACE):
            chart.attempt("uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout=3m")
        if not namespace_existed:
            real_node.run("delete", "namespace", OPERATOR_NAMESPACE, "--ignore-not-found", "--timeout=120s")
        else:
            real_node.run("delete", "secret", PULL_SECRET, "-n", OPERATOR_NAMESPACE, "--ignore-not-found")
