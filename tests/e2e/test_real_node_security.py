"""The trainer pods' security defaults on the real node: what a kubelet and containerd make of them.

Why: builders/podsecurity.py says what a worker pod asks for (no capabilities, no privilege escalation,
the runtime's seccomp profile, a non-root user for the reference trainer in a framework's default image,
the pod's token mounted into the trainer alone), and the unit tests check the pod. Only a real node
shows that the trainer still trains to Completed that way, with its progress reaching the status
through the token the operator projected, that the process really runs without capabilities and with
no_new_privs, and that the other containers of the pod find no token. The job is the restricted
example (examples/trainingjob-restricted.yaml) in a namespace that enforces "restricted", so every
pod the operator creates passes Pod Security admission as built. Its sidecar's image is swapped for
the base image (this machine cannot pull fluent-bit) running a program that says whether it sees a
token, an init container does the same, and the job is placed on the node and paced for 2 cores
(tests/e2e/realnode.py).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml

from crd import contract
from testbed import PYTHON_IMAGE, Kubectl
from tests.cluster import REPO
from tests.e2e.conftest import StartOperator
from tests.e2e.jobs import wait_for_state
from tests.e2e.realnode import PACE, job_on_node, wait_running

JsonDict = dict[str, Any]
pytestmark = pytest.mark.slow

RESTRICTED_EXAMPLE = REPO / "examples" / "trainingjob-restricted.yaml"
TOKEN = f"{contract.TOKEN_MOUNT_PATH}/{contract.TOKEN_FILE}"
# Says whether the container sees a token at the standard path; a sidecar then waits for the
# kubelet's SIGTERM, as a log shipper would.
TOKEN_CHECK = (
    "import os, signal, sys, threading\n"
    f"print('token:', 'present' if os.path.exists({TOKEN!r}) else 'absent', flush=True)\n"
    "if sys.argv[1:] == ['serve']:\n"
    "    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "    threading.Event().wait()\n"
)
RESTRICTED_CONTAINER: JsonDict = {
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def restricted_example_on_node() -> JsonDict:
    """The restricted example as it is, but for the sidecar's image and an init container that looks for
    a token, placed on the real node with short epochs (1 s steps: time to look into a running trainer)."""
    job = job_on_node(yaml.safe_load(RESTRICTED_EXAMPLE.read_text()))
    spec = job["spec"]
    paced = {**PACE, "TRAIN_STEP_SECONDS": "1"}
    spec["env"] = [*spec.get("env", []), *({"name": k, "value": v} for k, v in paced.items())]
    init_containers = spec["podTemplate"]["spec"]["initContainers"]
    (sidecar,) = init_containers
    assert sidecar["restartPolicy"] == "Always"
    sidecar.update(image=PYTHON_IMAGE, command=["python", "-c", TOKEN_CHECK, "serve"])
    init_containers.insert(
        0,
        {
            "name": "check-token",
            "image": PYTHON_IMAGE,
            "command": ["python", "-c", TOKEN_CHECK],
            "securityContext": RESTRICTED_CONTAINER,
        },
    )
    return job


def process_status(kubectl: Kubectl, namespace: str, pod: str) -> dict[str, str]:
    """/proc/1/status of the trainer container (its first process, the trainer itself), by field."""
    text = kubectl.run(
        "exec", pod, "-n", namespace, "-c", contract.CONTAINER_NAME, "--", "cat", "/proc/1/status"
    )
    return {key: value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())}


def jwt_claims(token: str) -> JsonDict:
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert isinstance(claims, dict)
    return claims


def test_the_restricted_example_trains_with_no_capabilities_as_a_non_root_user_and_the_token_in_the_trainer(
    real_node: Kubectl, namespace: str, start_operator: StartOperator
) -> None:
    cluster = real_node
    cluster.run("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    operator = start_operator("--progress-interval=0")
    job = restricted_example_on_node()
    name = job["metadata"]["name"]
    cluster.apply(job, "-n", namespace)

    rank0 = f"{name}-worker-0"
    pod = wait_running(cluster, namespace, rank0, timeout=240)
    assert pod["spec"]["automountServiceAccountToken"] is False
    # The trainer: no capability in any set, no_new_privs, the runtime's seccomp filter, user 1000.
    status = process_status(cluster, namespace, rank0)
    for capabilities in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(status[capabilities], 16) == 0, (capabilities, status)
    assert status["NoNewPrivs"] == "1", status
    assert status["Seccomp"] == "2", status  # SECCOMP_MODE_FILTER
    assert status["Uid"].split() == [str(contract.NON_ROOT_USER)] * 4, status
    assert status["Gid"].split() == [str(contract.NON_ROOT_GROUP)] * 4, status
    # Its token is the pod's, bound to it: what the trainer-progress policy checks.
    token = cluster.run("exec", rank0, "-n", namespace, "-c", contract.CONTAINER_NAME, "--", "cat", TOKEN)
    claims = jwt_claims(token.strip())
    assert claims["sub"] == f"system:serviceaccount:{namespace}:{contract.TRAINER_ACCOUNT}"
    assert claims["kubernetes.io"]["pod"] == {"name": rank0, "uid": pod["metadata"]["uid"]}

    job_status = wait_for_state(cluster, namespace, name, "Completed", timeout=300)["status"]
    assert (job_status["currentEpoch"], job_status["progress"]) == (3, "100%")
    assert set(job_status["metrics"]) == {"accuracy", "loss"}
    # Neither the init container nor the native sidecar had a token.
    for container in ("check-token", "log-shipper"):
        logs = cluster.run("logs", rank0, "-n", namespace, "-c", container)
        assert "token: absent" in logs, (container, logs)
    assert job_status.get("restartCount", 0) == 0
    log = cluster.run("logs", rank0, "-n", namespace, "-c", contract.CONTAINER_NAME)
    assert "training finished: 3 epochs" in log, log[-3000:]
    assert "Permission denied" not in log, log[-3000:]
    assert operator.alive()
