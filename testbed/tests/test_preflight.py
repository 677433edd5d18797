"""hack/preflight.sh: `make demo` checks the machine first and names exactly what is missing.

Each test runs the real script with a PATH holding only the tools the case provides (fakes that
answer version queries, so no test depends on what this machine has installed), a development
directory and a binary cache of its own, and checks the verdict, the advice and that nothing was
created.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.common import REPO

SCRIPT = REPO / "hack" / "preflight.sh"
KUBE_BINS = REPO / "hack" / "kube-bins.sh"
# The real programs the scripts themselves run (bash, and what kube-bins.sh computes its key with).
REAL_TOOLS = ("bash", "dirname", "cut", "grep", "sha256sum", "flock")


@dataclass
class Machine:
    """A PATH and environment standing for one machine; `run()` runs the preflight there."""

    bin: Path
    dev: Path
    cache: Path
    python: str
    port: int
    cgroups: Path
    health_port: int = 0

    def tool(self, name: str, script: str = "exit 0") -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(0o755)

    def remove(self, *names: str) -> None:
        for name in names:
            (self.bin / name).unlink()

    def env(self) -> dict[str, str]:
        return {
            "PATH": str(self.bin),
            "HOME": str(self.dev.parent),
            "PYTHON": self.python,
            "DEMO_METRICS_PORT": str(self.port),
            "DEMO_HEALTH_PORT": str(self.health_port or free_port()),
            "TJ_DEV_DIR": str(self.dev),
            "TJ_CACHE_DIR": str(self.cache),
            "TJ_CGROUP_FS": str(self.cgroups),
        }

    def run(self) -> subprocess.CompletedProcess[str]:
        bash = shutil.which("bash")
        assert bash
        return subprocess.run(
            [bash, str(SCRIPT)], env=self.env(), capture_output=True, text=True, timeout=60, check=False
        )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    """Everything present: Python (this one), make, openssl and Go 1.24 (fakes), a free port."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in REAL_TOOLS:
        real = shutil.which(name)
        if real is None:
            pytest.skip(f"needs {name}")
        (bin_dir / name).symlink_to(real)
    python = str(Path(sys.executable))
    (bin_dir / "python3").symlink_to(python)
    cgroups = tmp_path / "cgroup"
    (cgroups / "memory").mkdir(parents=True)
    (cgroups / "memory" / "cgroup.procs").write_text("")
    (cgroups / "cpu").mkdir()
    found = Machine(bin_dir, tmp_path / "dev", tmp_path / "cache", python, free_port(), cgroups)
    found.tool("make")
    found.tool("openssl")
    found.tool("go", 'echo "go1.24.3"')
    # Root, cgroup v1 and the real node's Debian packages installed.
    found.tool("id", 'echo "0"')
    found.tool("dpkg-query", 'echo "install ok installed"')
    return found


def assert_refused(result: subprocess.CompletedProcess[str], machine: Machine, *expected: str) -> None:
    assert result.returncode == 1, result.stderr
    assert "nothing was installed or started" in result.stderr
    for text in expected:
        assert text in result.stderr, result.stderr
    assert not machine.dev.exists()
    assert not machine.cache.exists()


def test_a_complete_machine_passes(machine: Machine) -> None:
    result = machine.run()
    assert result.returncode == 0, result.stderr
    assert "preflight: ok" in result.stderr
    assert "go1.24.3 (the first run builds the control plane" in result.stderr
    assert f"port {machine.port} free" in result.stderr
    assert not machine.dev.exists()


def test_the_real_node_needs_root_and_cgroup_v1(machine: Machine) -> None:
    machine.tool("id", 'echo "1000"')
    (machine.cgroups / "memory" / "cgroup.procs").unlink()
    result = machine.run()
    assert_refused(result, machine, "which needs root", "no cgroup v1 memory and cpu hierarchies")
    assert result.stderr.count("\n  - ") == 2


def test_missing_node_packages_are_fine_where_apt_installs_them(machine: Machine) -> None:
    machine.tool("dpkg-query", "exit 1")
    assert_refused(machine.run(), machine, "the Debian package runc is missing and there is no apt-get")
    machine.tool("apt-get")
    result = machine.run()
    assert result.returncode == 0, result.stderr
    assert "root and cgroup v1 for the real node" in result.stderr


def test_a_missing_tool_is_named_with_how_to_get_it(machine: Machine) -> None:
    machine.remove("openssl")
    assert_refused(machine.run(), machine, "openssl not found", "apt-get install openssl")


def test_every_missing_tool_is_listed_at_once(machine: Machine) -> None:
    machine.remove("openssl", "make")
    result = machine.run()
    assert_refused(result, machine, "openssl not found", "make not found")
    assert result.stderr.count("\n  - ") == 2


def test_python_must_be_there(machine: Machine) -> None:
    machine.python = "python3"
    machine.remove("python3")
    assert_refused(machine.run(), machine, "python3 not found", "PYTHON=/path/to/python3.11 make demo")


def test_python_must_be_3_11_or_newer(machine: Machine) -> None:
    machine.tool("old-python", 'echo "3.9.18"')
    machine.python = str(machine.bin / "old-python")
    assert_refused(machine.run(), machine, "is Python 3.9.18; the operator needs 3.11 or newer")


def test_python_must_be_able_to_make_virtualenvs(machine: Machine) -> None:
    # A Debian python3 without python3-venv: `import ensurepip` fails.
    machine.tool("no-venv-python", 'case "$*" in *ensurepip*) exit 1;; *) echo "3.12.4";; esac')
    machine.python = str(machine.bin / "no-venv-python")
    assert_refused(machine.run(), machine, "cannot create virtualenvs", "apt-get install python3.12-venv")


def test_go_is_needed_to_build_the_control_plane(machine: Machine) -> None:
    machine.remove("go")
    assert_refused(machine.run(), machine, "go not found", "https://go.dev/dl/")


def test_go_must_be_new_enough_to_build(machine: Machine) -> None:
    machine.tool("go", 'echo "go1.22.1"')
    assert_refused(machine.run(), machine, "go1.22.1 is too old", "Go 1.24 or newer")


def test_an_old_go_is_fine_once_the_binaries_are_cached(machine: Machine) -> None:
    machine.tool("go", 'echo "go1.22.1"')
    key = subprocess.run(
        [str(KUBE_BINS), "dir"], env=machine.env(), capture_output=True, text=True, check=True
    ).stdout.strip()
    Path(key).mkdir(parents=True)
    (Path(key) / "VERSIONS").write_text("KUBE_VERSION=v0\n")
    result = machine.run()
    assert result.returncode == 0, result.stderr
    assert f"go1.22.1 (control plane cached in {key})" in result.stderr


def test_go_is_not_needed_once_the_pinned_versions_are_cached(machine: Machine) -> None:
    versions = dict(
        line.split("=", 1)[0:2]
        for line in (KUBE_BINS.parent / "versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    pinned = {key: value.split(":-", 1)[1].rstrip("}") for key, value in versions.items()}
    built = machine.cache / "kube-bins" / "built-by-another-go"
    built.mkdir(parents=True)
    (built / "VERSIONS").write_text(
        "".join(f"{key}={value}\n" for key, value in pinned.items()) + "GO_VERSION=go1.30\n"
    )
    machine.remove("go")
    result = machine.run()
    assert result.returncode == 0, result.stderr
    assert f"cached in {built} (no Go needed)" in result.stderr


@pytest.fixture
def running_cluster(machine: Machine) -> Path:
    """A state.json whose one process is this test process: `hack/dev-cluster.sh status` says running."""
    stat = Path(f"/proc/{os.getpid()}/stat").read_text()
    process = {"pid": os.getpid(), "start_time": stat.rsplit(")", 1)[-1].split()[19], "log": "-"}
    state = {
        "server": "https://127.0.0.1:1",
        "bin_dir": "-",
        "versions": {},
        "processes": {"etcd": dict(process)},
        "extras": {
            "operator": {**process, "command": ["python", f"--metrics-bind-address=127.0.0.1:{machine.port}"]}
        },
    }
    path = machine.dev / "run" / "state.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(state))
    return path


def test_go_is_not_needed_while_the_cluster_runs(machine: Machine, running_cluster: Path) -> None:
    machine.remove("go")
    result = machine.run()
    assert result.returncode == 0, result.stderr
    assert "the local cluster (running)" in result.stderr


def test_the_metrics_port_must_be_free(machine: Machine) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", machine.port))
        holder.listen()
        result = machine.run()
    assert_refused(
        result, machine, f"port {machine.port} on 127.0.0.1 is in use", "make demo DEMO_METRICS_PORT="
    )


def test_the_probe_port_must_be_free(machine: Machine) -> None:
    machine.health_port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", machine.health_port))
        holder.listen()
        result = machine.run()
    assert_refused(
        result,
        machine,
        f"port {machine.health_port} on 127.0.0.1 is in use by another program; the operator's probes",
        "make demo DEMO_HEALTH_PORT=",
    )


def test_a_port_whose_last_connections_wait_out_their_close_is_free(machine: Machine) -> None:
    """Right after `make demo-down`: the stopped operator closed its connections first, so they sit
    in TIME_WAIT on its port for a minute; the operator binds it again (SO_REUSEADDR), and so the
    next `make demo` goes on."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the operator's servers
        listener.bind(("127.0.0.1", machine.port))
        listener.listen()
        with socket.create_connection(("127.0.0.1", machine.port)) as client:
            served, _ = listener.accept()
            served.close()  # the server's side closes first: its end waits in TIME_WAIT
            client.recv(1)
    result = machine.run()
    assert result.returncode == 0, result.stderr
    assert f"port {machine.port} free" in result.stderr


def test_the_demo_operator_from_an_earlier_run_may_hold_the_port(
    machine: Machine, running_cluster: Path
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", machine.port))
        holder.listen()
        result = machine.run()
    assert result.returncode == 0, result.stderr
    assert f"port {machine.port} (the demo's operator, reused)" in result.stderr


def test_a_port_that_is_no_number_is_refused(machine: Machine) -> None:
    machine.port = 0
    result = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**machine.env(), "DEMO_METRICS_PORT": "http"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert_refused(result, machine, "DEMO_METRICS_PORT=http is not a port number")
