"""The real node's images, built (once per session, from the cache afterwards) and looked into.

The promises: each archive carries its references and a config a container runtime starts from; the
pause binary is static and stops on SIGTERM; busybox's `sh` works in a chroot of its layer; the base
image is lean and trusts the machine's CA certificates; the operator image runs as 65532 with an
entry point that needs no shell; the trainer image imports the test virtualenv's torch in a chroot of
its root filesystem; containerd (the real node's build, a private instance) imports every archive
under the normalized names; a cached `ensure` runs no build tool. These tests need root (debootstrap,
chroot) and are marked `components`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from crd.contract import DEFAULT_IMAGES
from testbed import wait_for
from testbed.cluster import kube_bins
from testbed.common import REPO
from testbed.images import IMAGES, Image, base
from testbed.images.archive import read_archive
from testbed.images.elf import is_static_executable
from testbed.images.recipe import Context
from testbed.images.refs import repository_path
from testbed.images.steps import mounts_under

NodeImages = Callable[[str], Image]
BLOB_INFO_CACHE = Path("/var/lib/containers")
BLOB_INFO_CACHE_BEFORE = BLOB_INFO_CACHE.exists()


def layer_members(image: Image) -> dict[str, tuple[tarfile.TarInfo, bytes | None]]:
    """Every path of the image's layers (the last layer's entry wins), with the content of small
    regular files."""
    found: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
    contents = read_archive(image.archive)
    with tarfile.open(image.archive) as outer:
        for member in contents.layer_members:
            with tarfile.open(fileobj=outer.extractfile(member), mode="r|gz") as layer:
                for info in layer:
                    small = info.isfile() and info.size < 1 << 20
                    data = layer.extractfile(info).read() if small else None  # type: ignore[union-attr]
                    found[info.name.removeprefix("./")] = (info, data)
    return found


def unpack(image: Image, root: Path) -> None:
    """The image's root filesystem (its layers in order; these layers have no whiteouts), with the
    device files a container runtime would provide for a chroot."""
    with tarfile.open(image.archive) as outer:
        for member in read_archive(image.archive).layer_members:
            with tarfile.open(fileobj=outer.extractfile(member), mode="r|gz") as layer:
                # Layers this project just built: their absolute symlinks and setuid bits stay.
                layer.extractall(root, numeric_owner=True, filter="fully_trusted")  # noqa: S202
    (root / "dev").mkdir(exist_ok=True)
    for name, minor in (("null", 3), ("zero", 5), ("random", 8), ("urandom", 9)):
        os.mknod(root / "dev" / name, 0o20666, os.makedev(1, minor))


def test_the_pause_image_is_one_static_binary_that_stops_on_sigterm(
    node_images: NodeImages, tmp_path: Path
) -> None:
    image = node_images("pause")
    contents = read_archive(image.archive)
    assert contents.references == ("trainingjob-dev/pause:1",)
    assert contents.config["config"]["Entrypoint"] == ["/pause"]
    assert contents.config["config"]["User"] == "65535:65535"
    members = layer_members(image)
    assert list(members) == ["pause"]
    binary = tmp_path / "pause"
    binary.write_bytes(members["pause"][1] or b"")
    binary.chmod(0o755)
    assert is_static_executable(binary)
    for stop in (signal.SIGTERM, signal.SIGINT):
        process = subprocess.Popen([str(binary)])
        try:
            wait_for(
                f"pause to catch SIGINT, SIGTERM and SIGCHLD (pid {process.pid})",
                partial(catches, process.pid),
            )
            assert process.poll() is None, "pause exited on its own"
            process.send_signal(stop)
            assert process.wait(timeout=30) == 0
        finally:
            process.kill()
            process.wait()


def catches(pid: int) -> bool:
    """Whether the process has handlers for SIGINT, SIGTERM and SIGCHLD (/proc/<pid>/status SigCgt)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return all(caught & (1 << (number - 1)) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD))


def test_the_busybox_image_runs_a_shell_script(node_images: NodeImages, tmp_path: Path) -> None:
    image = node_images("busybox")
    contents = read_archive(image.archive)
    assert "busybox:latest" in contents.references
    members = layer_members(image)
    for applet in ("bin/sh", "bin/mkdir", "bin/rm", "bin/chmod"):
        assert members[applet][0].issym(), applet
        assert members[applet][0].linkname == "/bin/busybox"
    root = tmp_path / "root"
    unpack(image, root)
    assert is_static_executable(root / "bin" / "busybox")
    (root / "script").mkdir()
    (root / "script" / "setup").write_text("set -eu\nmkdir -m 0777 -p /data/pvc-1\necho made\n")
    result = subprocess.run(
        ["chroot", str(root), "sh", "/script/setup"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "made\n"
    assert (root / "data" / "pvc-1").is_dir()


def test_the_base_image_is_lean_and_trusts_the_machines_certificates(node_images: NodeImages) -> None:
    image = node_images("base")
    contents = read_archive(image.archive)
    assert contents.references == base.references(Context())
    assert "python:3.11-slim" in contents.references
    assert (
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        in contents.config["config"]["Env"]
    )
    members = layer_members(image)
    for program in ("usr/bin/python3.11", "usr/bin/python", "usr/bin/ldd", "usr/sbin/chroot"):
        assert program in members, program
    assert "usr/lib/python3.11/venv/__init__.py" in members
    # What the Dockerfile's build stage builds the package's wheel with, as python:3.11-slim has them.
    for package in ("pip", "setuptools", "wheel"):
        assert f"usr/lib/python3/dist-packages/{package}/__init__.py" in members, package
    leftovers = [
        name
        for name in members
        if name.startswith(("usr/share/doc/", "usr/share/man/", "var/lib/apt/lists/", "var/log/"))
        and not members[name][0].isdir()
        and name != "var/lib/apt/lists/lock"
    ]
    assert leftovers == []
    assert not [
        name for name in members if name.startswith("var/cache/apt/") and name.endswith((".bin", ".deb"))
    ]
    assert members["etc/resolv.conf"][1] == b""
    assert members["etc/hostname"][1] == b""
    bundle = members["etc/ssl/certs/ca-certificates.crt"][1] or b""
    for certificate in sorted(Path("/usr/local/share/ca-certificates").glob("*.crt")):
        assert f"usr/local/share/ca-certificates/{certificate.name}" in members
        body = b"".join(
            line for line in certificate.read_bytes().splitlines() if not line.startswith(b"-----")
        )
        assert body in bundle.replace(b"\n", b""), f"{certificate.name} is not in the image's CA bundle"


def test_the_operator_image_runs_as_65532_without_a_shell(node_images: NodeImages) -> None:
    image = node_images("operator")
    contents = read_archive(image.archive)
    assert contents.references == ("trainingjob-operator:0.1.0", "trainingjob-operator:latest")
    config = contents.config["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["trainingjob-operator"]
    assert set(config["ExposedPorts"]) == {"8443/tcp", "8081/tcp"}
    path = next(entry for entry in config["Env"] if entry.startswith("PATH="))
    assert path.startswith("PATH=/opt/venv/bin")
    members = layer_members(image)
    script = members["opt/venv/bin/trainingjob-operator"]
    assert script[0].mode & 0o111
    shebang = (script[1] or b"").splitlines()[0]
    assert shebang == b"#!/opt/venv/bin/python", "the entry point is started by Python, not a shell"
    python = members["opt/venv/bin/python"][0]
    target = python.linkname if python.issym() else "opt/venv/bin/python"
    resolved = members.get(target.lstrip("/")) or members.get(f"opt/venv/bin/{target}")
    assert resolved is not None, f"the venv's python points at {target}, which the image lacks"
    assert any(name.startswith("opt/venv/lib/python3.11/site-packages/controller/") for name in members)
    assert not any(name.startswith("src/") for name in members), "the build stage's sources stay behind"
    assert mounts_under(image.archive.parent.parent) == []
    if not BLOB_INFO_CACHE_BEFORE:
        assert not BLOB_INFO_CACHE.exists(), "buildah wrote its blob-info cache on the machine"


def test_the_operator_image_is_one_layer_with_nothing_but_what_the_operator_runs(
    node_images: NodeImages, tmp_path: Path
) -> None:
    """The final stage is FROM scratch: no shell, no package manager, no pip, setuptools or wheel, no
    compiler; the dpkg records of the Debian libraries it carries are there for scanners; and the
    entry point runs as 65532 in a chroot of the unpacked layer."""
    image = node_images("operator")
    assert len(read_archive(image.archive).layer_members) == 1
    members = layer_members(image)
    names = {name.rstrip("/") for name in members}
    for absent in ("bin/sh", "usr/bin/sh", "usr/bin/bash", "usr/bin/dash", "usr/bin/apt", "usr/bin/dpkg"):
        assert absent not in names, absent
    for tool in ("gcc", "cc", "ld", "make"):
        assert not [
            name for name in names if name.startswith(("usr/bin/", "bin/")) and name.endswith("/" + tool)
        ]
    for installer in ("pip", "setuptools", "wheel", "ensurepip", "pkg_resources", "_distutils_hack"):
        found = [name for name in names if f"/{installer}/" in f"/{name}/" and "__pycache__" not in name]
        assert found == [], f"{installer} is in the image: {found[:3]}"
    assert not [name for name in names if name.startswith("opt/venv/bin/pip")]
    for package in ("libc6", "libssl3"):
        assert f"var/lib/dpkg/status.d/{package}" in names, f"no dpkg record of {package} for scanners"
    assert "etc/ssl/certs/ca-certificates.crt" in names
    assert "etc/passwd" in names
    assert b"nonroot:x:65532:65532:" in (members["etc/passwd"][1] or b"")
    root = tmp_path / "root"
    unpack(image, root)
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"  # the image's PATH below has no chroot
    result = subprocess.run(
        [chroot, "--userspec=65532:65532", str(root), "/opt/venv/bin/trainingjob-operator", "--help"],
        capture_output=True,
        text=True,
        env={"PATH": "/opt/venv/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--kubeconfig" in result.stdout


@pytest.fixture(scope="module")
def trainer_root(node_images: NodeImages, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The trainer image's root filesystem, unpacked once for the module (about 5 GB)."""
    root = tmp_path_factory.mktemp("trainer") / "root"
    unpack(node_images("trainer-torch"), root)
    yield root
    shutil.rmtree(root)


def test_the_trainer_image_imports_the_virtualenvs_torch(node_images: NodeImages, trainer_root: Path) -> None:
    image = node_images("trainer-torch")
    assert image.references[0].startswith("trainingjob-trainer:torch-")
    assert DEFAULT_IMAGES["pytorch"] in image.references
    assert "pytorch/pytorch:2.1.0-cuda11.8-cudnn8-runtime" in image.references
    expected = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    shown = subprocess.run(
        ["chroot", str(trainer_root), "python", "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == expected
    elastic = subprocess.run(
        ["chroot", str(trainer_root), "python", "-m", "torch.distributed.run", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert elastic.returncode == 0, elastic.stderr
    assert (trainer_root / "usr/local/bin/torchrun").read_text().startswith("#!/usr/bin/python3\n")


@pytest.mark.images(*IMAGES)
def test_a_cached_ensure_runs_no_build_tool(node_images: NodeImages, tmp_path: Path) -> None:
    for name in IMAGES:
        node_images(name)
    tools = tmp_path / "bin"
    tools.mkdir()
    calls = tmp_path / "calls"
    for tool in ("buildah", "debootstrap", "gcc", "chroot", "unshare"):
        (tools / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >>"{calls}"\nexit 1\n')
        (tools / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", "TJ_TRAINER_VENV": sys.prefix}
    result = subprocess.run(
        ["python3", "-m", "testbed.images", "ensure"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert not calls.exists(), f"a cached ensure ran: {calls.read_text()}"
    printed = [line.split() for line in result.stdout.splitlines()]
    assert [Path(words[0]) for words in printed] == [node_images(name).archive for name in IMAGES]
    assert "cold build" not in result.stderr


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """A private containerd, the real node's build (hack/kube-bins.sh ensure containerd), without the
    CRI plugin and with its own root, state, temp directory and socket under tmp_path; yields a
    function running its `ctr -n k8s.io ARGS...` against it. Stopped by its pid afterwards."""
    built = kube_bins.ensure("containerd")
    socket = tmp_path / "containerd.sock"
    disabled = [
        "io.containerd.cri.v1.images",
        "io.containerd.cri.v1.runtime",
        "io.containerd.grpc.v1.cri",
        "io.containerd.internal.v1.opt",
        "io.containerd.internal.v1.tracing",
        "io.containerd.nri.v1.nri",
    ]
    config = tmp_path / "config.toml"
    config.write_text(
        f'version = 3\nroot = "{tmp_path / "root"}"\nstate = "{tmp_path / "state"}"\n'
        f'temp = "{tmp_path / "tmp"}"\nimports = []\n'
        f"disabled_plugins = {disabled!r}\n".replace("'", '"')
        + f'[grpc]\n  address = "{socket}"\n[ttrpc]\n  address = "{socket}.ttrpc"\n'
    )
    with (tmp_path / "containerd.log").open("wb") as log:
        process = subprocess.Popen(
            [str(built / "containerd"), "--config", str(config)], stdout=log, stderr=log
        )

    def ctr(*arguments: str) -> str:
        command = [str(built / "ctr"), "--address", str(socket), "--namespace", "k8s.io", *arguments]
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        assert result.returncode == 0, f"{' '.join(arguments)}: {result.stderr}"
        return result.stdout

    def answers() -> bool:
        assert process.poll() is None, (tmp_path / "containerd.log").read_text()[-2000:]
        version = subprocess.run(
            [str(built / "ctr"), "--address", str(socket), "version"], capture_output=True, check=False
        )
        return version.returncode == 0

    try:
        wait_for("the private containerd to answer", answers, timeout=60)
        yield ctr
    finally:
        process.terminate()
        process.wait(timeout=60)
        assert mounts_under(tmp_path) == []
        # Gigabytes of imported images: not kept with the session's temporary files (its log is).
        shutil.rmtree(tmp_path / "root", ignore_errors=True)


@pytest.mark.builds("containerd")
@pytest.mark.images(*IMAGES)
def test_containerd_imports_every_image_under_its_normalized_names(
    node_images: NodeImages, containerd: Callable[..., str]
) -> None:
    expected: set[str] = set()
    for name in IMAGES:
        image = node_images(name)
        # The trainer's gigabytes are unpacked by the chroot test; here only its names matter.
        unpack_flags = ["--no-unpack"] if name.startswith("trainer-") else []
        containerd("images", "import", *unpack_flags, str(image.archive))
        expected |= {repository_path(reference) for reference in image.references}
    listed = containerd("images", "ls", "-q").split()
    domains = {name.split("/", 1)[0] for name in listed}
    assert len(domains) == 1, listed
    assert {name.split("/", 1)[1] for name in listed} == expected
    assert containerd("images", "check").count("complete") == len(listed)
