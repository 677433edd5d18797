"""The operator as a platform team runs it: pods of its Deployment on the real node, seen from outside.

Why apart: `make deploy` and `helm install` (tests/e2e/test_deploy_real_node.py) put the same
Deployment on the local cluster's real node, and the same questions are asked of both: are both
replicas Ready from the image this tree builds, what does the process inside a pod see (its user, a
read-only root filesystem, no kubeconfig), which one holds the Lease, what do its /metrics and its
`kubectl logs` say. The answers come from the cluster and from inside the containers
(`kubectl exec`, through the real kubelet), never from the manifests.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any, Final

from testbed import REAL_NODE, Kubectl, is_ready, wait_for
from tests.e2e.jobs import job_manifest, wait_for_state
from tests.e2e.operator_identity import NAMESPACE as OPERATOR_NAMESPACE

JsonDict = dict[str, Any]

LEASE: Final = "trainingjob-operator"
# The placement on the real node, in `make deploy`'s variables and in the chart's values.
NODE_SELECTOR: Final = f"{REAL_NODE.label}=true"
TOLERATE: Final = f"{REAL_NODE.taint['key']}={REAL_NODE.taint['value']}:{REAL_NODE.taint['effect']}"
# The chart's flags, as deploy/README.md writes them (`true` must stay a string).
HELM_PLACEMENT_FLAGS: Final = (
    "--set-string",
    "nodeSelector." + REAL_NODE.label.replace(".", "\\.") + "=true",
    "--set-string",
    ",".join(
        f"tolerations[0].{field}={value}"
        for field, value in (
            ("key", REAL_NODE.taint["key"]),
            ("operator", "Equal"),
            ("value", REAL_NODE.taint["value"]),
            ("effect", REAL_NODE.taint["effect"]),
        )
    ),
)

# Run inside an operator container (as its user): what the process there sees. A token that may get
# /metrics comes on stdin; the operator's certificate is self-signed, so it is not verified.
LOOK_INSIDE = """
import json, os, ssl, sys, urllib.error, urllib.request
found = {"uid": os.getuid(), "gid": os.getgid()}
for path in ("/written-by-a-test", "/tmp/written-by-a-test"):
    try:
        with open(path, "w") as handle:
            handle.write("x")
        os.unlink(path)
        found[path] = "written"
    except OSError as error:
        found[path] = error.strerror
found["command"] = open("/proc/1/cmdline").read().split("\\0")[:-1]
found["KUBECONFIG"] = os.environ.get("KUBECONFIG")
found["KUBERNETES_SERVICE_HOST"] = os.environ.get("KUBERNETES_SERVICE_HOST")
found["service_account"] = sorted(os.listdir("/var/run/secrets/kubernetes.io/serviceaccount"))
token = sys.stdin.read().strip()
unverified = ssl._create_unverified_context()
def get(url, token=None):
    headers = {"Authorization": "Bearer " + token} if token else {}
    context = unverified if url.startswith("https:") else None
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
found["readyz"] = get("http://127.0.0.1:8081/readyz")
found["without_token"] = get("https://127.0.0.1:8443/metrics")
status, metrics = get("https://127.0.0.1:8443/metrics", token)
found["metrics_status"] = status
found["metrics"] = {
    line.split()[0]: float(line.split()[-1])
    for line in metrics.splitlines()
    if line.startswith(("leader_election_master_status", "controller_runtime_max_concurrent_reconciles"))
}
print(json.dumps(found))
"""


def operator_pods(cluster: Kubectl, selector: str) -> list[JsonDict]:
    """The operator's pods (not the ones being deleted), oldest first."""
    pods = [
        pod
        for pod in cluster.items("pods", "-n", OPERATOR_NAMESPACE, "-l", selector)
        if not pod["metadata"].get("deletionTimestamp")
    ]
    return sorted(pods, key=lambda pod: str(pod["metadata"]["creationTimestamp"]))


def wait_ready_replicas(cluster: Kubectl, selector: str, count: int, timeout: float = 180) -> list[JsonDict]:
    """Waits until exactly `count` pods of the operator run and are Ready (their readiness probe
    answered by the process); returns them."""

    def probe() -> list[JsonDict] | None:
        pods = operator_pods(cluster, selector)
        return pods if len(pods) == count and all(is_ready(pod) for pod in pods) else None

    try:
        return wait_for(f"{count} Ready operator pods", probe, timeout=timeout)
    except AssertionError as error:
        states = [
            (pod["metadata"]["name"], pod["spec"].get("nodeName"), (pod.get("status") or {}).get("phase"))
            for pod in operator_pods(cluster, selector)
        ]
        raise AssertionError(f"{error}\npods: {states}") from None


def lease_spec(cluster: Kubectl) -> JsonDict:
    lease = cluster.get_or_none("lease", LEASE, "-n", OPERATOR_NAMESPACE)
    return dict((lease or {}).get("spec") or {})


def lease_is_free(cluster: Kubectl) -> bool:
    """No one holds the Lease: it is missing, released (no holder), or not renewed for its duration."""
    spec = lease_spec(cluster)
    if not spec.get("holderIdentity"):
        return True
    renewed = datetime.fromisoformat(str(spec["renewTime"]).replace("Z", "+00:00"))
    return time.time() - renewed.timestamp() > float(spec.get("leaseDurationSeconds") or 15)


def wait_lease_free(cluster: Kubectl) -> None:
    """The session's other operators use the same Lease; none may run while the deployed one does."""
    wait_for(
        f"no other operator holding the Lease {OPERATOR_NAMESPACE}/{LEASE}",
        lambda: lease_is_free(cluster),
        timeout=120,
        interval=1,
    )


def holder_pod(cluster: Kubectl, pods: list[JsonDict]) -> str | None:
    """The name of the pod holding the Lease: the operator's identity is `<hostname>_<uuid>`, and a
    pod's hostname is its name."""
    holder = str(lease_spec(cluster).get("holderIdentity") or "")
    names = [pod["metadata"]["name"] for pod in pods if holder.startswith(pod["metadata"]["name"] + "_")]
    return names[0] if names else None


def wait_leader(cluster: Kubectl, pods: list[JsonDict], timeout: float = 60) -> str:
    return wait_for(
        "one of the operator's pods holding the Lease", lambda: holder_pod(cluster, pods), timeout
    )


def look_inside(cluster: Kubectl, pod: str, metrics_token: str) -> JsonDict:
    """LOOK_INSIDE's findings, run in the pod's operator container through the kubelet, with a token
    that may get /metrics."""
    output = cluster.run(
        *("exec", "-i", "-n", OPERATOR_NAMESPACE, pod, "-c", "operator", "--", "python", "-c", LOOK_INSIDE),
        stdin=metrics_token,
    )
    found = json.loads(output.strip().splitlines()[-1])
    assert isinstance(found, dict)
    return found


def master_status(found: JsonDict) -> float:
    (value,) = [v for k, v in found["metrics"].items() if k.startswith("leader_election_master_status")]
    return float(value)


def json_log(cluster: Kubectl, pod: str) -> list[JsonDict]:
    """`kubectl logs` of the pod, every line parsed as the JSON object it must be."""
    lines = cluster.run("logs", "-n", OPERATOR_NAMESPACE, pod, "-c", "operator").splitlines()
    entries = [json.loads(line) for line in lines if line.strip()]
    assert entries, "no log lines"
    assert all(isinstance(entry, dict) for entry in entries), lines[:5]
    return entries


def reconciled(cluster: Kubectl, namespace: str, name: str) -> JsonDict:
    """A TrainingJob (two CPU workers, on the kwok nodes) brought to Running by the deployed operator."""
    cluster.apply(job_manifest(name), "-n", namespace)
    return wait_for_state(cluster, namespace, name, "Running", timeout=120)
