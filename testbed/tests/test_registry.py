"""`hack/dev-cluster.sh up --with registry`: the registry the real node pulls from, and how it goes.

Why: it listens inside the node's network namespace at the node's address, over TLS with a
certificate of the cluster's CA and behind htpasswd, and the node's containerd trusts that CA through
a hosts.toml; `remove registry` must take each away and `up --with registry` bring it back, and a
registry started anew must not leave the node running what it pulled from the one before. Its
settings and the pusher are tested without a cluster (test_registry_push.py); a TrainingJob's pulls
and their failures are tests/e2e/test_registry_pulls.py's.
"""

from __future__ import annotations

import os
import ssl
import subprocess
import uuid

import pytest

from testbed import REGISTRY, Kubectl, http_get, listening_addresses, pid_running, pod_on_node, wait_for
from testbed.cluster.state import REGISTRY as NAME
from testbed.common import DEV, ToolError
from testbed.images import ensure
from testbed.node import nodeconfig, realnode
from testbed.node import registry as component
from testbed.tests.clusters import SCRIPT, dev_cluster, read_state


def registry_pid() -> int:
    return int(read_state(DEV)["processes"][NAME]["pid"])


def node_images() -> list[str]:
    """The image names the node's containerd holds."""
    builds = {"containerd": realnode.build_binaries()["containerd"]}
    return realnode.ctr(builds, "images", "list", "-q").split()


def test_it_listens_at_the_nodes_address_only_over_tls_and_asks_for_credentials(registry: Kubectl) -> None:
    assert listening_addresses(registry_pid()) == {(nodeconfig.NODE_IP, 5000)}
    url = f"https://{REGISTRY.host}/v2/"
    status, error = http_get(url, context=ssl.create_default_context())
    assert status == 0  # its certificate is not of a CA the machine trusts
    assert "CERTIFICATE_VERIFY_FAILED" in error, error
    trusting = ssl.create_default_context(cafile=str(REGISTRY.ca_file))
    assert http_get(url, context=trusting)[0] == 401
    assert REGISTRY.client().request("GET", "/v2/").status == 200
    hosts = component.files(DEV / "run").hosts_toml.read_text()
    assert f'ca = "{REGISTRY.ca_file}"' in hosts


def test_status_and_env_name_it(registry: Kubectl) -> None:
    status = dev_cluster("status").stdout
    (line,) = [line for line in status.splitlines() if line.strip().startswith(f"{NAME} ")]
    assert f"{REGISTRY.host} in netns {nodeconfig.NETNS}" in line
    assert "running" in line
    assert "registry v3.1.2" in status
    exports = dev_cluster("env").stdout.splitlines()
    assert f"export REGISTRY={REGISTRY.host}" in exports
    assert f"export REGISTRY_AUTH_FILE={REGISTRY.auth_file}" in exports


def test_it_starts_again_in_a_shell_that_evaluated_env(registry: Kubectl) -> None:
    """`hack/dev-cluster.sh env` exports REGISTRY_AUTH_FILE (for the push tools), and the registry
    reads every REGISTRY_* variable as a setting of its own: it runs with an empty environment."""
    exports = dict(
        line.removeprefix("export ").split("=", 1)
        for line in dev_cluster("env").stdout.splitlines()
        if line.startswith("export REGISTRY")
    )
    assert set(exports) == {"REGISTRY", "REGISTRY_AUTH_FILE"}
    shell = {**os.environ, **exports}
    for command in ("stop", "start"):
        result = subprocess.run(
            [str(SCRIPT), command, NAME], env=shell, capture_output=True, text=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
    assert http_get(f"https://{REGISTRY.host}/v2/", context=registry_tls())[0] == 401


def test_remove_takes_it_away_and_up_brings_a_new_one_the_node_pulls_afresh(
    registry: Kubectl, namespace: str
) -> None:
    """Its storage stays until `down` (the run directory's), its credentials and certificate are new."""
    image = REGISTRY.reference(f"testbed/pulled:{uuid.uuid4().hex[:8]}")
    REGISTRY.push(ensure("base"), image.removeprefix(f"{REGISTRY.host}/"))
    user, password = REGISTRY.credentials()
    registry.run(
        *("create", "secret", "docker-registry", "pull", "-n", namespace, f"--docker-server={REGISTRY.host}"),
        *(f"--docker-username={user}", f"--docker-password={password}"),
    )
    pod = pod_on_node("pulled", ["true"], imagePullSecrets=[{"name": "pull"}], container={"image": image})
    registry.apply(pod, "-n", namespace)
    wait_for(
        "the pod's image pulled and run",
        lambda: (
            (registry.get_json("pod", "pulled", "-n", namespace).get("status") or {}).get("phase")
            == "Succeeded"
        ),
        timeout=120,
    )
    assert image in node_images()
    hosts_toml = component.files(DEV / "run").hosts_toml
    pid = registry_pid()

    dev_cluster("remove", NAME)
    state = read_state(DEV)
    assert NAME not in state["processes"]
    assert NAME not in state["optional"]
    assert state.get("registry") is None
    assert not hosts_toml.exists()
    assert not pid_running(pid)
    assert http_get(f"https://{REGISTRY.host}/v2/", context=registry_tls())[0] == 0

    dev_cluster("up", "--with", NAME)
    assert hosts_toml.exists()
    assert REGISTRY.credentials()[1] != password  # a password of its own
    assert REGISTRY.client().request("GET", "/v2/").status == 200
    with pytest.raises(ToolError, match="401 Unauthorized"):
        REGISTRY.client((user, password)).request("GET", "/v2/")
    # What the node pulled from the registry before is gone from it: pulled again when asked for.
    assert image not in node_images()


def registry_tls() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(REGISTRY.ca_file))
