"""hack/kube-bins.sh: binaries built from Go modules once, then used from the cache without Go.

The promises: a cached binary is used without running any `go` command (so without the network); an
optional component is built only when asked for by name and reports its pinned version; a failed
build names the component and its log and leaves nothing in the cache. A recording `go` (a toolchain
whose bin/go logs each call, then runs the real one) shows whether Go ran at all.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed import Kubectl
from testbed.cluster.kube_bins import BackgroundBuilds, component_binary, is_cached, signal_group
from testbed.common import REPO, wait_until

SCRIPT = REPO / "hack" / "kube-bins.sh"


def pinned(name: str) -> str:
    """A version pinned in hack/versions.env (its default)."""
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split(":-", 1)[1].rstrip("}")
    raise AssertionError(f"{name} is not pinned in hack/versions.env")


def kube_bins(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env if env is not None else dict(os.environ),
        timeout=900,
        check=False,
    )


@pytest.fixture
def recording_go(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose `go` records its arguments in the returned file, then runs the real go.

    It stands in a toolchain directory with the real one's VERSION file, as an installed Go does."""
    real = shutil.which("go")
    if real is None:
        pytest.skip("needs Go on PATH")
    real_go = Path(real).resolve()
    root = tmp_path / "go"
    (root / "bin").mkdir(parents=True)
    shutil.copy(real_go.parent.parent / "VERSION", root / "VERSION")
    calls = tmp_path / "go-calls"
    go = root / "bin" / "go"
    go.write_text(f'#!/bin/sh\necho "$*" >>"{calls}"\nexec "{real_go}" "$@"\n')
    go.chmod(0o755)
    env = dict(os.environ, PATH=f"{root / 'bin'}{os.pathsep}{os.environ['PATH']}")
    env.pop("GOROOT", None)
    return env, calls


def test_a_cached_component_is_used_without_running_go(
    helm: Path, recording_go: tuple[dict[str, str], Path]
) -> None:
    env, calls = recording_go
    result = kube_bins("ensure", "helm", env=env)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) / "helm" == helm
    assert not calls.exists(), f"a cached ensure ran go: {calls.read_text()}"
    assert "cold build" not in result.stderr


def test_helm_reports_its_pinned_version(helm: Path, tmp_path: Path) -> None:
    version = pinned("HELM_VERSION")
    short = subprocess.run([str(helm), "version", "--short"], capture_output=True, text=True, check=True)
    assert short.stdout.strip() == version
    # Stamped like helm's own release builds: the Kubernetes version its libraries implement is what
    # `helm template` assumes without a cluster.
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "kube.yaml").write_text("# kube {{ .Capabilities.KubeVersion.Version }}\n")
    rendered = subprocess.run(
        [str(helm), "template", "probe", str(chart)],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, HELM_CACHE_HOME=str(tmp_path), HELM_CONFIG_HOME=str(tmp_path)),
    )
    assert "# kube v1.34.0" in rendered.stdout


@dataclass(frozen=True)
class Component:
    """An optional component, how it shows its version, and a manifest its cache directory carries."""

    name: str
    pinned_as: str
    arguments: tuple[str, ...]
    reported: str
    manifest: str


BUILT_COMPONENTS = [
    # No version flag: Kueue logs its version as it starts, then exits without a kubeconfig.
    Component(
        "kueue",
        "KUEUE_VERSION",
        ("--kubeconfig=/nonexistent/kubeconfig",),
        '"gitVersion":"{version}"',
        "config/components/crd/bases/kueue.x-k8s.io_workloads.yaml",
    ),
    Component(
        "scheduler-plugins",
        "SCHEDULER_PLUGINS_VERSION",
        ("--version",),
        "Kubernetes {version}",
        "manifests/coscheduling/crd.yaml",
    ),
]


@pytest.mark.components
@pytest.mark.parametrize("component", BUILT_COMPONENTS, ids=lambda component: component.name)
def test_a_component_reports_its_pinned_version_and_carries_its_manifests(
    component: Component, tmp_path: Path
) -> None:
    binary = component_binary(component.name)
    result = subprocess.run(
        [str(binary), *component.arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    expected = component.reported.format(version=pinned(component.pinned_as))
    assert expected in result.stdout + result.stderr
    assert "kind: CustomResourceDefinition" in (binary.parent / component.manifest).read_text()


@pytest.mark.components
def test_kubeflows_training_operator_is_its_module_built_with_its_crds() -> None:
    """No version flag: Go's build information names its main package, and the build recorded the
    pinned version of the module source it was built from."""
    binary = component_binary("training-operator")
    info = subprocess.run(["go", "version", "-m", str(binary)], capture_output=True, text=True, check=True)
    assert "path\tgithub.com/kubeflow/training-operator/cmd/training-operator.v1" in info.stdout
    versions = (binary.parent / "VERSIONS").read_text().splitlines()
    assert f"VERSION={pinned('TRAINING_OPERATOR_VERSION')}" in versions
    crd = binary.parent / "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
    assert "kind: CustomResourceDefinition" in crd.read_text()


def test_the_cached_control_plane_is_used_without_running_go(
    cluster: Kubectl, recording_go: tuple[dict[str, str], Path]
) -> None:
    env, calls = recording_go
    result = kube_bins("ensure", env=env)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == cluster.binary.resolve().parent
    assert not calls.exists(), f"a cached ensure ran go: {calls.read_text()}"


def test_a_failed_component_build_names_it_and_its_log_and_caches_nothing(
    tmp_path: Path, recording_go: tuple[dict[str, str], Path]
) -> None:
    env, calls = recording_go
    env.update(TJ_CACHE_DIR=str(tmp_path / "cache"), HELM_VERSION="v3.19.999999")
    root = tmp_path / "cache" / "components" / "helm"
    killed = root / ".build-left-by-a-killed-build" / "work" / "src"  # a read-only module copy
    killed.mkdir(parents=True)
    (killed / "go.mod").write_text("module example.com/m\n")
    killed.chmod(0o555)
    result = kube_bins("ensure", "helm", env=env)
    assert result.returncode != 0
    assert "FAILED building helm" in result.stderr
    log = tmp_path / "cache" / "components" / "helm" / "build.log"
    assert str(log) in result.stderr
    assert log.exists()
    assert calls.exists()  # not cached: it asked Go (the recording works)
    leftovers = [path.name for path in root.iterdir() if path.name not in ("build.log", ".lock")]
    assert leftovers == [], f"half-built cache entries left: {leftovers}"


def test_components_are_asked_for_by_name(tmp_path: Path) -> None:
    listed = kube_bins("components")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        f"containerd github.com/containerd/containerd/v2 {pinned('CONTAINERD_VERSION')}",
        f"coredns github.com/coredns/coredns {pinned('COREDNS_VERSION')}",
        f"helm helm.sh/helm/v3 {pinned('HELM_VERSION')}",
        f"kube-network-policies sigs.k8s.io/kube-network-policies {pinned('KUBE_NETWORK_POLICIES_VERSION')}",
        f"kubelet k8s.io/kubernetes {pinned('KUBE_VERSION')}",
        f"kueue sigs.k8s.io/kueue {pinned('KUEUE_VERSION')}",
        "local-path-provisioner github.com/rancher/local-path-provisioner "
        + pinned("LOCAL_PATH_PROVISIONER_VERSION"),
        f"registry github.com/distribution/distribution/v3 {pinned('REGISTRY_VERSION')}",
        f"scheduler-plugins sigs.k8s.io/scheduler-plugins {pinned('SCHEDULER_PLUGINS_VERSION')}",
        f"training-operator github.com/kubeflow/training-operator {pinned('TRAINING_OPERATOR_VERSION')}",
        f"volcano volcano.sh/volcano {pinned('VOLCANO_VERSION')}",
    ]
    unknown = kube_bins("ensure", "no-such-component", env=dict(os.environ, TJ_CACHE_DIR=str(tmp_path)))
    assert unknown.returncode == 2
    assert (
        "unknown component 'no-such-component'; one of: containerd coredns helm kube-network-policies "
        "kubelet kueue local-path-provisioner registry scheduler-plugins training-operator "
        "volcano" in unknown.stderr
    )
    assert not (tmp_path / "components").exists()


def test_without_go_an_uncached_component_says_how_to_get_it(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "cut", "sha256sum"):
        real = shutil.which(tool)
        assert real is not None
        (bin_dir / tool).symlink_to(real)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), "TJ_CACHE_DIR": str(tmp_path / "cache")}
    result = kube_bins("ensure", "helm", env=env)
    assert result.returncode == 1
    assert f"go not found and no cached build of helm {pinned('HELM_VERSION')}" in result.stderr
    assert "install Go" in result.stderr


def group_processes(group: int) -> dict[int, int]:
    """The processes of a process group and their nice values (from /proc/PID/stat)."""
    found: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group:  # pgrp; fields[0] is the state
            found[int(stat.parent.name)] = int(fields[16])  # nice
    return found


@pytest.fixture
def cold_cache_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The log of background builds into an empty cache of their own (helm is not cached there)."""
    if shutil.which("go") is None:
        pytest.skip("needs Go on PATH")
    monkeypatch.setenv("TJ_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "background-builds.log"


def test_background_builds_run_at_the_lowest_priority_and_stop_leaving_nothing_half_built(
    tmp_path: Path, cold_cache_log: Path
) -> None:
    log = cold_cache_log
    builds = BackgroundBuilds(["helm"], log)
    assert builds.components == ["helm"]  # not cached in this cache
    builds.start()
    try:
        assert builds.process is not None
        group = builds.process.pid
        wait_until("the cold build to start", lambda: "cold build of helm" in log.read_text(), timeout=120)
        niceness = group_processes(group)
        assert niceness
        assert set(niceness.values()) == {19}, niceness
    finally:
        builds.stop()
    assert group_processes(group) == {}
    root = tmp_path / "cache" / "components" / "helm"
    assert [path.name for path in root.iterdir() if path.name.startswith(".build-")] == []
    assert not is_cached("helm")
    builds.stop()  # a second stop does nothing


# A process that starts the background builds and is then killed, as an interrupted run's worker is.
STARTS_BUILDS = """
import sys, time
from pathlib import Path
from testbed.cluster.kube_bins import BackgroundBuilds
BackgroundBuilds(["helm"], Path(sys.argv[1])).start()
print("started", flush=True)
time.sleep(600)
"""


def test_builds_whose_starter_was_killed_are_stopped_from_their_record(
    tmp_path: Path, cold_cache_log: Path
) -> None:
    log = cold_cache_log
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTS_BUILDS, str(log)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert starter.stdout is not None
    assert starter.stdout.readline().strip() == "started"
    group = json.loads(log.with_suffix(".pid").read_text())["pid"]
    try:
        wait_until("the cold build to start", lambda: "cold build of helm" in log.read_text(), timeout=120)
        starter.kill()
        starter.wait()
        assert group_processes(group)  # the builds outlive their starter
        assert BackgroundBuilds.stop_left_behind(log)
    finally:
        starter.kill()
        starter.wait()
        signal_group(group, signal.SIGKILL)
    assert group_processes(group) == {}
    root = tmp_path / "cache" / "components" / "helm"
    assert [path.name for path in root.iterdir() if path.name.startswith(".build-")] == []
    assert not log.with_suffix(".pid").exists()
    assert not BackgroundBuilds.stop_left_behind(log)  # nothing recorded any more


def test_an_already_cached_component_is_not_built_in_the_background(helm: Path, tmp_path: Path) -> None:
    builds = BackgroundBuilds(["helm"], tmp_path / "background-builds.log")
    assert builds.components == []
    builds.start()
    assert builds.process is None
